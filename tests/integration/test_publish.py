"""Two-phase publish (SPEC §6 steps 11–13) on both stores: manifest, the run record turned succeeded
(the fence), ``_CURRENT`` with 3 retries (1 s, 2 s, 4 s), never backwards, and best-effort deletion
of losing attempts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import PublishManifestError, RunAbandoned, RunSupersededError, StorageError
from airflow_provider_shardyfusion.core.lifecycle.run_outcome import POINTER_SETTLE, RunOutcome, read_live_state
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardingInfo
from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle, read_run_record
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.write.commit import delete_losing_attempts, publish


def read_current(store):
    state = SnapshotRoot(store).read_pointer()
    return state.pointer, state.etag


def write_current(store, manifest, sleep):
    """Write ``manifest`` as a new manifest object and move ``_CURRENT`` to it."""
    ref = SnapshotRoot(store).write_manifest(manifest)
    return SnapshotRoot(store).move_pointer(ref, sleep=sleep), ref


@pytest.fixture
def store(any_root):
    root, options = any_root
    return open_store(root, options)


def manifest_for(store, run_id: str, started_minutes_ago: float) -> Manifest:
    started = layout.utc_now() - timedelta(minutes=started_minutes_ago)
    return Manifest(
        run_id=run_id, created_at=layout.utc_now(), output_uri=store.root, num_dbs=2,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        value_columns=("v",), storage_engine={"name": "rocksdb"}, shards=(),
        stats={"rows": 0}, run_started_at=started,
    ).validate()


def running(store, run_id: str) -> RunRecordLifecycle:
    return RunRecordLifecycle(store, run_id, lease_seconds=60, heartbeat_seconds=30).start()


class FailingCurrentPuts:
    """Wraps a real store: the first ``failures`` conditional puts of ``_CURRENT`` raise."""

    def __init__(self, store, failures: int):
        self._store, self.failures = store, failures

    def put_if_match(self, key, data, etag, **kwargs):
        if key == layout.CURRENT_KEY and self.failures > 0:
            self.failures -= 1
            raise StorageError("injected: S3 said 503 Slow Down")
        return self._store.put_if_match(key, data, etag, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_publish_writes_manifest_then_current(store):
    lc = running(store, "run-a")
    manifest = manifest_for(store, "run-a", 1)
    record = publish(store, manifest, lc, sleep=lambda s: None)
    ref = record.manifest_ref
    pointer, _ = read_current(store)
    assert pointer.run_id == "run-a" and pointer.manifest_ref == ref and pointer.previous_run_id is None
    assert Manifest.from_bytes(store.get(store.key_of(ref)).data) == manifest
    stored = read_run_record(store, "run-a")
    assert stored.status == "succeeded" and stored.manifest_ref == ref and stored.published_at is not None


def test_staged_publish_writes_manifest_and_record_but_leaves_current(store):
    live = publish(store, manifest_for(store, "run-live", 5), running(store, "run-live"), sleep=lambda s: None)
    record = publish(store, manifest_for(store, "run-staged", 1), running(store, "run-staged"), live=False,
                     sleep=lambda s: None)
    assert record.status == "succeeded" and record.published_at is None
    assert read_run_record(store, "run-staged").published_at is None
    assert read_current(store)[0].manifest_ref == live.manifest_ref
    assert SnapshotRoot(store).find_manifest("run-staged").uri == record.manifest_ref


def test_publish_stops_before_current_when_the_run_was_reaped(store):
    lc = running(store, "run-r")
    SnapshotRoot(store).mark_failed("run-r", RunAbandoned("reaped by cleanup"))
    with pytest.raises(PublishManifestError, match="no longer 'running'"):
        publish(store, manifest_for(store, "run-r", 1), lc, sleep=lambda s: None)
    assert read_current(store)[0] is None
    assert read_run_record(store, "run-r").error.message == "reaped by cleanup"


@pytest.mark.parametrize(("failures", "sleeps"), [(2, [1.0, 2.0]), (3, [1.0, 2.0, 4.0])])
def test_current_write_is_retried_with_1_2_4_second_backoff(store, failures, sleeps):
    slept: list[float] = []
    flaky = FailingCurrentPuts(store, failures)
    manifest = manifest_for(store, "run-b", 1)
    write_current(flaky, manifest, sleep=slept.append)
    assert slept == sleeps
    assert read_current(store)[0].run_id == "run-b"


def test_current_write_gives_up_after_three_retries_and_leaves_current_alone(store):
    lc = running(store, "run-old")
    first = publish(store, manifest_for(store, "run-old", 2), lc, sleep=lambda s: None).manifest_ref
    slept: list[float] = []
    with pytest.raises(PublishManifestError, match=r"after 3 retries: injected: S3 said 503.*stays staged"):
        publish(FailingCurrentPuts(store, 4), manifest_for(store, "run-c", 1), running(store, "run-c"),
                sleep=slept.append)
    assert slept == [1.0, 2.0, 4.0]
    assert read_current(store)[0].manifest_ref == first
    assert read_run_record(store, "run-c").status == "succeeded"  # staged: publishable later, never live+failed


def test_current_never_moves_to_an_older_run_unless_rollback_is_asked(store):
    newer = publish(store, manifest_for(store, "run-new", 1), running(store, "run-new"), sleep=lambda s: None)
    # Superseded: the older writer ends succeeded and staged instead of failing (a failed task's
    # retry would publish the older input over the newer snapshot under a fresh run id).
    older = publish(store, manifest_for(store, "run-older", 30), running(store, "run-older"), sleep=lambda s: None)
    assert older.status == "succeeded" and older.published_at is None
    assert read_current(store)[0].manifest_ref == newer.manifest_ref
    snapshots = SnapshotRoot(store)
    with pytest.raises(RunSupersededError, match=r"refusing to move it backwards.*allow_older=True"):
        snapshots.move_pointer(snapshots.manifest_ref(older.manifest_ref), sleep=lambda s: None)
    assert read_current(store)[0].manifest_ref == newer.manifest_ref
    ref = publish(store, manifest_for(store, "run-older2", 30), running(store, "run-older2"), allow_rollback=True,
                  sleep=lambda s: None).manifest_ref
    assert read_current(store)[0].manifest_ref == ref
    assert read_current(store)[0].previous_run_id == "run-new"


def test_live_state_tells_live_superseded_and_not_live_apart(store):
    snapshots = SnapshotRoot(store)
    after_settle = layout.utc_now() + POINTER_SETTLE + timedelta(seconds=1)

    def status(record):  # where a run meant to go live stands, once the writer had time to move _CURRENT
        return RunOutcome.from_record(record, record.run_id, after_settle, publish=True,
                                      pointer=read_live_state(snapshots, record))

    staged = publish(store, manifest_for(store, "run-staged", 60), running(store, "run-staged"), live=False)
    got = status(staged)
    assert (got.kind, got.live.state, got.live.live_run_id) == ("not_live", "not_live", None)
    assert "did not go live" in got.message and "does not exist" in got.message

    live = publish(store, manifest_for(store, "run-live", 30), running(store, "run-live"), sleep=lambda s: None)
    assert status(live).published
    got = status(staged)  # older than the live run
    assert got.succeeded and got.superseded_by == "run-live"
    assert "PublishSnapshotOperator(run_id='run-staged', allow_older=True)" in got.message

    newer = publish(store, manifest_for(store, "run-newer", 1), running(store, "run-newer"), live=False)
    got = status(newer)  # staged, newer than the live run: its move failed or is due
    assert got.kind == "not_live" and "names run 'run-live'" in got.message
    # Was live once (published_at), since superseded: still reported live.
    assert status(live).published
    publish(store, manifest_for(store, "run-newest", 0), running(store, "run-newest"), sleep=lambda s: None)
    assert status(live).published


def test_delete_losing_attempts_keeps_only_winners(store):
    winner = layout.attempt_key("run-d", 0, 1, 7)
    losers = [layout.attempt_key("run-d", 0, 0, 3), layout.attempt_key("run-d", 1, 0, 4)]
    for prefix in [winner, *losers]:
        store.put(f"{prefix}/000001.sst", b"x" * 10)
        store.put(f"{prefix}/CURRENT", b"y")
    deleted, failures = delete_losing_attempts(store, "run-d", [store.uri(winner)])
    assert (deleted, failures) == (4, [])
    assert sorted(o.key for o in store.list(layout.shards_prefix("run-d"))) == [f"{winner}/000001.sst", f"{winner}/CURRENT"]


def test_delete_losing_attempts_is_best_effort_when_listing_fails(store):
    class ListFails(FailingCurrentPuts):
        def list(self, prefix):
            raise StorageError("injected: listing denied")

    deleted, failures = delete_losing_attempts(ListFails(store, 0), "run-e", [])
    assert deleted == 0 and len(failures) == 1 and "listing denied" in failures[0][1]


class FailingRecordPuts(FailingCurrentPuts):
    """The first ``failures`` conditional puts of run records raise (a transient storage error)."""

    def put_if_match(self, key, data, etag, **kwargs):
        if key.startswith("runs/") and self.failures > 0:
            self.failures -= 1
            raise StorageError("injected: S3 said 500")
        return self._store.put_if_match(key, data, etag, **kwargs)


@pytest.mark.parametrize("failures", [2, 4])
def test_marking_the_run_succeeded_is_retried_and_fences_the_pointer(store, failures):
    flaky = FailingRecordPuts(store, 0)
    lc = running(flaky, "run-s")
    flaky.failures = failures
    slept: list[float] = []
    if failures <= 3:
        record = publish(flaky, manifest_for(store, "run-s", 1), lc, sleep=slept.append)
        assert record.status == "succeeded" and read_run_record(store, "run-s").manifest_ref == record.manifest_ref
        assert slept == [1.0, 2.0][:failures]
        assert read_current(store)[0].run_id == "run-s"
    else:
        with pytest.raises(PublishManifestError, match="'run-s' could not be marked succeeded, so the run was not published"):
            publish(flaky, manifest_for(store, "run-s", 1), lc, sleep=slept.append)
        assert slept == [1.0, 2.0, 4.0] and read_run_record(store, "run-s").status == "running"
        assert read_current(store)[0] is None  # never a live snapshot whose record is not succeeded
