"""The snapshot history app (SPEC §16) through FastAPI's test client, on both stores.

The app is built over real stores with the same ``HistorySource`` the plugin uses; only Airflow's
authentication is left out of the page tests (the API server provides it) and checked on the
plugin's own app, which refuses a request without a token.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from airflow_provider_shardyfusion.core.storage import open_store
from tests.history_root import build_change_root, build_history_root, client_for, source_for
from tests.snapshot_helpers import write_run_record
from tests.value_schemas import build_schema_root

OPTS: dict[str, dict | None] = {}  # root -> storage options of the fixture's store


@pytest.fixture
def ui(any_root, tmp_path):
    root, opts = any_root
    OPTS[root] = opts
    runs = build_history_root(root, opts)
    return client_for([root], opts, tmp_path), root, runs


def test_roots_and_timeline_pages_and_their_json_twins(ui):
    client, root, runs = ui
    roots = client.get("/", params={"format": "json"}).json()
    (summary,) = roots["roots"]
    assert summary["age_s"] >= 0
    # Only the staged run was validated: the live run (v2) has no validation of its own.
    failure = {"run_id": "20260107T000000Z-failed00", "at": summary["latest_failure"]["at"],
               "error_type": "InputDataError"}
    assert summary == {"root": root, "exists": True, "live_run_id": runs["v2"], "live_since": summary["live_since"],
                       "runs": 8, "rows": 30, "bytes": summary["bytes"], "chain_depth": 0, "age_s": summary["age_s"],
                       "last_validation": None, "latest_failure": failure}
    assert summary["bytes"] > 0
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert runs["v2"] in page.text and "/shardyfusion/root?uri=" in page.text
    assert "chain depth" in page.text and "not validated" in page.text and "passed" not in page.text
    assert "InputDataError" in page.text and f"title=\"{summary['live_since']}\"" in page.text  # exact time as tooltip

    data = client.get("/root", params={"uri": root, "format": "json"}).json()
    assert {r["run_id"]: r["state"] for r in data["runs"]}[runs["v3"]] == "rolled_back"
    html = client.get("/root", params={"uri": root}).text
    for state in ("live", "superseded", "rolled back", "staged", "failed", "running", "deleted", "unreadable"):
        assert f">{state}</span>" in html, state
    # rows, net change and bytes of all 8 runs, in the table's order (newest first), with axes.
    assert html.count("<svg") == 3 and html.count("<rect") == 3 * 8
    assert html.count(">run (newest first)</text>") == 3 and ">rows</text>" in html and ">bytes</text>" in html
    bars = re.findall(r"<title>([^<:]+): ([^<]+)</title></rect>", html)[:8]
    assert [b[0] for b in bars] == [r["run_id"] for r in data["runs"]]  # the table's order
    assert dict(bars)["20260107T000000Z-failed00"] == "wrote nothing"  # failed runs are shown
    assert "InputDataError: duplicate key 4" in html  # the failed run's error
    # The staged run's validation, at a time people read (the exact one in its tooltip), as on the roots page.
    validated_at = data["runs"][[r["run_id"] for r in data["runs"]].index(runs["staged"])]["validation"]["validated_at"]
    assert f'passed <time datetime="{validated_at}" title="{validated_at}">' in html
    by_id = {r["run_id"]: r for r in data["runs"]}
    assert [by_id[runs[n]]["rows_change"] for n in ("v1", "v2", "v3", "staged")] == [10, 10, 10, 10]
    assert {by_id[runs[n]]["write_mode"] for n in ("v1", "v2", "v3", "staged")} == {"full"}
    # Every run that wrote links its diff against the run before it and against the live run.
    assert html.count(">vs previous</a>") == 3 and html.count(">vs live</a>") == 3  # gone is deleted; v1 is first
    assert f"a={runs['v1']}&amp;b={runs['v2']}\">vs previous" in html
    assert f"a={runs['v2']}&amp;b={runs['staged']}\">vs live" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html  # nothing from outside


def test_run_page_with_shards_validation_and_links(ui):
    client, root, runs = ui
    data = client.get("/run", params={"uri": root, "run_id": runs["staged"], "format": "json"}).json()
    assert data["run"]["state"] == "staged" and data["num_dbs"] == 3
    assert sum(s["rows"] for s in data["shards"]) == 50 and all(s["bytes"] > 0 for s in data["shards"])
    assert data["skew"] == round(max(s["rows"] for s in data["shards"]) / (50 / 3), 3)
    assert data["run"]["validation"]["ok"] is True
    assert all(s["files"] > 1 for s in data["shards"])  # a shard database's files (a chain's: every layer's)
    html = client.get("/run", params={"uri": root, "run_id": runs["staged"]}).text
    assert html.count("<rect") == 2 * 3 and "<h2>Validation</h2>" in html and "min_rows" in html
    assert "True" not in html and "&quot;ok&quot;: true" in html  # the report as JSON, not a Python repr
    assert "+inserted" in html and "base of live" in html  # the legend of the change notation
    deleted = client.get("/run", params={"uri": root, "run_id": runs["gone"], "format": "json"}).json()
    assert deleted["run"]["state"] == "deleted" and deleted["shards"] == []
    assert client.get("/run", params={"uri": root, "run_id": "20990101T000000Z-nothere0"}).status_code == 404


def test_run_links_to_its_airflow_task_and_spark_application(file_root, tmp_path):
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.ui.app import HistorySource, create_app
    from tests.snapshot_factory import build_snapshot

    airflow = {"dag_id": "daily snapshot", "task_id": "write", "run_id": "manual__2026-01-01T00:00:00+00:00"}
    built = build_snapshot(file_root, [(1, b"a")], num_dbs=1, writer={"spark_app_id": "app-20260101-0007",
                                                                       "airflow": airflow})
    source = HistorySource(
        roots=lambda: [file_root], open_root=lambda uri: SnapshotRoot(open_store(uri)),
        open_reader=lambda uri, ref: ShardedReader(uri, manifest_ref=ref, cache_dir=str(tmp_path / "cache")),
        spark_ui_template="https://spark-history.internal/history/{app_id}/")
    data = TestClient(create_app(source)).get("/run", params={"uri": file_root, "run_id": built.run_id,
                                                             "format": "json"}).json()
    assert data["links"] == {
        "Spark application (history server)": "https://spark-history.internal/history/app-20260101-0007/",
        "Airflow task": "/dags/daily%20snapshot/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/tasks/write"}


def test_diff_and_key_look_up_across_runs(ui):
    client, root, runs = ui
    diff = client.get("/diff", params={"uri": root, "a": runs["v2"], "b": runs["v3"], "format": "json"}).json()
    assert (diff["rows_a"], diff["rows_b"]) == (30, 40) and len(diff["shards"]) == 3
    html = client.get("/diff", params={"uri": root, "a": runs["v2"], "b": runs["v3"]}).text
    assert "30 → 40 (+10)" in html and "<svg" in html and ">row change</text>" in html
    # v3 rewrote every key of v2 ("v2-k" -> "v3-k") and added keys 30..39: each kind is sampled apart,
    # from every changed shard; full runs stored no counts, so each kind may have more.
    samples = diff["samples"]
    assert [s["db_id"] for s in samples["shards"]] == [0, 1, 2] and samples["stopped"] is None
    updated, inserted = samples["changes"]["updated"], samples["changes"]["inserted"]
    assert len(updated) == 20 and {c["db_id"] for c in updated} == {0, 1, 2}
    assert {c["key"] for c in inserted} == set(range(30, 40)) and samples["changes"]["deleted"] == []
    assert samples["counts"] == {"inserted": None, "updated": None, "deleted": None} and samples["more"]["updated"]
    for c in updated + inserted:
        k = c["key"]
        assert (c["kind"], c["before"], c["after"]) == (("updated", f"v2-{k}", f"v3-{k}") if k < 30
                                                        else ("inserted", None, f"v3-{k}")), c
        assert f'href="/shardyfusion/key?uri={quote(root, safe="")}&amp;key={k}"' in html
    assert samples["fields"] == [{"field": "(value)", "keys": len(updated)}]
    assert "Updated keys" in html and "Inserted keys" in html and ">every updated key, page by page</a>" in html
    # "more": every updated key, shard by shard, in one page of 50.
    more = client.get("/changes", params={"uri": root, "a": runs["v2"], "b": runs["v3"], "kind": "updated",
                                          "format": "json"}).json()
    assert sorted(c["key"] for c in more["keys"]) == list(range(30)) and more["next"] is None
    assert all(c["kind"] == "updated" for c in more["keys"])
    assert "<mark><code>&quot;v3-" in html  # the value that differs, marked, as JSON
    assert client.get("/diff", params={"uri": root, "a": runs["v2"], "b": runs["gone"]}).status_code == 404

    # Key 25 exists in v2 (30 rows), v3 and staged; not in v1 (20 rows). Deleted/failed runs are not read.
    found = client.get("/key", params={"uri": root, "key": "25", "format": "json"}).json()
    values = {r["run_id"]: (r["found"], r["value"]) for r in found["runs"]}
    assert values == {runs["v1"]: (False, None), runs["v2"]: (True, "v2-25"), runs["v3"]: (True, "v3-25"),
                      runs["staged"]: (True, "staged-25")}
    fates = {r["run_id"]: (r["fate"], r["compared_with"]) for r in found["runs"]}
    assert fates == {runs["staged"]: ("updated", runs["v3"]), runs["v3"]: ("updated", runs["v2"]),
                     runs["v2"]: ("inserted", runs["v1"]), runs["v1"]: ("absent", None)}
    html = client.get("/key", params={"uri": root, "key": "25"}).text
    assert "staged-25" in html and "v3-25" in html and "All 4 retained runs" in html
    assert html.count(">updated here</span>") == 2 and ">inserted here</span>" in html
    assert "<code>&quot;v2-25&quot;</code></mark> → <mark><code>&quot;v3-25&quot;" in html  # before → after, JSON
    assert f'href="/shardyfusion/run?uri={quote(root, safe="")}&amp;run_id={runs["v3"]}"' in html  # run ids link
    newest = client.get("/key", params={"uri": root, "key": "25", "limit": 2, "format": "json"}).json()
    assert [r["run_id"] for r in newest["runs"]] == [runs["staged"], runs["v3"]] and newest["retained_runs"] == 4
    assert "The newest 2 of 4 retained runs" in client.get("/key", params={"uri": root, "key": "25", "limit": 2}).text
    assert client.get("/key", params={"uri": root, "key": "25", "limit": 0}).status_code == 422


@pytest.fixture
def changes(tmp_path):
    root = f"file://{tmp_path}/changes"
    return client_for([root], None, tmp_path), root, build_change_root(root)


def test_a_delta_samples_each_kind_and_pages_through_500_inserts_at_the_end(changes):
    """Issue 41: a delta that updates keys all over the key space and inserts 500 keys after its end
    shows inserts in its sample (the walk does not stop at the updates of the first shards), with
    the counts its writer stored; "more" pages through every insert, each once, in pages of 50."""
    client, root, runs = changes
    base, delta = runs["base"], runs["delta"]
    data = client.get("/run", params={"uri": root, "run_id": delta, "format": "json"}).json()
    samples = data["samples"]
    assert samples["counts"] == {"inserted": 500, "updated": 200, "deleted": 20}, samples["counts"]
    shown = samples["changes"]
    assert len(shown["inserted"]) == 20 and all(c["key"] >= 2000 and c["after"] == f"b1-{c['key']}"
                                                 for c in shown["inserted"])
    # 20 deletions over 4 shards: each shard shows up to its share (5) of them, the rest is "more".
    deleted = {s["db_id"]: s["layers"][-1]["deleted"] for s in data["shards"]}
    assert len(shown["updated"]) == 20 and len(shown["deleted"]) == sum(min(5, n) for n in deleted.values())
    assert all(len({c["db_id"] for c in shown[k]}) == 4 for k in shown)  # across every shard
    assert samples["more"] == {"inserted": True, "updated": True, "deleted": len(shown["deleted"]) < 20}
    html = client.get("/run", params={"uri": root, "run_id": delta}).text
    assert "Inserted keys <span class='muted'>(20 of 500)</span>" in html
    assert f"a={base}&amp;b={delta}&amp;kind=inserted\">every inserted key" in html

    keys, start, pages = [], None, 0
    while True:
        page = client.get("/changes", params={"uri": root, "a": base, "b": delta, "kind": "inserted",
                                              "format": "json", **({"from": start} if start else {})}).json()
        assert len(page["keys"]) <= 50 and page["count"] == 500
        keys += [c["key"] for c in page["keys"]]
        pages += 1
        start = page["next"]
        if start is None:
            break
    assert sorted(keys) == list(range(2000, 2500)) and len(keys) == 500 and pages == 10
    html = client.get("/changes", params={"uri": root, "a": base, "b": delta, "kind": "deleted"}).text
    assert html.count("<tr>") == 1 + 20 and "No more deleted keys" in html and "href=\"/shardyfusion/key?" in html
    bad = client.get("/changes", params={"uri": root, "a": base, "b": delta, "kind": "inserted", "from": "1:zz:0"})
    assert bad.status_code == 422 and "SHARD:HEXKEY:LISTED" in bad.text


def test_a_failed_runs_error_is_one_line_in_tables_and_whole_on_its_page(changes):
    """Issue 41: a JVM trace in a failed run's error: its first line (cut) in the timeline, all of it
    on the run page; numbers with thousands separators; no "null" anywhere; the runs table before
    the charts; a full run with nothing before it is no red (error) mark on the net change chart."""
    client, root, runs = changes
    html = client.get("/root", params={"uri": root}).text
    assert "executeTask249" not in html and "FileFormatWriter.scala" not in html
    assert ">SparkJobError: Py4JJavaError: An error occurred while calling o271.save.</span>" in html
    assert ">2,000</td>" in html and ">2,480</td>" in html and "null" not in html
    assert html.index("<table>") < html.index("<svg")
    net = re.search(r'aria-label="net row change per run[^"]*".*?</svg>', html).group(0)
    assert net.count('class="bad"') == 1 and net.count('class="none"') == 1  # the failed run red; the first grey
    assert f"{runs['base']}: first run: nothing before it to compare" in net and f"{runs['failed']}: wrote nothing" in net
    run = client.get("/run", params={"uri": root, "run_id": runs["failed"]}).text
    assert "executeTask249(FileFormatWriter.scala:649)" in run and "<pre class='error'>" in run
    assert "null" not in client.get("/run", params={"uri": root, "run_id": runs["delta"]}).text


def test_only_listed_roots_are_served(ui, tmp_path):
    client, _root, _ = ui
    other = f"file://{tmp_path}/elsewhere"
    for path in ("/root", "/run", "/diff", "/key", "/changes"):
        response = client.get(path, params={"uri": other, "run_id": "x", "a": "x", "b": "y", "key": "1",
                                            "kind": "inserted"})
        assert response.status_code == 404 and "not a known snapshot root" in response.text, path


def test_a_thousand_runs_render(tmp_path):
    root = f"file://{tmp_path}/many"
    store = open_store(root)
    for i in range(1000):
        write_run_record(store, f"20260101T{i // 60:02d}{i % 60:02d}00Z-{i:08d}", "running")
    html = client_for([root], None, tmp_path).get("/root", params={"uri": root}).text
    assert len(re.findall(r">running</span>", html)) == 1000


class CountingStore:
    """The real store, counting each storage call by kind and what it was for."""

    def __init__(self, inner, calls):
        self._inner, self.calls = inner, calls

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in ("get", "list", "head", "exists"):
            return attr

        def call(key, *args, **kwargs):
            kind = "pointer" if key.endswith("_CURRENT") else key.split("/")[0]
            self.calls[f"{name} {kind}"] = self.calls.get(f"{name} {kind}", 0) + 1
            return attr(key, *args, **kwargs)

        return call


def test_each_page_reads_the_root_once_and_never_lists_every_manifest(ui, tmp_path):
    """What keeps a large root fast: per request one listing of run records, each record and
    _CURRENT read once, and only the manifests the page shows (named by their records)."""
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.ui.app import HistorySource, create_app

    _, root, runs = ui
    calls: dict[str, int] = {}
    source = HistorySource(
        roots=lambda: [root], open_root=lambda uri: SnapshotRoot(CountingStore(open_store(uri, OPTS[uri]), calls)),
        open_reader=lambda uri, ref: ShardedReader(uri, storage_options=OPTS[uri], manifest_ref=ref,
                                                   cache_dir=str(tmp_path / "cache")))
    client = TestClient(create_app(source))
    records = 8  # build_history_root: five written runs, failed, running, unreadable
    expected = {
        ("/", ()): {"list runs": 1, "get runs": records, "get pointer": 1, "get manifests": 1},
        # The live manifest names the runs the live snapshot reads ("base of live").
        ("/root", ()): {"list runs": 1, "get runs": records, "get pointer": 1, "get manifests": 1},
        ("/run", ("staged",)): {"list runs": 1, "get runs": records, "get pointer": 1, "get manifests": 2},
        ("/diff", ("v1", "v2")): {"get runs": 2, "get manifests": 2},
    }
    for (path, names), want in expected.items():
        calls.clear()
        params = {"uri": root, "format": "json"}
        if path == "/run":
            params["run_id"] = runs[names[0]]
        if path == "/diff":
            params.update(a=runs[names[0]], b=runs[names[1]])
        assert client.get(path, params=params).status_code == 200, path
        assert calls == want, (path, calls)


def test_the_plugin_app_refuses_a_request_without_airflow_authentication():
    import airflow_provider_shardyfusion as provider
    from airflow_provider_shardyfusion.ui.plugin import ShardyfusionHistoryPlugin

    (declared,) = provider.get_provider_info()["plugins"]
    assert declared["plugin-class"].endswith(".ui.plugin.ShardyfusionHistoryPlugin")
    (mounted,) = ShardyfusionHistoryPlugin.fastapi_apps
    assert mounted["url_prefix"] == "/shardyfusion"
    assert ShardyfusionHistoryPlugin.external_views[0]["href"] == "/shardyfusion/"
    client = TestClient(mounted["app"])
    paths = ("/", "/root?uri=file:///x", "/run?uri=file:///x&run_id=r", "/diff?uri=file:///x&a=r&b=s",
             "/changes?uri=file:///x&a=r&b=s&kind=inserted", "/key?uri=file:///x&key=1")
    for path in paths:
        assert client.get(path).status_code == 401, path
    # Every route of the app is among them: a page added later is checked too, or this fails.
    routes = {r.path for r in mounted["app"].routes if "GET" in getattr(r, "methods", ())}
    assert routes == {p.split("?")[0] for p in paths}, routes


def test_run_page_answers_cleanly_when_its_manifest_is_missing_corrupt_or_outside_the_root(file_root, tmp_path):
    """Issue 27 item 11: the run page of a run whose record names a manifest that is gone, unreadable
    JSON, or outside the root answers 404 / 502 with the reason, as the diff and key pages do."""
    from airflow_provider_shardyfusion.core import layout
    from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED
    from airflow_provider_shardyfusion.ui.render import esc
    from tests.snapshot_factory import build_snapshot

    store = open_store(file_root)
    missing = build_snapshot(file_root, [(1, b"a")], num_dbs=1, run_id="20260101T000000Z-missing0")
    corrupt = build_snapshot(file_root, [(1, b"a")], num_dbs=1, run_id="20260102T000000Z-corrupt0")
    store.delete_many([missing.manifest_key])
    store.put(corrupt.manifest_key, b'{"format_version": 1, "run_id": ')
    outside_manifest = f"file://{tmp_path}/elsewhere/{layout.manifest_key('20260103T000000Z-outside0', layout.utc_now())}"
    write_run_record(store, "20260103T000000Z-outside0", SUCCEEDED, manifest_ref=outside_manifest)
    client = client_for([file_root], None, tmp_path)
    expected = {missing.run_id: (404, "its manifest is missing"), corrupt.run_id: (502, "its manifest is refused"),
                "20260103T000000Z-outside0": (502, "lies outside the output root")}
    for run_id, (status, reason) in expected.items():
        response = client.get("/run", params={"uri": file_root, "run_id": run_id, "format": "json"})
        assert response.status_code == status, (run_id, response.status_code, response.text)
        detail = response.json()["detail"]
        assert reason in detail and run_id in detail, detail
        page = client.get("/run", params={"uri": file_root, "run_id": run_id})  # the HTML twin, in the layout
        assert page.status_code == status and page.headers["content-type"].startswith("text/html")
        assert esc(reason) in page.text and "Snapshot roots</a></nav>" in page.text


def test_key_look_up_downloads_within_a_byte_budget_and_reuses_its_cache(file_root, tmp_path):
    """Issue 27 item 13: a look-up over many runs stops once the shards it downloaded reach the
    request's byte budget and says so; the shards stay cached, so asking again goes on."""
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.ui import render
    from airflow_provider_shardyfusion.ui.app import HistorySource, create_app
    from airflow_provider_shardyfusion.ui.render import esc
    from tests.snapshot_factory import build_snapshot

    runs = [build_snapshot(file_root, [(k, f"r{i}-{k}".encode() * 50) for k in range(200)], num_dbs=1,
                           run_id=f"2026010{i + 1}T000000Z-keyrun{i:02d}") for i in range(6)]
    size = [r.manifest.shards[0].byte_size for r in runs]
    readers: list[ShardedReader] = []

    def open_reader(uri, ref):
        readers.append(ShardedReader(uri, manifest_ref=ref, cache_dir=str(tmp_path / "cache")))
        return readers[-1]

    source = HistorySource(roots=lambda: [file_root], open_root=lambda uri: SnapshotRoot(open_store(uri)),
                           open_reader=open_reader, key_byte_budget=size[5] + size[4] + size[3] // 2)
    client = TestClient(create_app(source))

    def downloaded() -> int:
        return sum(r.cache_stats["bytes_downloaded"] for r in readers)

    first = client.get("/key", params={"uri": file_root, "key": "7", "limit": 6, "format": "json"}).json()
    assert [r["value"][:8] for r in first["runs"]] == ["r5-7r5-7", "r4-7r4-7", "r3-7r3-7"]  # newest first
    assert first["bytes_downloaded"] == downloaded() == sum(size[3:])  # the third passed the budget: no fourth
    assert "stopped after 3 runs" in first["stopped"] and "budget of one request" in first["stopped"]
    assert esc(first["stopped"]) in render.key_page(first)  # the HTML twin says it (asking again would go on)
    before = downloaded()
    again = client.get("/key", params={"uri": file_root, "key": "7", "limit": 6, "format": "json"}).json()
    assert [r["value"][:8] for r in again["runs"]] == [f"r{i}-7r{i}-7" for i in (5, 4, 3, 2, 1, 0)]
    assert again["stopped"] is None and again["bytes_downloaded"] == downloaded() - before == sum(size[:3])


def test_roots_page_marks_a_missing_root_shows_the_live_runs_validation_and_errors_in_the_layout(file_root, tmp_path):
    """Issue 28 items 5-6: a root with nothing under it says so (not an empty root); the validation shown
    is the live run's; an unknown root answers a 404 page in the layout, its JSON twin the detail."""
    from airflow_provider_shardyfusion.core.errors import ManifestValidationError
    from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from tests.snapshot_factory import build_snapshot

    older = build_snapshot(file_root, [(1, b"a")], num_dbs=1, run_id="20260101T000000Z-older000")
    live = build_snapshot(file_root, [(1, b"a"), (2, b"b")], num_dbs=1, run_id="20260102T000000Z-live0000")
    snapshots = SnapshotRoot(open_store(file_root))
    assert validate_snapshot(snapshots, run_id=live.run_id, min_rows=1).ok
    with pytest.raises(ManifestValidationError):  # the last validation of the root, of a run that is not live
        validate_snapshot(snapshots, run_id=older.run_id, min_rows=5)
    nowhere = f"file://{tmp_path}/nowhere"
    client = client_for([file_root, nowhere], None, tmp_path)
    rows = {r["root"]: r for r in client.get("/", params={"format": "json"}).json()["roots"]}
    assert rows[file_root]["last_validation"]["run_id"] == live.run_id and rows[file_root]["last_validation"]["ok"]
    assert rows[nowhere]["exists"] is False and rows[nowhere]["error"].startswith("nothing here")
    page = client.get("/").text
    assert page.count(">missing</span>") == 1 and "passed <time" in page and "FAILED" not in page
    assert "Nothing here: no run records and no _CURRENT" in client.get("/root", params={"uri": nowhere}).text

    unknown = client.get("/root", params={"uri": f"file://{tmp_path}/unlisted"})
    assert unknown.status_code == 404 and unknown.headers["content-type"].startswith("text/html")
    assert "<h1>404 Not found</h1>" in unknown.text and "is not a known snapshot root" in unknown.text
    assert "Content-Security-Policy".lower() in unknown.headers and "<script" not in unknown.text
    twin = client.get("/root", params={"uri": f"file://{tmp_path}/unlisted", "format": "json"})
    assert twin.status_code == 404 and "is not a known snapshot root" in twin.json()["detail"]


def test_run_and_diff_pages_show_the_value_schema_and_its_changes(any_root, tmp_path):
    root, opts = any_root
    runs = {name: built.run_id for name, built in build_schema_root(root, opts).items()}
    client = client_for([root], opts, tmp_path)

    data = client.get("/run", params={"uri": root, "run_id": runs["v2"], "format": "json"}).json()
    assert data["value_schema"] == [{"name": "name", "type": "string", "nullable": False},
                                    {"name": "score", "type": "string", "nullable": True},
                                    {"name": "city", "type": "string", "nullable": True}]
    html = client.get("/run", params={"uri": root, "run_id": runs["v2"]}).text
    assert ("<h2>Value schema</h2><table><thead><tr><th>column</th><th>type</th><th>nullable</th></tr></thead><tbody>"
            "<tr><td>name</td><td><code>string</code></td><td>no</td></tr>") in html
    old = client.get("/run", params={"uri": root, "run_id": runs["old"], "format": "json"}).json()
    assert old["value_schema"] is None
    assert "<h2>Value schema</h2><p class='muted'>schema not recorded" in client.get(
        "/run", params={"uri": root, "run_id": runs["old"]}).text

    diff = client.get("/diff", params={"uri": root, "a": runs["v1"], "b": runs["v2"], "format": "json"}).json()
    schema = diff["value_schema"]
    assert schema["changes"] == [
        {"column": "score", "kind": "changed", "old": "int64", "new": "string", "nullable": True},
        {"column": "city", "kind": "added", "old": None, "new": "string", "nullable": True}]
    assert schema["summary"] == "column 'score' changed from int64 to string; column 'city' added (string)"
    assert [c["name"] for c in schema["a"]] == ["name", "score"] and len(schema["b"]) == 3
    html = client.get("/diff", params={"uri": root, "a": runs["v1"], "b": runs["v2"]}).text
    assert (f"<th>column</th><th>change</th><th>type in {runs['v1']}</th><th>type in {runs['v2']}</th>" in html
            and "<tr><td>score</td><td><span class='upd'>changed</span></td><td><code>int64</code></td>"
                "<td><code>string</code></td></tr>" in html
            and "<tr><td>city</td><td><span class='ins'>added</span></td><td>—</td><td><code>string</code></td></tr>" in html)

    same = client.get("/diff", params={"uri": root, "a": runs["v2"], "b": runs["v2"], "format": "json"}).json()
    assert same["value_schema"]["changes"] == [] and same["value_schema"]["summary"] == "no schema change"
    assert "<h2>Value schema</h2><p>no schema change</p>" in client.get(
        "/diff", params={"uri": root, "a": runs["v2"], "b": runs["v2"]}).text
    unrecorded = client.get("/diff", params={"uri": root, "a": runs["old"], "b": runs["v1"], "format": "json"}).json()
    assert unrecorded["value_schema"]["changes"] is None
    assert unrecorded["value_schema"]["summary"].startswith(f"schema not recorded for run {runs['old']!r}")
    assert "<h2>Value schema</h2><p class='muted'>schema not recorded for run" in client.get(
        "/diff", params={"uri": root, "a": runs["old"], "b": runs["v1"]}).text


def test_runs_of_two_value_encoders_show_only_the_keys_whose_values_changed(tmp_path):
    """SPEC §18: a run written by the Python encoder and one by the engine's hold different bytes
    for equal values; the key samples and the changes pages compare them decoded (one rule,
    ``history.comparison_between``), so only the key whose value changed is an update."""
    import datetime as dt

    import pyarrow as pa

    from airflow_provider_shardyfusion.core.model.encoding import encode_json_value
    from airflow_provider_shardyfusion.core.model.value_schema import VALUE_ENCODING_ENGINE, from_arrow
    from tests.snapshot_factory import build_snapshot
    from tests.typed_values import encode_v3

    root = f"file://{tmp_path}/encoders"
    arrow = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])
    schema = from_arrow(arrow, arrow.names)
    t0 = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    rows = {k: {"at": t0 + dt.timedelta(minutes=k), "n": k} for k in range(40)}
    old = {k: encode_json_value(v) for k, v in rows.items()}
    new = {k: encode_v3({**v, "n": -7} if k == 7 else v, schema) for k, v in rows.items()}
    assert all(old[k] != new[k] for k in rows)  # every key's bytes differ: a byte compare shows 40 updates
    now = dt.datetime.now(dt.UTC)
    a = build_snapshot(root, old.items(), num_dbs=2, value_format="json", value_schema=schema, encode_value=bytes,
                       run_id="20260101T000000Z-pyencode", published_at=now - dt.timedelta(hours=1))
    b = build_snapshot(root, new.items(), num_dbs=2, value_format="json", value_schema=schema, encode_value=bytes,
                       value_encoding_version=VALUE_ENCODING_ENGINE, run_id="20260102T000000Z-engine00", published_at=now)

    page = client_for([root], None, tmp_path).get("/changes", params={
        "uri": root, "a": a.run_id, "b": b.run_id, "kind": "updated", "format": "json"}).json()
    assert [(c["key"], c["fields"]) for c in page["keys"]] == [(7, ["n"])] and page["next"] is None
    assert (page["keys"][0]["before"]["n"], page["keys"][0]["after"]["n"]) == (7, -7)

    samples = source_for([root], None, tmp_path).samples(root, a.manifest_ref, b.manifest_ref, dict.fromkeys(range(2)))
    assert {k: [c["key"] for c in v] for k, v in samples["changes"].items()} == {
        "inserted": [], "updated": [7], "deleted": []}, samples
    assert samples["fields"] == [{"field": "n", "keys": 1}] and samples["stopped"] is None, samples
