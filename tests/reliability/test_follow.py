"""A following reader in production (SPEC §19): publishes, an S3 outage, and no call from the user.

- 20 publishes (full runs, deltas, a rollback) followed by ``follow_interval_s`` while 8 threads
  read every key with ``multi_get_with_run_id``: each answer is exactly the snapshot of the run it
  came with (never a mix), no read fails, and the process's open descriptors stay bounded.
- S3 unreachable (the fault proxy closes every connection) for at least 3 intervals: the follower
  backs off (the gaps between failed checks grow), ``health()`` says ``degraded`` with the error,
  reads keep serving the old snapshot exactly, and it catches up once S3 answers again.
- A run published on a follower with ``follow_interval_s=1`` is served without any call from the
  user within 6 s (the issue's target is 3 s on an idle machine; the latency is printed).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any

import pytest

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage import s3 as s3_module
from tests.polling import wait_for
from tests.reliability.fault_proxy import FaultProxy, Rule
from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

NUM_DBS = 8
READERS = 8


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_follower_through_20_publishes_with_8_readers_never_mixes_runs(file_root, figure):
    keys = sorted(k for shard_keys in keys_by_shard(NUM_DBS, 6).values() for k in shard_keys)
    models: dict[str, list[bytes | None]] = {}
    built: dict[str, Any] = {}

    def full(run_id: str) -> None:
        rows = {k: f"{run_id}/{k}".encode() for k in keys}
        built[run_id] = build_snapshot(file_root, list(rows.items()), num_dbs=NUM_DBS, run_id=run_id, shard_layout="sst")
        models[run_id] = [rows[k] for k in keys]

    def delta(run_id: str, base: str) -> None:
        step = len(models)
        upserts = {k: f"{run_id}/{k}" for k in keys[step % 3::3]}
        deletes = keys[(step + 1) % 5::5][:4]
        built[run_id] = build_delta(file_root, upserts, [k for k in deletes if k not in upserts], run_id=run_id)
        previous = dict(zip(keys, models[base], strict=True))
        previous.update({k: v.encode() for k, v in upserts.items()})
        previous.update({k: None for k in deletes if k not in upserts})
        models[run_id] = [previous[k] for k in keys]

    full("p00")
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]
    runs_seen: set[str] = set()
    fd_peak = [0]
    order: list[str] = ["p00"]  # runs in the order they went live (a rollback appears twice)
    lock = threading.Lock()
    fds_before = _open_fds()

    with ShardedReader(file_root, follow_interval_s=0.02, max_open_files=64) as reader:
        def read_loop() -> None:
            try:
                while not stop.is_set():
                    run_id, values = reader.multi_get_with_run_id(keys)
                    with lock:  # a publish holds the lock until its run's model is set
                        expected = models[run_id]
                        reads[0] += 1
                        runs_seen.add(run_id)
                        fd_peak[0] = max(fd_peak[0], _open_fds())
                    assert values == expected, (run_id, [k for k, v, e in zip(keys, values, expected, strict=True)
                                                          if v != e][:5])
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=read_loop) for _ in range(READERS)]
        for t in threads:
            t.start()
        store = open_store(file_root)
        live = "p00"
        plan = ["full", "delta", "delta", "delta", "full", "delta", "delta", "rollback", "delta", "full",
                "delta", "delta", "full", "full", "delta", "rollback", "delta", "delta", "full", "delta"]
        kinds: dict[str, int] = {}
        for n, kind in enumerate(plan, start=1):
            run_id = f"p{n:02d}"
            if kind == "full":
                with lock:
                    full(run_id)
            elif kind == "delta":
                with lock:
                    delta(run_id, live)
            else:  # back to the run live two publishes ago (a chain run or a full one)
                run_id = order[-3]
                publish_current(store, built[run_id].manifest_key, run_id)
            with lock:
                order.append(run_id)
            kinds[kind] = kinds.get(kind, 0) + 1
            live = run_id
            wait_for(lambda run_id=run_id: reader.run_id == run_id or stop.is_set(), timeout=60,
                     what=f"the follower to serve {run_id}")
            assert not errors, errors
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert reader.multi_get(keys) == models[live] and reader.health().status == "healthy"
        max_files = reader.describe().max_open_files
    fds_after = _open_fds()
    # Shards hold at most max_open_files descriptors, the old snapshot's as many during a swap;
    # the rest (builds, the cache's folders) is small and constant.
    assert fd_peak[0] - fds_before <= 2 * max_files + 32, (fds_before, fd_peak[0])
    assert fds_after <= fds_before + 4, (fds_before, fds_after)
    figure(publishes=len(plan), full=kinds["full"], deltas=kinds["delta"], rollbacks=kinds["rollback"], readers=READERS,
           answers_checked=reads[0], values_checked=reads[0] * len(keys), runs_answered_from=len(runs_seen),
           open_fds_before=fds_before, open_fds_peak=fd_peak[0], open_fds_after=fds_after)


def _value(i: int, generation: int) -> bytes:
    return hashlib.sha256(b"%d/%d" % (generation, i)).digest()


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server) as p:
        yield p


def test_s3_unreachable_for_3_intervals_degrades_keeps_serving_and_catches_up(proxy, s3_root, s3_options, figure,
                                                                              monkeypatch):
    # One botocore attempt a call and a fast provider retry: each failed check ends in well under an interval.
    monkeypatch.setattr(s3_module, "DEFAULT_RETRY", RetryPolicy(attempts=2, base_delay_s=0.02, max_delay_s=0.05))
    n = 400
    build_snapshot(s3_root, [(i, _value(i, 1)) for i in range(n)], num_dbs=4, run_id="s1", storage_options=s3_options)
    errors: list[BaseException] = []
    failed_at: list[float] = []
    polls: list[float] = []
    real_poll = SnapshotRoot.read_pointer_if_changed

    def timed_poll(self: SnapshotRoot, etag: str | None) -> Any:  # the real poll, its start noted
        polls.append(time.monotonic())
        return real_poll(self, etag)

    monkeypatch.setattr(SnapshotRoot, "read_pointer_if_changed", timed_poll)
    refreshed: list[str] = []
    interval = 0.5

    def on_error(exc: BaseException) -> None:
        failed_at.append(time.monotonic())
        errors.append(exc)

    options = {**s3_options, "endpoint_url": proxy.url, "max_attempts": 1}
    with ShardedReader(s3_root, storage_options=options, follow_interval_s=interval, on_error=on_error,
                       on_refresh=lambda report: refreshed.append(report.run_id)) as reader:
        assert reader.multi_get(list(range(n))) == [_value(i, 1) for i in range(n)]  # every shard in the cache
        wait_for(lambda: proxy.requests("GET", r"/_CURRENT$"), what="a poll of _CURRENT")
        outage = proxy.add(Rule("close", None, r"", count=None))
        started = time.monotonic()
        build_snapshot(s3_root, [(i, _value(i, 2)) for i in range(n)], num_dbs=4, run_id="s2",
                       storage_options=s3_options)  # published directly: only the reader is cut off
        wait_for(lambda: len(errors) >= 4 and time.monotonic() - started >= 3 * interval, timeout=60,
                 what="four failed checks over three intervals")
        # Backed off: the wait from a failed check to the next poll doubles (2, 4, 8 intervals, ±10 %
        # jitter). A failed check itself takes a second or two (the connection attempts), so the waits
        # are measured from its end (on_error) to the next poll's start.
        waits = [next(p for p in polls if p > end) - end for end in failed_at[:3]]
        assert all(w >= 0.85 * interval * 2 ** (n + 1) for n, w in enumerate(waits)), waits
        assert waits[1] > 1.5 * waits[0] and waits[2] > 1.5 * waits[1], waits
        health = reader.health()
        assert health.status == "degraded" and health.run_id == "s1"
        assert health.last_error.startswith("StorageError: S3 conditional get of") and "_CURRENT" in health.last_error
        served = reader.multi_get(list(range(n)))
        assert served == [_value(i, 1) for i in range(n)]
        failed_checks = len(errors)
        outage_s = time.monotonic() - started
        proxy.remove(outage)
        restored = time.monotonic()
        wait_for(lambda: reader.run_id == "s2", timeout=60, what="the follower to catch up")
        caught_up_s = time.monotonic() - restored
        assert reader.multi_get(list(range(n))) == [_value(i, 2) for i in range(n)]
        assert reader.health().status == "healthy" and reader.health().last_error is None
        assert refreshed == ["s2"]
    unchanged = sum(1 for _, _, outcome in proxy.requests("GET", r"/_CURRENT$") if outcome == "forwarded")
    figure(interval_s=interval, failed_checks=failed_checks, waits_after_failed_checks_s=[round(w, 2) for w in waits],
           outage_s=round(outage_s, 2),
           outage_requests_refused=outage.hits, values_checked=3 * n, caught_up_after_s=round(caught_up_s, 2),
           current_polls_forwarded=unchanged)


def test_a_published_run_is_served_without_any_call_from_the_user(file_root, figure):
    build_snapshot(file_root, [(i, b"old") for i in range(50)], num_dbs=4, run_id="c1")
    with ShardedReader(file_root, follow_interval_s=1) as reader:
        assert reader.get(7) == b"old"
        published = time.monotonic()
        build_snapshot(file_root, [(i, b"new") for i in range(50)], num_dbs=4, run_id="c2")
        # No refresh(): only reads, as a service would make them.
        wait_for(lambda: reader.get(7) == b"new", timeout=30, interval=0.01, what="the follower to serve c2")
        latency = time.monotonic() - published
        assert reader.run_id == "c2" and reader.health().run_id == "c2"
    figure(follow_interval_s=1, served_after_s=round(latency, 2))
    # The target is 3 s (interval + 2 s); 6 s leaves room for a loaded machine.
    assert latency <= 6.0, latency
