"""S3 faults injected by a loopback proxy in front of the moto server; the store and the reader hold.

Promises checked here (each test prints a FIGURE line: requests faulted, retries seen, rows checked):
- 5xx and SlowDown answers are retried to success, whether botocore or our own loop retries;
- a conditional PUT (manifest, run record) whose response was lost after the store applied it
  resolves to success, and a real conflict stays a conflict;
- an outage longer than the retries ends in one StorageError that names the endpoint (never an
  AttributeError), and a shorter one is ridden out;
- the ShardedReader returns exact values while its requests fail transiently, and keeps serving
  its snapshot when refresh() meets an outage.

"Retries seen" is measured, not assumed: the same steps run once through the proxy without rules
(a baseline request count) and once with them; the difference is the requests the retries added.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ObjectNotFoundError, StorageError
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.storage import StorageOptions, open_store
from airflow_provider_shardyfusion.core.storage import s3 as s3_module
from airflow_provider_shardyfusion.core.storage.s3 import S3Store
from tests.reliability.fault_proxy import FaultProxy, Rule
from tests.snapshot_factory import build_snapshot

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.s3

FAST = RetryPolicy(attempts=6, base_delay_s=0.02, max_delay_s=0.1, deadline_s=30.0)


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server) as p:
        yield p


def through(proxy: FaultProxy, s3_root: str, s3_options: dict[str, Any], *, max_attempts: int = 5,
            retry: RetryPolicy | None = FAST, client: Any = None) -> S3Store:
    """An S3Store whose every request crosses the proxy."""
    options = StorageOptions.from_dict({**s3_options, "endpoint_url": proxy.url, "max_attempts": max_attempts})
    return S3Store(s3_root, options, client=client, retry=retry)


def direct(s3_root: str, s3_options: dict[str, Any]) -> S3Store:
    store = open_store(s3_root, s3_options)
    assert isinstance(store, S3Store)
    return store


def store_steps(store: S3Store, prefix: str, tmp_path: Path) -> int:
    """Every store operation once, each result checked; returns how many values were checked."""
    checked = 0
    payload = os.urandom(70_000)
    etag = store.put(f"{prefix}/obj.bin", payload, content_type="application/octet-stream")
    got = store.get(f"{prefix}/obj.bin")
    assert got.data == payload and got.etag == etag
    info = store.head(f"{prefix}/obj.bin")
    assert info is not None and info.size == len(payload) and info.etag == etag
    assert store.head(f"{prefix}/absent") is None
    with pytest.raises(ObjectNotFoundError):
        store.get(f"{prefix}/absent")
    checked += 5
    assert store.put_if_absent(f"{prefix}/record.json", b'{"v":1}') is True
    first = store.get(f"{prefix}/record.json")
    second = store.put_if_match(f"{prefix}/record.json", b'{"v":2}', first.etag)
    assert second is not None and store.get(f"{prefix}/record.json").data == b'{"v":2}'
    assert store.put_if_match(f"{prefix}/record.json", b'{"v":3}', first.etag) is None  # stale: a real conflict
    checked += 4
    src = tmp_path / f"{prefix}-src.bin"
    src.write_bytes(payload[::-1])
    store.upload_file(str(src), f"{prefix}/up.bin")
    out = tmp_path / f"{prefix}-out" / "down.bin"
    store.download_file(f"{prefix}/up.bin", str(out))
    assert out.read_bytes() == payload[::-1]
    checked += 1
    assert [o.key for o in store.list(f"{prefix}/")] == [f"{prefix}/{n}" for n in ("obj.bin", "record.json", "up.bin")]
    assert store.delete_many([f"{prefix}/obj.bin", f"{prefix}/up.bin"]) == []
    assert [o.key for o in store.list(f"{prefix}/")] == [f"{prefix}/record.json"]
    checked += 2
    return checked


@pytest.mark.parametrize("retried_by", ["botocore", "provider"])
def test_5xx_and_slowdown_are_retried_to_success(proxy, s3_root, s3_options, tmp_path, figure, retried_by):
    # botocore: its own standard-mode retries absorb the faults; provider: botocore makes one
    # attempt per call, so every retry is the store's own backoff loop (core/retry.py).
    store = through(proxy, s3_root, s3_options, max_attempts=5 if retried_by == "botocore" else 1)
    baseline_checked = store_steps(store, "clean", tmp_path)
    baseline = len(proxy.log)

    rules = [
        proxy.add(Rule("error", "PUT", r"/faulty/", count=3, status=500, code="InternalError")),
        proxy.add(Rule("error", "GET", r"/faulty/", count=3, status=503, code="SlowDown")),
        proxy.add(Rule("error", "HEAD", r"/faulty/", count=2, status=503, code="SlowDown")),
        proxy.add(Rule("error", "GET", r"list-type=2&prefix=\S*faulty/", count=2, status=500)),
        proxy.add(Rule("error", "POST", r"\?delete", count=1, status=503, code="SlowDown")),
        proxy.add(Rule("error", "GET", r"/faulty/", count=2, status=500, code="InternalError")),
    ]
    checked = store_steps(store, "faulty", tmp_path)
    assert checked == baseline_checked
    faulted = sum(r.hits for r in rules)
    assert [r.hits for r in rules] == [r.count for r in rules]  # every injected fault was met
    retries = len(proxy.log) - 2 * baseline
    assert retries == faulted  # each fault cost exactly one repeated request, nothing else
    figure(requests_faulted=faulted, retries_seen=retries, values_checked=checked)


@pytest.mark.parametrize("retried_by", ["botocore", "provider"])
@pytest.mark.parametrize("fault", ["drop", "error_after"])
def test_lost_response_on_conditional_put_of_manifest_and_run_record_is_success(
    proxy, s3_root, s3_options, figure, fault, retried_by
):
    """The store applied the PUT, the answer never arrived (or came back 500): the repeat that
    fails its precondition finds our own bytes and reports success with the object's etag."""
    store = through(proxy, s3_root, s3_options, max_attempts=5 if retried_by == "botocore" else 1)
    plain = direct(s3_root, s3_options)
    run_id = layout.new_run_id()
    manifest_key = layout.manifest_key(run_id, layout.utc_now())
    record_key = layout.run_record_key(run_id)
    manifest = json.dumps({"format_version": 1, "run_id": run_id, "num_dbs": 4}, sort_keys=True).encode()
    running = json.dumps({"run_id": run_id, "status": "running"}, sort_keys=True).encode()
    succeeded = json.dumps({"run_id": run_id, "status": "succeeded"}, sort_keys=True).encode()

    rules = [proxy.add(Rule(fault, "PUT", re.escape(k), count=1)) for k in (manifest_key, record_key)]
    assert store.put_if_absent(manifest_key, manifest) is True  # not "manifest already exists"
    first = store.put_if_match(record_key, running, None)  # not "run ids must be unique"
    assert first == plain.head(record_key).etag
    rules.append(proxy.add(Rule(fault, "PUT", re.escape(record_key), count=1)))
    second = store.put_if_match(record_key, succeeded, first)  # not "changed by someone else"
    assert second is not None and second != first
    assert plain.get(record_key).data == succeeded and plain.get(record_key).etag == second
    assert plain.get(manifest_key).data == manifest
    # Each fault: the applied PUT, its repeat (answered 412), then the re-read that found our bytes.
    assert [o.split()[0] for _, _, o in proxy.requests("PUT", re.escape(manifest_key))] == [fault, "forwarded"]
    assert [o.split()[0] for _, _, o in proxy.requests("PUT", re.escape(record_key))] == [fault, "forwarded"] * 2
    assert len(proxy.requests("GET", re.escape(manifest_key))) == 1

    # A real conflict is still one: other bytes in place, even when our response is lost too.
    proxy.add(Rule("close", "PUT", re.escape(manifest_key), count=1))  # not applied; repeated
    assert store.put_if_absent(manifest_key, manifest + b" ") is False
    assert store.put_if_match(record_key, running, first) is None
    assert plain.get(record_key).data == succeeded and plain.get(manifest_key).data == manifest

    faulted = sum(r.hits for r in rules) + 1
    assert sum(r.hits for r in rules) == 3
    retries = sum(1 for m, _, _ in proxy.log if m == "PUT") - 5  # 5 PUTs are asked for in all
    figure(requests_faulted=faulted, retries_seen=retries, objects_checked=4)


def test_outage_longer_than_the_retries_is_a_clear_storage_error(proxy, s3_root, s3_options, tmp_path, figure):
    """Every connection closes before reaching the server: one StorageError per call, naming the
    endpoint and the attempts, with the botocore error as cause (never AttributeError)."""
    store = through(proxy, s3_root, s3_options, max_attempts=1,
                    retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02, deadline_s=10.0))
    record_key = layout.run_record_key("20240101T000000Z-0000abcd")
    store.put(record_key, b'{"status":"running"}')
    etag = store.head(record_key).etag
    outage = proxy.add(Rule("close", None, r"", count=None))
    calls: dict[str, Callable[[], object]] = {
        "conditional put": lambda: store.put_if_match(record_key, b'{"status":"succeeded"}', etag),
        "get": lambda: store.get(layout.CURRENT_KEY),
        "head": lambda: store.head(record_key),
        "list": lambda: list(store.list("runs/")),
        "put": lambda: store.put("x.json", b"{}"),
        "download": lambda: store.download_file(record_key, str(tmp_path / "rec.json")),
    }
    for what, call in calls.items():
        with pytest.raises(StorageError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"S3 {what} of {store.root}/"), message
        assert "after 3 attempt(s)" in message and proxy.url in message and "unreachable or failing" in message
        assert type(info.value.__cause__).__module__.startswith("botocore"), repr(info.value.__cause__)
    faulted = outage.hits
    proxy.remove(outage)
    # The endpoint is back: the same store works, and nothing was half-written.
    assert store.get(record_key).data == b'{"status":"running"}'
    assert not store.exists("x.json")

    # An outage shorter than the retries is ridden out.
    short = proxy.add(Rule("close", None, r"", count=2))
    assert store.put_if_match(record_key, b'{"status":"succeeded"}', etag) is not None
    assert direct(store.root, s3_options).get(record_key).data == b'{"status":"succeeded"}'
    assert short.hits == 2
    figure(requests_faulted=faulted + short.hits, retries_seen=faulted - len(calls) + short.hits,
           calls_failed_cleanly=len(calls))


def test_read_timeout_is_retried(proxy, s3_root, s3_options, figure):
    """A reply slower than the client's read timeout: the client hangs up and asks again."""
    import boto3
    from botocore.config import Config

    plain = direct(s3_root, s3_options)
    plain.put("slow.json", b'{"slow":true}')
    client = boto3.session.Session().client(
        "s3", endpoint_url=proxy.url, region_name="us-east-1",
        config=Config(read_timeout=0.5, connect_timeout=2, retries={"mode": "standard", "max_attempts": 1},
                      s3={"addressing_style": "path"}),
    )
    store = through(proxy, s3_root, s3_options, client=client)
    slow = proxy.add(Rule("delay", "GET", r"/slow\.json", count=2, delay_s=1.5))
    assert store.get("slow.json").data == b'{"slow":true}'
    assert slow.hits == 2
    gets = proxy.requests("GET", r"/slow\.json")
    assert len(gets) == 3
    figure(requests_faulted=slow.hits, retries_seen=len(gets) - 1, values_checked=1)


def _value(i: int, generation: int) -> bytes:
    return hashlib.sha256(b"%d/%d" % (generation, i)).digest() * (1 + i % 3)


def test_reader_returns_exact_values_through_transient_faults(proxy, s3_root, s3_options, figure, monkeypatch):
    # The reader opens its own store: give it the fast test policy, and one botocore attempt per
    # call so every retry is the provider's (botocore's own backoff would only make the test slow).
    monkeypatch.setattr(s3_module, "DEFAULT_RETRY", RetryPolicy(attempts=10, base_delay_s=0.02, max_delay_s=0.2))
    n = 3000
    build_snapshot(s3_root, [(i, _value(i, 1)) for i in range(n)], num_dbs=4, storage_options=s3_options)
    rules = [
        proxy.add(Rule("error", "GET", r"/_CURRENT$", count=2, status=503, code="SlowDown")),
        proxy.add(Rule("drop", "GET", r"/manifests/", count=1)),
        proxy.add(Rule("error", "HEAD", r"/shards/", count=2, status=500)),
        proxy.add(Rule("error", "GET", r"/shards/", count=3, status=500)),
        proxy.add(Rule("drop", "GET", r"/shards/", count=2)),
        proxy.add(Rule("close", "GET", r"/shards/", count=2)),
    ]
    options = {**s3_options, "endpoint_url": proxy.url, "max_attempts": 1}
    checked = 0
    with ShardedReader(s3_root, storage_options=options) as reader:
        values = reader.multi_get(list(range(n)))
        assert values == [_value(i, 1) for i in range(n)]
        assert reader.get(n + 1) is None and reader.get(10 * n) is None
        checked += n + 2
        assert [r.hits for r in rules] == [r.count for r in rules]

        # A new snapshot goes live; refresh() follows it through another round of faults.
        build_snapshot(s3_root, [(i, _value(i, 2)) for i in range(0, n, 2)], num_dbs=3,
                       storage_options=s3_options)
        more = [
            proxy.add(Rule("drop", "GET", r"/_CURRENT$", count=1)),
            proxy.add(Rule("error", "GET", r"/manifests/", count=1, status=503, code="SlowDown")),
            proxy.add(Rule("drop", "GET", r"/shards/", count=3)),
        ]
        assert reader.refresh() is True
        assert reader.multi_get(list(range(n))) == [_value(i, 2) if i % 2 == 0 else None for i in range(n)]
        checked += n
        assert [r.hits for r in more] == [r.count for r in more]

        # An outage during refresh(): a StorageError, and the reader keeps serving what it has.
        served_run = reader.run_id
        build_snapshot(s3_root, [(i, _value(i, 3)) for i in range(10)], num_dbs=1,
                       storage_options=s3_options)
        outage = proxy.add(Rule("close", None, r"", count=None))
        with pytest.raises(StorageError, match=re.escape(f"S3 get of {s3_root}/_CURRENT failed after")):
            reader.refresh()
        assert reader.run_id == served_run
        assert reader.multi_get(list(range(0, n, 2))) == [_value(i, 2) for i in range(0, n, 2)]
        checked += n // 2
        proxy.remove(outage)
        assert reader.refresh() is True
        assert reader.multi_get(list(range(12))) == [_value(i, 3) if i < 10 else None for i in range(12)]
        checked += 12
    faulted = sum(r.hits for r in rules + more) + outage.hits
    figure(requests_faulted=faulted, outage_requests_refused=outage.hits, rows_checked=checked)


def test_async_reader_of_the_triggers_turns_connection_errors_into_storage_errors(proxy, s3_root, s3_options, figure):
    """The deferrable sensors' reader: a lost connection is a StorageError the trigger can retry."""
    import asyncio

    from aiobotocore.session import get_session
    from botocore.config import Config

    from airflow_provider_shardyfusion.core.storage.async_s3 import AsyncS3Reader

    direct(s3_root, s3_options).put("_CURRENT", b'{"x":1}')

    faulted: list[int] = []

    async def scenario() -> list[object]:
        ctx = get_session().create_client(
            "s3", endpoint_url=proxy.url, region_name="us-east-1",
            config=Config(retries={"mode": "standard", "max_attempts": 1}, s3={"addressing_style": "path"}),
        )
        reader = AsyncS3Reader(s3_root, await ctx.__aenter__(), ctx)
        try:
            outcomes: list[object] = [await reader.read("_CURRENT"), await reader.read("absent.json")]
            for action in ("close", "drop"):
                # Until removed: aiohttp itself repeats a request once on a reused connection.
                rule = proxy.add(Rule(action, "GET", r"/_CURRENT$", count=None))
                with pytest.raises(StorageError, match=re.escape(f"S3 get of {s3_root}/_CURRENT failed")) as info:
                    await reader.read("_CURRENT")
                proxy.remove(rule)
                assert rule.hits >= 1 and "Error" in type(info.value.__cause__).__name__
                faulted.append(rule.hits)
                outcomes.append(type(info.value.__cause__).__name__)
            outcomes.append(await reader.read("_CURRENT"))  # the next poll succeeds
            return outcomes
        finally:
            await reader.aclose()

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == b'{"x":1}' and outcomes[1] is None and outcomes[-1] == b'{"x":1}'
    figure(requests_faulted=sum(faulted), storage_errors=2, values_checked=3, causes="/".join(map(str, outcomes[2:4])))
