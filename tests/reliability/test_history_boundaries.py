"""What the snapshot history UI (SPEC §16) never does, whatever a manifest, an API client or a
store does (issue 27 items 1, 2 and 12).

- Only asset events emitted by this provider's operators make a root known: an event posted through
  Airflow's real REST API, or emitted by another task with a snapshot's fields in its extra, never
  makes the API server read a place with the history connection's credentials.
- A link a manifest gives is rendered only if it is http(s); every page forbids inline script.
- A store that does not answer costs a page at most the deadline (5 s), and the page names it.
"""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.ui.app import HistorySource, create_app
from tests.airflow_env import airflow_env, run_dag  # noqa: F401 - fixtures: real Airflow, SQLite metadata DB
from tests.history_root import build_history_root
from tests.processes import free_port, stop_process
from tests.snapshot_factory import build_snapshot

# -- item 2: links and the content security policy ---------------------------------------------------

HOSTILE_LINKS = ("javascript:alert(1)", " JaVaScRiPt:alert(1)", "\tjavascript:alert(1)", "java\nscript:alert(1)",
                 "vbscript:msgbox(1)", "data:text/html,<script>alert(1)</script>", "//evil.example/x",
                 "/\\evil.example/x", "https:evil.example", "\x01https://evil.example/")
SAFE_LINK = "https://spark.internal:4040/jobs/"
# What a page may link: its own pages, the Airflow task, an http(s) address with a host.
ALLOWED_HREF = re.compile(r"/shardyfusion/[^\s]*|/dags/[^\s/]+/runs/[^\s/]+/tasks/[^\s/]+|https?://[a-z0-9.-]+(:\d+)?/[^\s]*")


def test_pages_link_only_http_addresses_and_forbid_inline_script(file_root, tmp_path, figure):
    runs = build_history_root(file_root, None)
    airflow = {"dag_id": "d", "task_id": "t", "run_id": "manual__1"}
    linked = {url: build_snapshot(file_root, [(1, b"x")], num_dbs=1, run_id=f"2026020{i}T000000Z-link{i:04d}",
                                  writer={"spark_ui_url": url, "airflow": airflow}, publish=False).run_id
              for i, url in enumerate((*HOSTILE_LINKS, SAFE_LINK))}
    source = HistorySource(
        roots=lambda: [file_root], open_root=lambda uri: SnapshotRoot(open_store(uri)),
        open_reader=lambda uri, ref: ShardedReader(uri, manifest_ref=ref, cache_dir=str(tmp_path / "cache")),
        spark_ui_template="https://spark-history.internal/history/{app_id}/")
    client = TestClient(create_app(source))
    pages = [("/", {}), ("/root", {"uri": file_root}), ("/diff", {"uri": file_root, "a": runs["v1"], "b": runs["v2"]}),
             ("/key", {"uri": file_root, "key": "5"}), ("/root", {"uri": "file:///etc"})]
    pages += [("/run", {"uri": file_root, "run_id": r}) for r in (*runs.values(), *linked.values())]
    hrefs = without_policy = 0
    for path, params in pages:
        for fmt in ("html", "json"):
            response = client.get(path, params={**params, "format": fmt})
            policy = response.headers.get("content-security-policy", "")
            without_policy += not policy
            assert "default-src 'none'" in policy and "script-src" not in policy and "unsafe" not in policy, policy
            if fmt == "html" and response.status_code == 200:
                assert "<script" not in response.text.lower()
                for href in re.findall(r"""href=(['"])(.*?)\1""", response.text):
                    hrefs += 1
                    assert ALLOWED_HREF.fullmatch(html.unescape(href[1])), (path, href)
    shown_as_text = linked_hostile = 0
    for url, run_id in linked.items():
        page = client.get("/run", params={"uri": file_root, "run_id": run_id}).text
        data = client.get("/run", params={"uri": file_root, "run_id": run_id, "format": "json"}).json()
        assert data["links"]["Spark application UI"] == url  # the JSON twin carries the value as recorded
        anchors = re.findall(r"<a href='([^']*)'[^>]*>Spark application UI</a>", page)
        if url == SAFE_LINK:
            assert anchors == [html.escape(SAFE_LINK)], anchors
        else:
            linked_hostile += len(anchors)
            shown_as_text += f"<code>{html.escape(url)}</code> (not linked" in page
    assert (linked_hostile, shown_as_text, without_policy) == (0, len(HOSTILE_LINKS), 0)
    figure(hostile_links=len(HOSTILE_LINKS), linked=linked_hostile, shown_as_text=shown_as_text,
           pages_checked=2 * len(pages), links_checked=hrefs, pages_without_policy=without_policy)


# -- item 12: an unreachable store -------------------------------------------------------------------

BOUND_S = 10.0


class SilentServer:
    """A loopback port that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_an_unreachable_store_costs_a_page_at_most_its_deadline(file_root, tmp_path, figure):
    silent = SilentServer()
    try:
        live = build_snapshot(file_root, [(1, b"a")], num_dbs=1).run_id
        endpoints = {"s3://silent-bucket/snap": f"http://127.0.0.1:{silent.port}",
                     "s3://refused-bucket/snap": f"http://127.0.0.1:{free_port()}"}  # nothing listens there

        def open_root(uri: str) -> SnapshotRoot:
            if uri == file_root:
                return SnapshotRoot(open_store(uri))
            return SnapshotRoot(open_store(uri, {"endpoint_url": endpoints[uri], "region_name": "us-east-1",
                                                 "addressing_style": "path"}))

        source = HistorySource(roots=lambda: [file_root, *endpoints], open_root=open_root,
                               open_reader=lambda uri, ref: pytest.fail("no key look-up here"))
        client = TestClient(create_app(source))
        started = time.monotonic()
        rows = {r["root"]: r for r in client.get("/", params={"format": "json"}).json()["roots"]}
        roots_page_s = time.monotonic() - started
        assert roots_page_s <= BOUND_S, roots_page_s
        assert rows[file_root]["live_run_id"] == live and "error" not in rows[file_root]
        for uri in endpoints:
            assert rows[uri]["error"] == "storage unreachable (no answer within 5 s)", rows[uri]
        html_page = client.get("/").text
        assert live in html_page and html_page.count("storage unreachable") == 2

        started = time.monotonic()
        response = client.get("/root", params={"uri": "s3://silent-bucket/snap", "format": "json"})
        root_page_s = time.monotonic() - started
        assert root_page_s <= BOUND_S, root_page_s
        assert response.status_code == 504
        assert response.json()["detail"] == "s3://silent-bucket/snap: storage unreachable (no answer within 5 s)"
        assert client.get("/root", params={"uri": file_root, "format": "json"}).json()["live_run_id"] == live
    finally:
        silent.close()
    figure(roots=3, unreachable_named=2, roots_page_s=round(roots_page_s), root_page_s=round(root_page_s),
           bound_s=int(BOUND_S))


def test_the_plugins_s3_reads_give_up_about_when_the_page_does(monkeypatch, figure):
    """The thread a page leaves behind on a silent store ends soon too: the plugin's S3 client
    waits 2 s to connect and 3 s for an answer, retried only within the page's 5 s (botocore
    alone: 60 s each, five attempts, under the store's own six within 60 s)."""
    from airflow_provider_shardyfusion.core.errors import StorageError
    from airflow_provider_shardyfusion.ui import plugin

    silent = SilentServer()
    try:
        monkeypatch.setenv("AIRFLOW__SHARDYFUSION__HISTORY_AWS_CONN_ID", "history_silent")
        monkeypatch.setenv("AIRFLOW_CONN_HISTORY_SILENT", json.dumps({"conn_type": "aws", "extra": {
            "endpoint_url": f"http://127.0.0.1:{silent.port}", "region_name": "us-east-1"}}))
        snapshots = plugin.open_root("s3://silent-bucket/snap")
        started = time.monotonic()
        with pytest.raises(StorageError, match="ReadTimeoutError"):
            snapshots.current()
        gave_up_s = time.monotonic() - started
        assert gave_up_s <= BOUND_S, gave_up_s
    finally:
        silent.close()
    figure(connections_held=len(silent.held), gave_up_s=round(gave_up_s))


# -- item 1: only our operators' events make a root --------------------------------------------------

DAG_FILE = '''
import os
from datetime import datetime

from airflow.sdk import DAG, Asset, task

from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator

with DAG("history_boundaries", schedule=None, start_date=datetime(2026, 1, 1)):
    PublishSnapshotOperator(task_id="publish", output_uri=os.environ["HB_OURS"], run_id=os.environ["HB_OURS_RUN"],
                            aws_conn_id=None, outlets=[Asset(os.environ["HB_OURS"])])

    @task(outlets=[Asset(os.environ["HB_OTHER"]), Asset("file:///etc")])
    def not_ours(*, outlet_events):
        # Another task claiming a snapshot in its extra: its root must not become known either.
        outlet_events[Asset(os.environ["HB_OTHER"])].extra = json.loads(os.environ["HB_OTHER_CLAIM"])

    not_ours()
'''.replace("import os\n", "import json\nimport os\n", 1)
PASSWORD = "history-boundaries-pw"


SEEN: list[str] = []  # every answer's body, to look for the other team's values


def _request(api: str, method: str, path: str, body: Any = None, token: str = "") -> tuple[int, Any]:
    req = urllib.request.Request(f"{api}{path}", data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers={"Content-Type": "application/json",
                                                         **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    if path.startswith("/shardyfusion/"):
        SEEN.append(payload.decode())
    return status, json.loads(payload or b"null")


@pytest.mark.airflow
def test_only_events_of_our_operators_make_a_root(airflow_env, run_dag, tmp_path, figure):  # noqa: F811
    ours = f"file://{tmp_path}/ours/snap"
    other = f"file://{tmp_path}/other-team/snap"  # a real snapshot: its values must never be shown
    ours_run = build_snapshot(ours, [(1, b"ours")], num_dbs=1, publish=False).run_id
    other_built = build_snapshot(other, [(1, b"other-team-secret-value")], num_dbs=1)
    claim = {"run_id": other_built.run_id, "manifest_ref": other_built.manifest_ref, "published": True,
             "output_uri": other}
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "history_boundaries.py").write_text(DAG_FILE)
    (airflow_env.home / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    env = {**airflow_env.env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "HB_OURS": ours, "HB_OURS_RUN": ours_run,
           "HB_OTHER": other, "HB_OTHER_CLAIM": json.dumps(claim),
           "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_env.home / "passwords.json"),
           "AIRFLOW__API_AUTH__JWT_SECRET": "history-boundaries-jwt-secret-0123456789"}
    result = run_dag("history_boundaries",
                     extra_env={k: v for k, v in env.items() if k.startswith(("HB_", "AIRFLOW__CORE__DAGS"))})
    assert result.tasks == {"publish": "success", "not_ours": "success"}, result.tasks
    assert SnapshotRoot(open_store(ours)).current().run_id == ours_run

    port = free_port()
    api = f"http://127.0.0.1:{port}"
    log = (tmp_path / "api-server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], env=env, cwd=str(Path(__file__).resolve().parents[2]),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while _healthy(api) is False:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "api-server.log").read_text()[-4000:]
            time.sleep(1)
        status, body = _request(api, "POST", "/auth/token", {"username": "admin", "password": PASSWORD})
        assert status in (200, 201), body
        token = body["access_token"]
        _, assets = _request(api, "GET", "/api/v2/assets?limit=100", token=token)
        ids = {a["uri"]: a["id"] for a in assets["assets"]}
        assert {ours, other, "file:///etc"} <= set(ids), ids
        posted = 0
        for uri in (other, "file:///etc"):  # anyone allowed to post an event, with our full snapshot fields
            status, body = _request(api, "POST", "/api/v2/assets/events", {"asset_id": ids[uri], "extra": claim},
                                    token=token)
            assert status == 200 and body["extra"]["manifest_ref"] == claim["manifest_ref"], (status, body)
            posted += 1
        _, events = _request(api, "GET", "/api/v2/assets/events?limit=100", token=token)
        claimed = {e["uri"] for e in events["asset_events"] if (e.get("extra") or {}).get("manifest_ref")}
        assert claimed == {ours, other, "file:///etc"}, events  # every kind of claim is in the database

        status, roots = _request(api, "GET", "/shardyfusion/?format=json", token=token)
        assert status == 200, roots
        assert [r["root"] for r in roots["roots"]] == [ours] and roots["roots"][0]["live_run_id"] == ours_run, roots
        refused = 0
        for uri in (other, "file:///etc"):
            for path in (f"/shardyfusion/root?uri={uri}&format=json", f"/shardyfusion/key?uri={uri}&key=1&format=json"):
                status, body = _request(api, "GET", path, token=token)
                assert status == 404 and "not a known snapshot root" in body["detail"], (path, status, body)
                refused += 1
        status, page = _request(api, "GET", f"/shardyfusion/key?uri={ours}&key=1&format=json", token=token)
        assert status == 200 and [r["value"] for r in page["runs"]] == ["ours"], page
    finally:
        stop_process(proc)
        log.close()
    shown = sum("other-team-secret-value" in body for body in SEEN)
    assert shown == 0 and any('"ours"' in body for body in SEEN)
    figure(events_posted_through_rest=posted, events_of_other_tasks=1, roots_listed=len(roots["roots"]),
           other_roots_refused=refused, other_values_shown=shown)


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/api/v2/monitor/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False
