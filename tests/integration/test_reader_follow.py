"""The reader in production (SPEC §19): follow ``_CURRENT``, ``health()``, OpenTelemetry metrics.

Real snapshots on the local store (``tests.snapshot_factory``); the metrics are read with the
OTel SDK's ``InMemoryMetricReader`` through a ``MeterProvider`` given to the reader, so no test
touches the process's global provider.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from datetime import timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError, UnusableSnapshotError
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.read import metrics as reader_metrics
from airflow_provider_shardyfusion.core.read.follow import follower_thread_name
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from tests.polling import wait_for
from tests.snapshot_factory import build_snapshot, publish_current

NUM_DBS = 4


def _rows(tag: str, n: int = 40) -> list[tuple[int, bytes]]:
    return [(i, f"{tag}-{i}".encode()) for i in range(n)]


def _metrics(metric_reader: InMemoryMetricReader) -> dict[str, list[tuple[dict, object]]]:
    """``{name: [(attributes, value or histogram count)]}`` of one collection."""
    out: dict[str, list[tuple[dict, object]]] = {}
    data = metric_reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "shardyfusion.reader"
            for metric in scope.metrics:
                out[metric.name] = sorted(
                    ((dict(p.attributes), p.value if hasattr(p, "value") else (p.count, p.sum))
                     for p in metric.data.data_points), key=repr)
    return out


@pytest.fixture
def metric_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


def test_follower_serves_a_new_run_without_any_call_and_reports_it(file_root):
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    reports = []
    in_callback = threading.Event()

    def on_refresh(report):
        if report.run_id == "r3":  # the follower is busy here when close() is called: close() must wait
            in_callback.set()
            threading.Event().wait(0.3)
        reports.append(report)

    with ShardedReader(file_root, follow_interval_s=0.05, on_refresh=on_refresh) as reader:
        assert reader.get(3) == b"r1-3"
        build_snapshot(file_root, _rows("r2"), num_dbs=NUM_DBS, run_id="r2")
        wait_for(lambda: reader.get(3) == b"r2-3", what="the follower to serve r2")
        wait_for(lambda: reports, what="on_refresh")
        assert [(r.run_id, r.previous_run_id) for r in reports] == [("r2", "r1")] and reader.last_refresh == reports[0]
        health = reader.health()
        assert health.status == "healthy" and health.run_id == "r2" and health.last_error is None
        followers = [t for t in threading.enumerate() if t.name == follower_thread_name(reader.output_uri)]
        assert len(followers) == 1 and followers[0].is_alive()
        build_snapshot(file_root, _rows("r3"), num_dbs=NUM_DBS, run_id="r3")
        wait_for(in_callback.is_set, what="the follower to report r3")
    # close() joined the follower: it let the round in progress end, and the thread is gone.
    assert not followers[0].is_alive() and [r.run_id for r in reports] == ["r2", "r3"]
    assert reader.health().status == "unhealthy"


def test_follower_with_ingest_refreshes(file_root):
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1", shard_layout="sst")
    with ShardedReader(file_root, follow_interval_s=0.05, ingest_refreshes=True) as reader:
        assert reader.multi_get([1, 2]) == [b"r1-1", b"r1-2"]
        build_snapshot(file_root, _rows("r2"), num_dbs=NUM_DBS, run_id="r2", shard_layout="sst")
        wait_for(lambda: reader.multi_get([1, 2]) == [b"r2-1", b"r2-2"], what="the follower to serve r2")


def test_follow_is_refused_for_a_pinned_reader_and_a_bad_interval(file_root):
    built = build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    with pytest.raises(ConfigError, match="pinned"):
        ShardedReader(file_root, manifest_ref=built.manifest_ref, follow_interval_s=1)
    with pytest.raises(ConfigError, match="follow_interval_s must be a positive number"):
        ShardedReader(file_root, follow_interval_s=0)


def test_user_refresh_and_follower_never_refresh_at_once(file_root, monkeypatch):
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    inside = [0]
    most = [0]
    loads: list[str] = []
    lock = threading.Lock()
    real_get = LocalStore.get

    def slow_manifest_get(self, key):
        # A refresh's one read of the new run's manifest, made slow so that overlapping refreshes
        # would show. The real read, only delayed; the main thread (build_snapshot) is not counted.
        if not key.startswith(layout.MANIFESTS_DIR + "/") or threading.current_thread() is threading.main_thread():
            return real_get(self, key)
        with lock:
            inside[0] += 1
            loads.append(key)
            most[0] = max(most[0], inside[0])
        try:
            threading.Event().wait(0.02)
            return real_get(self, key)
        finally:
            with lock:
                inside[0] -= 1

    with ShardedReader(file_root, follow_interval_s=0.01) as reader:
        monkeypatch.setattr(LocalStore, "get", slow_manifest_get)
        for step in range(2, 6):
            build_snapshot(file_root, _rows(f"r{step}"), num_dbs=NUM_DBS, run_id=f"r{step}")
            callers = [threading.Thread(target=reader.refresh) for _ in range(4)]
            for t in callers:
                t.start()
            for t in callers:
                t.join()
            assert reader.get(1) == f"r{step}-1".encode()
    # Each run's manifest read once, by whoever came first, never two at once.
    assert most[0] == 1 and len(loads) == len(set(loads)) == 4, loads


def test_staleness_is_the_time_since_the_reader_confirmed_it_is_current_not_the_runs_age(file_root):
    old = layout.utc_now() - timedelta(hours=2)
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1", published_at=old)
    # A run published two hours ago that _CURRENT still names is current: a daily pipeline is healthy.
    with ShardedReader(file_root, max_staleness_s=3600) as reader:
        health = reader.health()
        assert health.status == "healthy" and health.published_at == old and health.age_s >= 7200
        assert health.last_success_at == health.last_check_at and health.last_success_at > old
        assert health.last_error is None and health.shards_open == 0 and health.cache_bytes == 0
        reader.get(1)
        health = reader.health()
        assert health.shards_open == 1 and health.cache_bytes > 0
    # Nobody checks _CURRENT (no follower, no refresh()): past max_staleness_s it is degraded ...
    with ShardedReader(file_root, max_staleness_s=0.3) as reader:
        loaded = reader.health().last_success_at
        health = wait_for(lambda: (h := reader.health()).status == "degraded" and h, what="a stale reader")
        assert health.last_error is None and health.last_success_at == loaded
        assert reader.refresh() is False  # ... until a check confirms it again
        health = reader.health()
        assert health.status == "healthy" and health.last_success_at > loaded
    # A follower keeps confirming it: healthy well past max_staleness_s.
    with ShardedReader(file_root, max_staleness_s=0.3, follow_interval_s=0.05) as reader:
        threading.Event().wait(0.9)
        assert reader.health().status == "healthy" and reader.get(2) == b"r1-2"


def _unusable(root: str, damage: str, second) -> str:
    """Make ``_CURRENT`` name a run the reader cannot serve; the run id it names."""
    store = open_store(root)
    if damage == "malformed-pointer":
        store.put(layout.CURRENT_KEY, b"{not json")
        return "malformed"
    if damage == "missing-manifest":
        publish_current(store, layout.manifest_key("r-gone", second.published_at), "r-gone", second.published_at)
        return "r-gone"
    store.put(second.manifest_key, b"{not json")  # invalid manifest, _CURRENT well-formed
    publish_current(store, second.manifest_key, second.run_id, second.published_at)
    return second.run_id


@pytest.mark.parametrize("damage", ["malformed-pointer", "missing-manifest", "invalid-manifest"])
def test_a_refresh_that_declines_an_unusable_run_is_a_failed_check(file_root, metric_reader, damage):
    in_memory, provider = metric_reader
    first = build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    second = build_snapshot(file_root, _rows("r2"), num_dbs=NUM_DBS, run_id="r2", publish=False,
                            published_at=first.published_at + timedelta(seconds=1))
    with ShardedReader(file_root, meter_provider=provider) as reader:
        assert reader.multi_get(range(40)) == [v for _, v in _rows("r1")]
        named = _unusable(file_root, damage, second)
        before = reader.health()
        assert reader.refresh() is False  # the old snapshot is kept (SPEC §9) ...
        health = reader.health()  # ... but the check failed, naming the run and why
        assert health.status == "degraded" and health.run_id == "r1"
        assert health.last_error.startswith("UnusableSnapshotError: "), health.last_error
        assert f"{layout.join(reader.output_uri, layout.CURRENT_KEY)} " in health.last_error
        assert "keeps serving run r1" in health.last_error
        if damage == "malformed-pointer":
            assert "is malformed" in health.last_error
        else:
            assert f"names run {named} " in health.last_error and "which cannot be served" in health.last_error
        assert health.last_check_at > before.last_check_at and health.last_success_at == before.last_success_at
        assert reader.multi_get(range(40)) == [v for _, v in _rows("r1")]
        assert _metrics(in_memory)["shardyfusion.reader.refreshes"] == [({"outcome": "failed"}, 1)]
        store = open_store(file_root)
        store.put(second.manifest_key, Manifest.to_bytes(second.manifest))
        publish_current(store, second.manifest_key, second.run_id, second.published_at)  # repaired
        assert reader.refresh() is True
        assert reader.health().status == "healthy" and reader.health().last_error is None
        assert reader.multi_get(range(40)) == [v for _, v in _rows("r2")]


@pytest.mark.parametrize("damage", ["malformed-pointer", "missing-manifest"])
def test_the_follower_retries_an_unusable_run_backed_off_until_it_can_serve_it(file_root, damage):
    """The pointer stays where it is; the manifest it names appears later (or the pointer is
    rewritten with the same bytes): a follower that remembered the pointer as served would never see it."""
    first = build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    second = build_snapshot(file_root, _rows("r2"), num_dbs=NUM_DBS, run_id="r2", publish=False,
                            published_at=first.published_at + timedelta(seconds=1))
    store = open_store(file_root)
    manifest = store.get(second.manifest_key).data
    failed_at: list[float] = []
    errors: list[BaseException] = []

    def on_error(exc: BaseException) -> None:
        failed_at.append(time.monotonic())
        errors.append(exc)

    interval = 0.1
    with ShardedReader(file_root, follow_interval_s=interval, on_error=on_error) as reader:
        if damage == "malformed-pointer":
            store.put(layout.CURRENT_KEY, b"{not json")
        else:  # a well-formed pointer to r2's manifest, which is not there yet
            store.delete_many([second.manifest_key])
            publish_current(store, second.manifest_key, second.run_id, second.published_at)
        wait_for(lambda: len(errors) >= 4, timeout=60, what="four failed checks")
        health = reader.health()
        assert health.status == "degraded" and health.run_id == "r1"
        assert health.last_error.startswith("UnusableSnapshotError: ") and "keeps serving run r1" in health.last_error
        assert all(type(e) is UnusableSnapshotError for e in errors), errors
        if damage == "missing-manifest":
            assert "names run r2 " in health.last_error
        assert reader.multi_get(range(40)) == [v for _, v in _rows("r1")]
        # Backed off: doubling waits (±10 % jitter) between failed checks, 2, 4, 8 intervals.
        gaps = [b - a for a, b in itertools.pairwise(failed_at)][:3]
        assert gaps[2] > 2 * gaps[0], gaps
        if damage == "malformed-pointer":
            publish_current(store, second.manifest_key, second.run_id, second.published_at)
        else:
            store.put(second.manifest_key, manifest)  # _CURRENT untouched
        wait_for(lambda: reader.run_id == "r2", timeout=60, what="the follower to serve r2")
        assert reader.multi_get(range(40)) == [v for _, v in _rows("r2")]
        health = reader.health()
        assert health.status == "healthy" and health.last_error is None
    print(f"\nfailed checks {len(errors)}; gaps between them {[round(g, 2) for g in gaps]} s (interval {interval})")


def test_the_follower_reports_a_failed_check_in_health_and_on_error(file_root):
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    errors: list[BaseException] = []
    store = open_store(file_root)
    good = store.get(layout.CURRENT_KEY).data
    with ShardedReader(file_root, follow_interval_s=0.02, on_error=errors.append) as reader:
        store.put(layout.CURRENT_KEY, b"{not json")
        health = wait_for(lambda: (h := reader.health()).status == "degraded" and h, what="a degraded health")
        assert "UnusableSnapshotError" in health.last_error and "is malformed" in health.last_error
        assert health.run_id == "r1"
        assert errors and reader.get(2) == b"r1-2"
        store.put(layout.CURRENT_KEY, good)
        wait_for(lambda: reader.health().status == "healthy", what="the follower to recover")


def test_metrics_count_gets_misses_and_refreshes_exactly(file_root, metric_reader):
    in_memory, provider = metric_reader
    build_snapshot(file_root, _rows("r1", 100), num_dbs=NUM_DBS, run_id="r1")
    with ShardedReader(file_root, meter_provider=provider) as reader:
        for i in range(130):  # 100 hits, 30 misses
            reader.get(i)
        assert reader.multi_get([1, 2, 500, 501, 502]) == [b"r1-1", b"r1-2", None, None, None]
        assert reader.refresh() is False
        build_snapshot(file_root, _rows("r2", 10), num_dbs=NUM_DBS, run_id="r2")
        assert reader.refresh() is True
        got = _metrics(in_memory)
        assert got["shardyfusion.reader.gets"] == [({"found": False}, 33), ({"found": True}, 102)]
        timed = (130 + reader_metrics.TIMED_GET_EVERY - 1) // reader_metrics.TIMED_GET_EVERY
        assert [(attrs, value[0]) for attrs, value in got["shardyfusion.reader.get.duration"]] == [({}, timed)]
        assert got["shardyfusion.reader.refreshes"] == [({"outcome": "swapped"}, 1), ({"outcome": "unchanged"}, 1)]
        assert sorted(a["outcome"] for a, _ in got["shardyfusion.reader.refresh.duration"]) == ["swapped", "unchanged"]
        assert got["shardyfusion.reader.bytes_downloaded"] == [({}, reader.cache_stats["bytes_downloaded"])]
        assert got["shardyfusion.reader.bytes_downloaded"][0][1] > 0
        assert got["shardyfusion.reader.shards_open"] == [({}, len(reader.describe().open_shards))]
        (attrs, age), = got["shardyfusion.reader.snapshot.age"]
        assert attrs == {} and 0 <= age == pytest.approx(reader.health().age_s, abs=60)
    after = _metrics(in_memory)
    # Closed: the counters keep what it counted; the gauges no longer observe it.
    assert after["shardyfusion.reader.gets"] == [({"found": False}, 33), ({"found": True}, 102)]
    assert after.get("shardyfusion.reader.snapshot.age", []) == []


def test_the_followers_checks_are_counted_failed_before_refresh_and_its_swaps_as_swapped(file_root, metric_reader):
    in_memory, provider = metric_reader
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    errors: list[BaseException] = []
    current = os.path.join(layout.local_path_of(file_root), layout.CURRENT_KEY)
    with ShardedReader(file_root, follow_interval_s=0.05, on_error=errors.append, meter_provider=provider) as reader:
        build_snapshot(file_root, _rows("r2"), num_dbs=NUM_DBS, run_id="r2")
        wait_for(lambda: reader.run_id == "r2", what="the follower to serve r2")
        assert _metrics(in_memory)["shardyfusion.reader.refreshes"] == [({"outcome": "swapped"}, 1)]
        # _CURRENT unreadable (a symlink to itself, ELOOP): the follower fails before calling refresh().
        os.replace(current, current + ".good")
        os.symlink(layout.CURRENT_KEY, current)
        wait_for(lambda: len(errors) >= 2, what="two failed checks")
        assert all(isinstance(e, StorageError) for e in errors) and reader.get(1) == b"r2-1"
        os.replace(current + ".good", current)
        wait_for(lambda: reader.health().status == "healthy", what="the follower to recover")
    failed = len(errors)
    got = _metrics(in_memory)
    assert got["shardyfusion.reader.refreshes"] == [({"outcome": "failed"}, failed), ({"outcome": "swapped"}, 1)]
    durations = {a["outcome"]: v[0] for a, v in got["shardyfusion.reader.refresh.duration"]}
    assert durations == {"failed": failed, "swapped": 1}


def test_a_failed_refresh_is_counted_as_failed(file_root, metric_reader):
    in_memory, provider = metric_reader
    build_snapshot(file_root, _rows("r1"), num_dbs=NUM_DBS, run_id="r1")
    with ShardedReader(file_root, meter_provider=provider) as reader:
        # _CURRENT replaced by a symlink to itself: reading it fails with ELOOP, a storage error (raised)
        # rather than "absent" (declined: False), also for root, whom a chmod would not stop.
        current = os.path.join(layout.local_path_of(file_root), layout.CURRENT_KEY)
        os.replace(current, current + ".good")
        os.symlink(layout.CURRENT_KEY, current)
        with pytest.raises(StorageError, match="Too many levels of symbolic links"):
            reader.refresh()
        health = reader.health()
        assert health.status == "degraded"
        current_uri = layout.join(reader.output_uri, layout.CURRENT_KEY)
        assert health.last_error.startswith(f"StorageError: local get of {current_uri} failed: "), health.last_error
        assert reader.get(1) == b"r1-1"
        assert _metrics(in_memory)["shardyfusion.reader.refreshes"] == [({"outcome": "failed"}, 1)]
        os.replace(current + ".good", current)
        assert reader.refresh() is False and reader.health().status == "healthy"
