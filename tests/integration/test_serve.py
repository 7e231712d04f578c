"""``shardyfusion serve`` through real HTTP on loopback (SPEC §19, issue 39).

The server runs as its own process (``python -m airflow_provider_shardyfusion serve``) on a free
port; snapshots are built without Spark (``tests.snapshot_factory``). One server per module where
the tests only read; the tests that publish start their own. Every wait has a deadline; no
assertion is on time.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psutil
import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.value_schema import from_arrow
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.serve.app import INLINE_MAX_KEYS, RUN_ID_HEADER, ReaderSlot, SnapshotService, reader_factory
from airflow_provider_shardyfusion.serve.config import ServeConfig
from airflow_provider_shardyfusion.serve.server import check_shard_ids
from tests.polling import wait_for
from tests.processes import free_port, stop_process
from tests.snapshot_factory import build_snapshot, publish_current
from tests.typed_values import AT, ROW, SCHEMA, encode_v3, expected_rows

if TYPE_CHECKING:
    from pathlib import Path

KEYS = 10_000
TYPED_KEYS = 200


class Server:
    """A ``shardyfusion serve`` process and a small HTTP client for it (one connection per call)."""

    def __init__(self, root: str, log: Path, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_shardyfusion", "serve", root, "--port", str(self.port), *args],
            stdout=self._log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
        try:
            wait_for(self._alive, timeout=60, what=f"the server on port {self.port} (log: {log})")
        except BaseException:
            self.stop()
            raise

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return self.call("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def call(self, method: str, path: str, body: Any = None, *, content_type: str | None = "application/json",
             raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Content-Type": content_type} if content_type else {}
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            assert "Traceback" not in text and 'File "' not in text, text
            got = json.loads(text) if response.getheader("content-type", "").startswith("application/json") else text
            return response.status, {k.lower(): v for k, v in response.getheaders()}, got
        finally:
            conn.close()

    def multi_get(self, keys: list[Any]) -> tuple[int, dict[str, str], Any]:
        return self.call("POST", "/v1/multi_get", {"keys": keys})

    def stop(self) -> None:
        stop_process(self.proc, timeout=30)
        self._log_file.close()


def _value(key: int, run: str) -> dict[str, Any]:
    return {"v": key, "run": run, "text": f"k{key}-é"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """10k JSON values in 8 shards, served by one server for the module's read-only tests."""
    tmp = tmp_path_factory.mktemp("serve")
    root = f"file://{tmp}/snap"
    build_snapshot(root, [(k, _value(k, "r1")) for k in range(KEYS)], num_dbs=8, run_id="r1", value_format="json")
    server = Server(root, tmp / "server.log", "--follow-interval-s", "0.5", "--cache-dir", str(tmp / "cache"))
    try:
        yield server, tmp
    finally:
        server.stop()


def test_every_value_exact_for_10k_keys(served):
    server, _ = served
    for start in range(0, KEYS, 2500):
        keys = list(range(start, start + 2500))
        status, headers, body = server.multi_get(keys)
        assert status == 200 and headers[RUN_ID_HEADER.lower()] == "r1" == body["run_id"]
        assert body["values"] == [_value(k, "r1") for k in keys]
    for key in random.Random(1).sample(range(KEYS), 300):
        status, headers, body = server.call("GET", f"/v1/keys/{key}")
        assert (status, body) == (200, {"run_id": "r1", "key": key, "found": True, "value": _value(key, "r1")})
        assert headers[RUN_ID_HEADER.lower()] == "r1"
    status, headers, body = server.call("GET", f"/v1/keys/{KEYS + 5}")
    assert (status, body) == (404, {"run_id": "r1", "key": KEYS + 5, "found": False, "value": None})
    assert server.multi_get(["7", KEYS + 1])[2]["values"] == [_value(7, "r1"), None]


def test_health_ready_and_metrics(served):
    server, _ = served
    assert server.call("GET", "/healthz")[:1] == (200,)
    status, headers, body = server.call("GET", "/readyz")
    assert status == 200 and body["ready"] is True and body["run_id"] == "r1" == headers[RUN_ID_HEADER.lower()]
    server.call("GET", "/v1/keys/3")
    status, headers, text = server.call("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert "# TYPE shardyfusion_serve_requests_total counter" in text
    assert 'route="get",code="200"' in text and "shardyfusion_serve_ready{" in text
    assert 'shardyfusion_reader_status{pid="' in text and 'run_id="r1"} 0' in text
    # Started without --host: bound to loopback only, nothing else listening.
    listening = {tuple(c.laddr) for c in psutil.Process(server.proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {("127.0.0.1", server.port)}


def test_bad_input_is_a_clear_error_and_touches_no_file(served):
    server, tmp = served
    sentinel = tmp / "sentinel"
    sentinel.write_text("untouched")
    before = (sentinel.stat().st_mtime_ns, sorted(p.name for p in tmp.iterdir()))

    status, _, body = server.call("GET", "/v1/keys/not-a-number")
    assert status == 400 and "not-a-number" in body["error"] and body["run_id"] == "r1"
    status, _, body = server.multi_get(["1", "x"])
    assert status == 400 and "'x'" in body["error"]
    rule = "(5000 digits) is out of range (rule: u64be takes 0..18446744073709551615)"
    for status, _, body in (server.call("GET", f"/v1/keys/{'9' * 5000}"), server.multi_get([1, "9" * 5000])):
        assert status == 400 and body["error"].startswith("key '99999") and rule in body["error"]
    status, _, body = server.multi_get(list(range(20_000)))
    assert status == 413 and "10000" in body["error"]
    status, _, body = server.call("POST", "/v1/multi_get", raw=b'{"keys": [1]}', content_type="text/plain")
    assert status == 415 and "application/json" in body["error"]
    status, _, body = server.call("POST", "/v1/multi_get", raw=b'{"keys": [1]}', content_type=None)
    assert status == 415
    status, _, body = server.call("POST", "/v1/multi_get", raw=b'{"keys": [1', content_type="application/json")
    assert status == 400 and "keys" in body["error"]
    status, _, body = server.call("POST", "/v1/multi_get", raw=b'{"keys": [{"a": 1}]}')
    assert status == 400
    status, _, body = server.call("POST", "/v1/multi_get", raw=b"x" * (5 << 20))
    assert status == 413
    for path in ("/v1/keys/../../../etc/passwd", "/v1/keys/..%2F..%2Fsentinel", "/v1/keys/%2e%2e%2fsentinel",
                 f"/v1/keys/{tmp}/sentinel", "/v1/keys/", "/v1/keys", "/../sentinel", "/v1/keys/%00"):
        status, _, body = server.call("GET", path)
        assert status in (400, 404), (path, status, body)
        assert isinstance(body, dict) and "untouched" not in json.dumps(body)
    assert server.call("DELETE", "/v1/keys/1")[0] == 405
    assert (sentinel.stat().st_mtime_ns, sorted(p.name for p in tmp.iterdir())) == before
    assert server.call("GET", "/readyz")[0] == 200  # still serving


def _typed_row(key: int) -> dict[str, Any]:
    """ROW varied by ``key``: times with and without microseconds, decimals of each scale, maps and
    lists of several lengths; every tenth row all nulls."""
    if key % 10 == 9:
        return dict.fromkeys(SCHEMA.names)
    at = AT + dt.timedelta(days=key, seconds=key * 37) - dt.timedelta(microseconds=AT.microsecond if key % 3 else key)
    return {**ROW, "i8": key % 128 - 64, "i64": (key - 100) * 2**55, "d": key / 8, "b": key % 2 == 0,
            "s": f"k{key}-é \"{key}\"", "bin": key.to_bytes(2, "big"), "day": AT.date() + dt.timedelta(days=key),
            "at": at, "local": at.replace(tzinfo=None), "amount": Decimal(key * 1001).scaleb(-2),
            "tiny": Decimal(key).scaleb(-10), "tags": [f"t{i}" for i in range(key % 4)] + [None],
            "scores": [(f"s{i}", i / 2) for i in range(key % 3)], "by_id": [(key, at)],
            "point": {"x": key / 2, "day": AT.date(), "at": at}}


def _rendered(value: Any) -> Any:
    """A typed value in the JSON serve documents: RFC 3339 datetimes (UTC as Z, none for a local
    time), ISO dates, decimals as their exact text, bytes base64, map keys as text."""
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): _rendered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rendered(v) for v in value]
    return value


def test_typed_values_render_as_json(tmp_path):
    """Every key of a table of every value kind, GET and multi_get, is its expected JSON exactly."""
    schema = from_arrow(SCHEMA, SCHEMA.names)
    table = pa.Table.from_pylist([_typed_row(k) for k in range(TYPED_KEYS)], schema=SCHEMA)  # float32 as Arrow holds it
    want = [_rendered(row) for row in expected_rows(table, schema)]
    root = f"file://{tmp_path}/snap"
    build_snapshot(root, [(k, encode_v3(row, schema)) for k, row in enumerate(table.to_pylist())], num_dbs=2,
                   run_id="typed", value_format="json", value_schema=schema, encode_value=bytes)
    server = Server(root, tmp_path / "server.log", "--value-decoding", "typed", "--follow-interval-s", "5")
    try:
        answers = [server.call("GET", f"/v1/keys/{k}") for k in range(TYPED_KEYS)]
        many = server.multi_get(list(range(TYPED_KEYS)))
    finally:
        server.stop()
    for key, (status, _, body) in enumerate(answers):
        assert (status, body) == (200, {"run_id": "typed", "key": key, "found": True, "value": want[key]}), key
    assert (many[0], many[2]) == (200, {"run_id": "typed", "values": want})
    value = answers[1][2]["value"]  # the rendering itself, literally
    assert value["at"] == "2024-01-03T03:04:42Z" and answers[3][2]["value"]["at"] == "2024-01-05T03:05:56.123453Z"
    assert value["local"] == "2024-01-03T03:04:42"  # timestamp_ntz: no offset
    assert value["day"] == "2024-01-03"
    assert value["amount"] == "10.01" and value["tiny"] == "1E-10"  # Decimal as text, exact
    assert base64.b64decode(value["bin"]) == b"\x00\x01" and value["by_id"] == {"1": "2024-01-03T03:04:42Z"}
    assert answers[0][2]["value"]["i64"] == -100 * 2**55 and value["scores"] == {"s0": 0.0}
    assert answers[9][2]["value"] == dict.fromkeys(SCHEMA.names)


def test_shard_subset_answers_421_with_the_owning_shard(tmp_path):
    root = f"file://{tmp_path}/snap"
    build_snapshot(root, [(k, _value(k, "r1")) for k in range(200)], num_dbs=4, run_id="r1", value_format="json")
    # Ids the served run has no shard for: refused at start, in one line, before any worker starts.
    refused = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", "serve", root, "--shard-ids", "2-9,12",
                              "--port", str(free_port())], capture_output=True, text=True, timeout=120, check=False)
    assert (refused.returncode, refused.stdout, refused.stderr.count("\n")) == (1, "", 1), refused.stderr
    assert "shard_ids 2-9,12 name shard(s) 4-9,12 outside [0, 4): run 'r1' has 4 shards" in refused.stderr
    server = Server(root, tmp_path / "server.log", "--shard-ids", "0-1", "--follow-interval-s", "5")
    try:
        answers = {k: server.call("GET", f"/v1/keys/{k}") for k in range(40)}
        served = [k for k, (status, _, _) in answers.items() if status == 200]
        refused = [k for k, (status, _, _) in answers.items() if status == 421]
        assert served and refused and len(served) + len(refused) == 40
        for k in refused:
            body = answers[k][2]
            assert body["shard"] in (2, 3) and body["served"] == "0-1" and body["run_id"] == "r1"
        assert server.multi_get(served)[2]["values"] == [_value(k, "r1") for k in served]
        status, _, body = server.multi_get([served[0], refused[0]])
        assert status == 421 and body["key"] == refused[0]
    finally:
        server.stop()


def test_shard_ids_the_run_lacks_are_the_readyz_reason_when_unknown_at_start(tmp_path):
    """Nothing published at start: the ids cannot be checked then, so the worker starts, keeps trying,
    and /readyz names the ids and the shard count once a run is published."""
    root = f"file://{tmp_path}/snap"
    config = ServeConfig(root, shard_ids=(2, 3, 4, 5), follow_interval_s=0.2, cache_dir=str(tmp_path / "cache"))
    check_shard_ids(config)  # nothing to check against: no error
    service = SnapshotService(ReaderSlot(reader_factory(config), retry_s=0.2), key_type="auto")
    service.slot.open()
    try:
        assert "_CURRENT" in json.loads(service.readyz().body)["reason"]
        build_snapshot(root, [(k, b"v") for k in range(20)], num_dbs=4, run_id="r1")
        reason = wait_for(lambda: (lambda r: r if "outside [0," in r else None)(json.loads(service.readyz().body)["reason"]),
                          timeout=30, what="/readyz to name the shard ids the published run lacks")
        assert "shard_ids 2-5 name shard(s) 4-5 outside [0, 4): run 'r1' has 4 shards" in reason
        assert service.readyz().status_code == 503 and service.slot.reader is None
        with pytest.raises(ConfigError, match=r"--shard-ids: shard_ids 2-5 name shard\(s\) 4-5 outside \[0, 4\)"):
            check_shard_ids(config)  # what a start now would say
    finally:
        service.slot.close()


@pytest.mark.parametrize(("strategy", "extra"), [("hash", {}), ("cel", {"cel_expr": "id % 4", "cel_columns": {"id": "int"}})])
def test_the_event_loop_reads_only_small_batches_from_open_shards(tmp_path, strategy, extra):
    """What the routes call on the event loop, without HTTP: None (go to a thread) for a cold shard or
    a batch over INLINE_MAX_KEYS, else the same answer the thread path gives."""
    root = f"file://{tmp_path}/snap"
    limit = INLINE_MAX_KEYS[strategy]
    keys = list(range(limit + 1))
    build_snapshot(root, [(k, b"v%d" % k) for k in keys], num_dbs=4, run_id="r1", key_column="id", **extra)
    slot = ReaderSlot(lambda: ShardedReader(root, cache_dir=str(tmp_path / "cache")), retry_s=5)
    slot.open()
    try:
        service = SnapshotService(slot, key_type="auto")
        assert slot.reader is not None and slot.reader.manifest.sharding.strategy == strategy
        assert service.multi_get_if_open(keys[:1]) is None and service.get_key_if_open("0") is None  # cold
        whole = service.multi_get(keys)  # the thread path: opens the shards
        want = {"run_id": "r1", "values": [base64.b64encode(b"v%d" % k).decode() for k in keys]}
        assert whole.status_code == 200 and json.loads(whole.body) == want
        assert service.multi_get_if_open(keys) is None  # one key over the limit
        inline = service.multi_get_if_open(keys[:limit])
        assert inline is not None and inline.headers[RUN_ID_HEADER] == "r1"
        assert json.loads(inline.body) == {"run_id": "r1", "values": want["values"][:limit]}
        got = service.get_key_if_open("3")
        assert got is not None and json.loads(got.body)["value"] == base64.b64encode(b"v3").decode()
    finally:
        slot.close()


def test_publish_while_8_clients_read_then_rollback(tmp_path):
    """Each answer is from one run: its body, its header and every value name the same run."""
    root = f"file://{tmp_path}/snap"
    rows = range(2000)
    first = build_snapshot(root, [(k, _value(k, "r1")) for k in rows], num_dbs=4, run_id="r1", value_format="json")
    server = Server(root, tmp_path / "server.log", "--follow-interval-s", "0.2", "--workers", "2",
                    "--cache-dir", str(tmp_path / "cache"))
    stop = threading.Event()
    seen: list[set[str]] = [set() for _ in range(8)]
    errors: list[str] = []

    def client(n: int) -> None:
        rng = random.Random(n)
        while not stop.is_set():
            keys = rng.sample(rows, 100)
            status, headers, body = server.multi_get(keys)
            run = body.get("run_id")
            if status != 200 or headers.get(RUN_ID_HEADER.lower()) != run or \
                    body["values"] != [_value(k, run) for k in keys]:
                errors.append(f"{status} {run} {headers.get(RUN_ID_HEADER.lower())}")
            key = rng.choice(rows)
            status, headers, body = server.call("GET", f"/v1/keys/{key}")
            if status != 200 or body["value"] != _value(key, body["run_id"]) or \
                    headers[RUN_ID_HEADER.lower()] != body["run_id"]:
                errors.append(f"GET {status} {body}")
            seen[n].add(run)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    try:
        for t in threads:
            t.start()
        second = build_snapshot(root, [(k, _value(k, "r2")) for k in rows], num_dbs=4, run_id="r2",
                                value_format="json", publish=False)
        publish_current(open_store(root), second.manifest_key, "r2")
        published = time.monotonic()
        wait_for(lambda: all("r2" in s for s in seen), timeout=30, what="every client to read run r2")
        # Both workers follow on their own: every client read r2 within the interval + 2 s the issue
        # asks (bench_serve measures it on 1000 shards), with room for a loaded test machine.
        follow_s = time.monotonic() - published
        print(f"\nserve follow: every client read the published run {follow_s:.2f}s after _CURRENT moved "
              f"(--follow-interval-s 0.2, --workers 2)")
        assert follow_s <= 0.2 + 2 + 4, follow_s
        # Rollback: _CURRENT back to r1's manifest; the server stays ready throughout.
        publish_current(open_store(root), first.manifest_key, "r1")
        for s in seen:
            s.clear()

        def rolled_back() -> bool:
            assert server.call("GET", "/readyz")[0] == 200  # ready through the rollback
            return all("r1" in s for s in seen)

        wait_for(rolled_back, timeout=30, what="every client to read run r1 again")
        # --workers 2: both worker processes answer reads, and every scrape, whichever worker answers
        # it, shows both, each series labelled with its worker's pid.
        wait_for(lambda: len(_reads_by_pid(server)) == 2, timeout=30, what="both workers to answer multi_get")
        scrapes = []
        for _ in range(4):
            time.sleep(0.4)  # the workers answer reads and rewrite their metrics files in between
            scrapes.append(_reads_by_pid(server))
        children = {child.pid for child in psutil.Process(server.proc.pid).children()}
        for earlier, later in itertools.pairwise(scrapes):
            assert set(earlier) == set(later) and set(later) <= children, (earlier, later, children)
            # The clients are still reading: each worker's counter goes on, never back.
            assert all(later[pid] >= earlier[pid] for pid in later), (earlier, later)
        assert sum(scrapes[-1].values()) > sum(scrapes[0].values()), scrapes
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        server.stop()
    assert not errors, errors[:5]


@pytest.mark.s3
def test_storage_down_ready_but_degraded_then_503_after_max_staleness_reads_served(tmp_path, s3_server, s3_root,
                                                                                   s3_options):
    """A storage outage shorter than --max-staleness-s keeps the server in rotation (200, degraded,
    the error named); past it /readyz answers 503 naming the failing check; reads are exact throughout,
    from the local cache; the server is ready again once storage answers."""
    from tests.reliability.fault_proxy import FaultProxy, Rule

    max_staleness_s = 8.0
    build_snapshot(s3_root, [(k, _value(k, "r1")) for k in range(500)], num_dbs=4, run_id="r1",
                   value_format="json", storage_options=s3_options)
    expected = [_value(k, "r1") for k in range(500)]

    def reads_exact() -> None:
        status, headers, body = server.call("GET", "/v1/keys/42")
        assert (status, body["value"], headers[RUN_ID_HEADER.lower()]) == (200, _value(42, "r1"), "r1")
        assert server.multi_get(list(range(500)))[2]["values"] == expected

    with FaultProxy(s3_server) as proxy:
        server = Server(s3_root, tmp_path / "server.log", "--endpoint-url", proxy.url, "--region", "us-east-1",
                        "--path-style", "--follow-interval-s", "0.3", "--max-staleness-s", str(max_staleness_s))
        try:
            reads_exact()  # every shard in the cache
            status, _, body = server.call("GET", "/readyz")
            assert status == 200 and body["status"] == "healthy" and body["last_error"] is None, body
            # Storage refusing every request. A closed connection reports the same, only after the store's retry
            # budget (5 botocore attempts within each of 6: about a minute), too slow for this test.
            outage = proxy.add(Rule("error", None, r"", count=None, status=403, code="AccessDenied"))
            started = time.monotonic()
            status, _, body = wait_for(
                lambda: (answer := server.call("GET", "/readyz"))[2].get("last_error") and answer, timeout=30,
                what="/readyz to name the failed check")
            degraded_after_s = time.monotonic() - started
            assert degraded_after_s < max_staleness_s, degraded_after_s
            assert status == 200 and body["ready"] is True and body["status"] == "degraded", body
            assert "_CURRENT" in body["last_error"] and "AccessDenied" in body["last_error"], body
            assert "reason" not in body
            assert "shardyfusion_serve_ready{pid=" in (text := server.call("GET", "/metrics")[2])
            assert [line.rsplit(" ", 1)[1] for line in text.splitlines()
                    if line.startswith("shardyfusion_serve_ready{")] == ["1"], text  # as /readyz says
            reads_exact()
            status, _, body = wait_for(lambda: (answer := server.call("GET", "/readyz"))[0] == 503 and answer,
                                       timeout=60, what="/readyz to answer 503 once past max_staleness_s")
            unready_after_s = time.monotonic() - started
            # The last success came at most one interval (plus its jitter) before the outage began.
            assert unready_after_s >= max_staleness_s - 0.5, unready_after_s
            reason = body["reason"]
            assert reason.startswith("the check of _CURRENT has failed for ") and "max_staleness_s (8s)" in reason
            assert "AccessDenied" in reason and "still serving run r1" in reason and body["status"] == "degraded"
            reads_exact()
            proxy.remove(outage)
            restored = time.monotonic()
            status, _, body = wait_for(lambda: (answer := server.call("GET", "/readyz"))[0] == 200 and answer,
                                       timeout=60, what="/readyz to answer 200 once storage is back")
            ready_again_s = time.monotonic() - restored
            assert body["status"] == "healthy" and body["last_error"] is None and body["run_id"] == "r1", body
            reads_exact()
        finally:
            server.stop()
    print(f"\nserve S3 down: degraded (200) after {degraded_after_s:.2f}s, 503 after {unready_after_s:.2f}s "
          f"(max_staleness_s {max_staleness_s:g}), ready {ready_again_s:.2f}s after S3 returned")


_READS = re.compile(r'^shardyfusion_serve_requests_total\{pid="(\d+)",route="multi_get",code="200"\} (\d+)$', re.M)


def _reads_by_pid(server: Server) -> dict[int, int]:
    """The multi_get answers (200) of each worker that has answered one, as one /metrics scrape shows them."""
    text = server.call("GET", "/metrics")[2]
    assert text.count("# TYPE shardyfusion_serve_requests_total ") == 1, text  # each family once
    return {int(pid): int(n) for pid, n in _READS.findall(text) if int(n) > 0}


def _unready(server: Server) -> str | None:
    status, _, body = server.call("GET", "/readyz")
    return body["reason"] if status == 503 else None


def test_serve_defaults_max_staleness_to_300_seconds():
    from airflow_provider_shardyfusion.cli import _build_parser

    args = _build_parser().parse_args(["serve", "file:///snap"])
    assert args.max_staleness_s == 300


@pytest.mark.s3
def test_sigterm_lets_an_in_flight_request_finish(tmp_path, s3_server, s3_root, s3_options):
    """A request waiting on a slow shard download when SIGTERM arrives is still answered, then the server exits."""
    from tests.reliability.fault_proxy import FaultProxy, Rule

    build_snapshot(s3_root, [(k, _value(k, "r1")) for k in range(100)], num_dbs=2, run_id="r1",
                   value_format="json", storage_options=s3_options)
    with FaultProxy(s3_server) as proxy:
        server = Server(s3_root, tmp_path / "server.log", "--endpoint-url", proxy.url, "--region", "us-east-1",
                        "--path-style", "--follow-interval-s", "5")
        slow = proxy.add(Rule("delay", "GET", r"/shards/run_id=r1/db=", count=2, delay_s=1.5))
        answers: list[Any] = []
        reader = threading.Thread(target=lambda: answers.append(server.multi_get(list(range(100)))))
        try:
            reader.start()
            wait_for(lambda: slow.hits, timeout=30, what="the request to wait on a shard download")
            server.proc.send_signal(signal.SIGTERM)
            reader.join(timeout=60)
            assert server.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        finally:
            server.stop()
    (status, headers, body), = answers
    assert status == 200 and body["values"] == [_value(k, "r1") for k in range(100)]
    assert headers[RUN_ID_HEADER.lower()] == "r1"
