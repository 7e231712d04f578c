"""Run record lifecycle (SPEC §7) on both stores: start, heartbeat lease, finish, outside reaping."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ClockSkewError,
    RunAbandoned,
    RunKilled,
    RunRecordError,
    ShardWriteError,
    StorageError,
)
from airflow_provider_shardyfusion.core.model.run_record import (
    FAILED,
    MAX_CLOCK_SKEW,
    RUNNING,
    SUCCEEDED,
    RunRecord,
    RunRecordLifecycle,
    read_run_record,
)
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import StorageOptions, open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.core.storage.s3 import S3Store
from tests.polling import wait_for

LEASE, BEAT = 2.0, 0.2


class FlakyPuts:
    """Fault injection on a real store: conditional puts raise StorageError while ``failing`` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failing = threading.Event()
        self.injected = 0

    def put_if_match(self, key, data, etag, **kwargs):
        if self.failing.is_set():
            self.injected += 1
            raise StorageError(f"injected failure writing {key}")
        return super().put_if_match(key, data, etag, **kwargs)


class FlakyLocalStore(FlakyPuts, LocalStore):
    pass


class FlakyS3Store(FlakyPuts, S3Store):
    pass


@pytest.fixture
def store(any_root):
    root, options = any_root
    return open_store(root, options)


@pytest.fixture
def flaky_store(any_root):
    root, options = any_root
    if root.startswith("s3://"):
        return FlakyS3Store(root, StorageOptions.from_dict(options))
    return FlakyLocalStore(root)


def lifecycle(store, run_id="run-1", **kwargs):
    kwargs.setdefault("lease_seconds", LEASE)
    kwargs.setdefault("heartbeat_seconds", BEAT)
    return RunRecordLifecycle(store, run_id, **kwargs)


def manifest_ref(store, run_id="run-1"):
    return store.uri(layout.manifest_key(run_id, layout.utc_now()))


def test_start_writes_running_record(store):
    lc = lifecycle(store, num_dbs=8, config_fingerprint="sha256:abc", writer={"spark_app_id": "local-42"})
    assert read_run_record(store, "run-1") is None
    lc.start()
    try:
        rec = read_run_record(store, "run-1")
        assert rec is not None and rec.status == RUNNING
        assert rec.run_id == "run-1" and rec.output_uri == store.root
        assert rec.num_dbs == 8 and rec.config_fingerprint == "sha256:abc" and rec.writer == {"spark_app_id": "local-42"}
        assert rec.finished_at is None and rec.manifest_ref is None and rec.error is None
        assert rec.lease_expires_at - rec.updated_at == timedelta(seconds=LEASE)
        assert lc.ref == store.uri("runs/run_id=run-1/run.json")
        assert store.exists("runs/run_id=run-1/run.json")
        assert lc.still_running()
    finally:
        lc.succeed(manifest_ref(store))


def test_start_refuses_existing_record(store):
    first = lifecycle(store).start()
    try:
        second = lifecycle(store)
        with pytest.raises(RunRecordError, match=r"run record for run_id 'run-1' already exists") as info:
            second.start()  # same run id: never overwrite another writer's record
        assert store.uri("runs/run_id=run-1/run.json") in str(info.value)
        assert "must be unique" in str(info.value) and "someone else" not in str(info.value)
        assert read_run_record(store, "run-1").status == RUNNING and second.lost
    finally:
        first.succeed(manifest_ref(store))
    assert read_run_record(store, "run-1").status == SUCCEEDED


def test_heartbeat_renews_lease(store):
    lc = lifecycle(store).start()
    try:
        first = read_run_record(store, "run-1")
        later = wait_for(lambda: (r := read_run_record(store, "run-1")).updated_at > first.updated_at and r)
        assert later.lease_expires_at > first.lease_expires_at
        assert later.lease_expires_at - later.updated_at == timedelta(seconds=LEASE)
        assert later.started_at == first.started_at and later.status == RUNNING
        # ...and keeps renewing.
        wait_for(lambda: read_run_record(store, "run-1").updated_at > later.updated_at)
        assert not read_run_record(store, "run-1").lease_expired(layout.utc_now())
    finally:
        lc.succeed(manifest_ref(store))


def test_succeed_is_final_and_stops_heartbeat(store):
    lc = lifecycle(store).start()
    ref = manifest_ref(store)
    returned = lc.succeed(ref, stats={"rows": 10, "bytes": 99})
    rec = read_run_record(store, "run-1")
    assert rec == returned
    assert rec.status == SUCCEEDED and rec.manifest_ref == ref and rec.stats == {"rows": 10, "bytes": 99}
    assert rec.finished_at is not None and rec.finished_at >= rec.started_at
    time.sleep(BEAT * 3)
    assert read_run_record(store, "run-1") == rec  # no heartbeat after the end
    lc.succeed(ref)  # finishing twice is a no-op
    assert read_run_record(store, "run-1") == rec
    assert not lc.heartbeat()


def test_update_records_facts(store):
    lc = lifecycle(store, num_dbs=None).start()
    try:
        lc.update(num_dbs=16, stats={"phase": "write"})
        rec = read_run_record(store, "run-1")
        assert rec.num_dbs == 16 and rec.stats == {"phase": "write"} and rec.status == RUNNING
    finally:
        lc.succeed(manifest_ref(store))
    assert read_run_record(store, "run-1").num_dbs == 16


def test_failed_heartbeat_write_is_not_fatal(flaky_store):
    store = flaky_store
    lc = lifecycle(store).start()
    try:
        store.failing.set()
        wait_for(lambda: store.injected >= 1)  # from now on every background beat fails
        frozen = read_run_record(store, "run-1")
        seen = store.injected
        wait_for(lambda: store.injected >= seen + 3)  # several more heartbeats failed, thread still alive
        assert lc.heartbeat() is False  # a direct beat fails too, without raising
        assert not lc.lost
        assert read_run_record(store, "run-1").updated_at == frozen.updated_at
        store.failing.clear()
        wait_for(lambda: read_run_record(store, "run-1").updated_at > frozen.updated_at)  # the thread kept going
        assert lc.heartbeat() is True
        lc.succeed(manifest_ref(store))
    finally:
        store.failing.clear()
        if not lc.record.is_terminal:
            lc.succeed(manifest_ref(store))
    rec = read_run_record(store, "run-1")
    assert rec.status == SUCCEEDED and rec.error is None


def test_failed_final_write_raises(flaky_store):
    store = flaky_store
    lc = lifecycle(store).start()
    store.failing.set()
    with pytest.raises(StorageError, match="injected"):
        lc.succeed(manifest_ref(store))
    store.failing.clear()
    assert read_run_record(store, "run-1").status == RUNNING  # nothing pretended to succeed


def test_context_manager_marks_failed_and_reraises(store):
    opened = []

    def fail_inside() -> None:
        with lifecycle(store) as lc:
            opened.append(lc)
            assert read_run_record(store, "run-1").status == RUNNING
            raise ShardWriteError("db 3 broke after 17 rows")

    with pytest.raises(ShardWriteError, match="db 3 broke"):
        fail_inside()
    lc = opened[0]
    rec = read_run_record(store, "run-1")
    assert rec.status == FAILED
    assert rec.error.type == "ShardWriteError" and rec.error.message == "db 3 broke after 17 rows"
    assert "ShardWriteError" in rec.error.traceback_tail
    assert rec.finished_at is not None and rec.manifest_ref is None
    assert lc.record == rec
    time.sleep(BEAT * 3)
    assert read_run_record(store, "run-1") == rec  # heartbeat stopped


def test_context_manager_plain_exception(store):
    with pytest.raises(KeyError), lifecycle(store, run_id="run-2"):
        raise KeyError("missing column 'id'")
    rec = read_run_record(store, "run-2")
    assert rec.status == FAILED and rec.error.type == "KeyError" and "missing column" in rec.error.message


def test_context_manager_success(store):
    with lifecycle(store) as lc:
        lc.succeed(manifest_ref(store))
    rec = read_run_record(store, "run-1")
    assert rec.status == SUCCEEDED and rec.error is None


def test_mark_failed_from_outside_wins_over_lifecycle(store):
    lc = lifecycle(store).start()
    abandoned = RunAbandoned("lease expired: abandoned")
    reaped = wait_for(lambda: (r := SnapshotRoot(store).mark_failed("run-1", abandoned)).status == FAILED and r)
    assert reaped.error.type == "RunAbandoned" and reaped.error.message == "lease expired: abandoned"
    stored = read_run_record(store, "run-1")
    assert stored == reaped
    assert not lc.still_running()
    with pytest.raises(RunRecordError, match="changed by someone else"):
        lc.succeed(manifest_ref(store))
    assert lc.lost
    with pytest.raises(RunRecordError):
        lc.update(stats={"late": True})
    assert lc.heartbeat() is False
    time.sleep(BEAT * 3)
    assert read_run_record(store, "run-1") == stored  # nothing overwrote the reaped record


def test_heartbeat_notices_reaping(store):
    lc = lifecycle(store).start()
    wait_for(lambda: SnapshotRoot(store).mark_failed("run-1", RunKilled("killed")).status == FAILED)
    wait_for(lambda: lc.lost)  # the next heartbeat finds a foreign version and stops
    rec = read_run_record(store, "run-1")
    assert rec.status == FAILED and rec.error.type == "RunKilled"


def test_context_manager_after_reaping_keeps_outside_error(store):
    def fail_after_reaping() -> None:
        with lifecycle(store):
            wait_for(lambda: SnapshotRoot(store).mark_failed("run-1", RunAbandoned("abandoned")).status == FAILED)
            raise ValueError("late failure")

    with pytest.raises(ValueError, match="late failure"):
        fail_after_reaping()
    rec = read_run_record(store, "run-1")
    assert rec.error.type == "RunAbandoned" and rec.error.message == "abandoned"


def test_mark_failed_missing_and_terminal(store):
    assert SnapshotRoot(store).mark_failed("never-ran", RunAbandoned("x")) is None
    lc = lifecycle(store).start()
    done = lc.succeed(manifest_ref(store))
    assert SnapshotRoot(store).mark_failed("run-1", RunAbandoned("too late")) == done
    assert read_run_record(store, "run-1").status == SUCCEEDED


def test_read_run_record_malformed(store):
    store.put(layout.run_record_key("bad"), b"{not json")
    with pytest.raises(RunRecordError, match="not valid JSON"):
        read_run_record(store, "bad")


def test_record_round_trips_through_store(store):
    lc = lifecycle(store).start()
    lc.succeed(manifest_ref(store), stats={"rows": 1})
    raw = store.get(layout.run_record_key("run-1")).data
    assert RunRecord.from_bytes(raw) == lc.record


def test_a_writer_clock_far_from_the_storages_is_refused_and_recorded(store):
    """A writer hours behind would have its fresh run judged older than the live one; it is stopped."""
    behind = lifecycle(store, "skewed", clock=lambda: layout.utc_now() - timedelta(hours=3))
    with pytest.raises(ClockSkewError) as caught, behind:
        behind.check_clock()
    message = str(caught.value)
    apart = int(re.search(r": (\d+) s apart", message).group(1))
    assert 10795 <= apart <= 10805, message  # three hours, give or take the put and S3's whole seconds
    assert store.uri(layout.run_record_key("skewed")) in message and "NTP" in message
    record = read_run_record(store, "skewed")
    assert record.status == FAILED and record.error.type == "ClockSkewError"

    close = lifecycle(store, "in-sync", clock=lambda: layout.utc_now() - timedelta(seconds=20))
    with close:
        skew = close.check_clock()
        assert timedelta(seconds=18) <= -skew <= timedelta(seconds=25) < MAX_CLOCK_SKEW, skew
    assert read_run_record(store, "in-sync").status == RUNNING  # measured, within bounds, left running
