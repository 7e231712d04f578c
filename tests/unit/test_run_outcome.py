"""One run-outcome model (core.lifecycle.run_outcome): what a run record means to the operator, both sensors
and the trigger; the waiting, driven by a fake clock on a real local store."""

from __future__ import annotations

import dataclasses
import json
import pickle
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    InputDataError,
    PublishManifestError,
    RunFailedError,
    RunRecordError,
    StorageError,
    WriterLost,
)
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.lifecycle.run_outcome import (
    POINTER_SETTLE,
    LiveState,
    RunOutcome,
    read_outcome,
    wait_for_run,
)
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, RunError
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from tests.polling import FakeClock
from tests.snapshot_helpers import publish_written_run, store_for, write_run_record


def snapshots(root):
    return SnapshotRoot(store_for(root))


# ---- from_record -----------------------------------------------------------------------------


def test_a_failed_record_is_the_writers_own_error(file_root):
    rec = write_run_record(store_for(file_root), "r1", FAILED, error=RunError("InputDataError", "null key", "tb"))
    got = RunOutcome.from_record(rec, "r1", layout.utc_now())
    assert (got.kind, got.error_type, got.writer_message, got.traceback_tail) == ("failed", "InputDataError",
                                                                                  "null key", "tb")
    exc = got.to_exception()
    assert isinstance(exc, InputDataError) and isinstance(exc, RunFailedError) and isinstance(exc, RunRecordError)
    assert type(exc).__name__ == "InputDataError" and str(exc) == "null key"
    assert (exc.error_type, exc.reason, exc.run_id, exc.writer_message) == ("InputDataError", "failed", "r1", "null key")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc) and again.run_id == "r1" and str(again) == "null key"


def test_an_expired_lease_is_writer_lost(file_root):
    rec = write_run_record(store_for(file_root), "r1", RUNNING, lease_seconds=-1)
    got = RunOutcome.from_record(rec, "r1", layout.utc_now())
    assert got.kind == "writer_lost" and got.is_final and isinstance(got.to_exception(), WriterLost)


def test_a_record_of_another_run_is_refused(file_root):
    rec = write_run_record(store_for(file_root), "r1", RUNNING)
    with pytest.raises(RunRecordError, match="names run 'r1', expected 'r2'"):
        RunOutcome.from_record(rec, "r2", layout.utc_now())


def test_a_staged_run_is_over_at_once_and_says_so(file_root):
    rec = publish_written_run(store_for(file_root), "r1", live=False, writer={"publish": False})
    got = RunOutcome.from_record(rec, "r1", layout.utc_now())
    assert got.succeeded and got.live.state == "staged" and got.summary()["published"] is False
    # A staged run published later (published_at) is live whatever the caller meant.
    live = dataclasses.replace(rec, published_at=layout.utc_now())
    assert RunOutcome.from_record(live, "r1", layout.utc_now(), publish=False).summary()["published"] is True


def test_a_record_without_the_publish_flag_is_treated_as_before(file_root):
    rec = publish_written_run(store_for(file_root), "r1", live=False)  # an older writer: no writer.publish
    assert not RunOutcome.awaits_pointer(rec)
    assert RunOutcome.from_record(rec, "r1", layout.utc_now()).succeeded


def test_a_run_meant_to_go_live_settles_against_current(file_root):
    rec = publish_written_run(store_for(file_root), "r1", live=False, writer={"publish": True})
    assert RunOutcome.awaits_pointer(rec)
    with pytest.raises(ValueError, match="needs its LiveState"):
        RunOutcome.from_record(rec, "r1", layout.utc_now())
    not_yet = LiveState("not_live")
    early = RunOutcome.from_record(rec, "r1", rec.finished_at + timedelta(seconds=1), pointer=not_yet)
    assert early.kind == "running" and early.settling and not early.is_final
    late = RunOutcome.from_record(rec, "r1", rec.finished_at + POINTER_SETTLE, pointer=not_yet)
    assert late.kind == "not_live" and "did not go live" in late.message
    with pytest.raises(PublishManifestError, match=r"PublishSnapshotOperator\(run_id='r1'\)"):
        raise late.to_exception()
    superseded = RunOutcome.from_record(rec, "r1", rec.finished_at, pointer=LiveState("superseded", "r2"))
    assert superseded.succeeded and superseded.superseded_by == "r2"
    assert superseded.summary()["superseded_by"] == "r2" and superseded.summary()["published"] is False
    live = RunOutcome.from_record(rec, "r1", rec.finished_at, pointer=LiveState("live", "r1"))
    assert live.succeeded and live.summary()["published"] is True



def test_a_delta_whose_base_is_not_live_is_never_told_to_publish(file_root):
    """Publish refuses a chain run while its base is not live: the outcome names both runs and
    suggests no publish (issue 27 item 4), superseded or not."""
    written = publish_written_run(store_for(file_root), "d1", live=False, writer={"publish": True})
    rec = dataclasses.replace(written, stats={**written.stats, "base_run_id": "b0"})
    for state in (LiveState("not_live", "c2"), LiveState("superseded", "c2")):
        got = RunOutcome.from_record(rec, "d1", rec.finished_at, pointer=state)
        assert got.kind == "not_live" and got.is_final
        assert "run 'd1' is written on run 'b0', but _CURRENT names 'c2'" in got.message
        assert "PublishSnapshotOperator" not in got.message and "publish it" not in got.message.lower()
        with pytest.raises(BaseNotLiveError):
            raise got.to_exception()
    on_base = RunOutcome.from_record(rec, "d1", rec.finished_at, pointer=LiveState("not_live", "b0"))
    assert on_base.kind == "running" and on_base.settling


# ---- events ----------------------------------------------------------------------------------


def test_events_round_trip(file_root):
    rec = publish_written_run(store_for(file_root), "r1", writer={"publish": True})
    for outcome in (
        RunOutcome.from_record(rec, "r1", layout.utc_now(), pointer=LiveState("superseded", "r9")),
        RunOutcome.from_record(write_run_record(store_for(file_root), "r2", FAILED, error=RunError("InputDataError", "x")),
                               "r2", layout.utc_now()),
        RunOutcome.missing("r3", file_root, 12, 10),
    ):
        event = outcome.to_event()
        assert json.loads(json.dumps(event)) == event
        back = RunOutcome.from_event(event)
        assert (back.kind, back.run_id, back.error_type, back.superseded_by) == (
            outcome.kind, outcome.run_id, outcome.error_type, outcome.superseded_by)
        assert back.record == outcome.record


def test_a_generic_trigger_error_event_is_unreadable_with_its_type():
    got = RunOutcome.from_event({"status": "error", "message": "giving up after 5 reads", "error_type": "StorageError"})
    exc = got.to_exception()
    assert got.kind == "unreadable" and isinstance(exc, StorageError) and str(exc) == "giving up after 5 reads"


# ---- reading and waiting -----------------------------------------------------------------------


def test_absent_is_not_unreadable(file_root, monkeypatch):
    snaps = snapshots(file_root)
    assert read_outcome(snaps, "r1", layout.utc_now()).kind == "absent"

    def outage(run_id):
        raise StorageError("connection reset")

    monkeypatch.setattr(snaps, "read_run", outage)
    got = read_outcome(snaps, "r1", layout.utc_now())
    assert got.kind == "unreadable" and got.transient and "connection reset" in got.message


def test_wait_returns_when_the_writer_finishes(file_root):
    store = store_for(file_root)
    write_run_record(store, "r1", RUNNING)
    clock = FakeClock(on_sleep=lambda n: n == 3 and write_run_record(store, "r1", FAILED, error=RunError("X", "y")))
    got = wait_for_run(snapshots(file_root), "r1", timeout=timedelta(minutes=5), poll=10, clock=clock,
                       sleep=clock.sleep)
    assert got.kind == "failed" and clock.slept == [10, 10, 10]


def test_wait_times_out_and_waits_for_an_absent_record_only_as_long_as_asked(file_root):
    store = store_for(file_root)
    write_run_record(store, "r1", RUNNING, lease_seconds=3600)
    clock = FakeClock()
    got = wait_for_run(snapshots(file_root), "r1", timeout=timedelta(seconds=25), poll=10, clock=clock,
                       sleep=clock.sleep)
    assert got.kind == "timed_out" and clock.slept == [10, 10, 5] and "still running" in got.message
    clock = FakeClock()
    got = wait_for_run(snapshots(file_root), "gone", timeout=timedelta(hours=1), poll=10, missing_timeout=0,
                       clock=clock, sleep=clock.sleep)
    assert got.kind == "missing" and clock.slept == []


def test_wait_retries_a_storage_outage_and_reports_it_as_unreadable(file_root, monkeypatch):
    snaps = snapshots(file_root)
    monkeypatch.setattr(snaps, "read_run", lambda run_id: (_ for _ in ()).throw(StorageError("503 slow down")))
    clock = FakeClock()
    got = wait_for_run(snaps, "r1", timeout=timedelta(seconds=30), poll=10, clock=clock, sleep=clock.sleep)
    assert got.kind == "unreadable" and clock.slept == [10, 10, 10] and "503 slow down" in got.message


def test_wait_sees_a_succeeded_run_through_to_live(file_root):
    store = store_for(file_root)
    publish_written_run(store, "r1", live=False, writer={"publish": True})
    clock = FakeClock(on_sleep=lambda n: n == 2 and publish_run(SnapshotRoot(store), run_id="r1"))
    got = wait_for_run(snapshots(file_root), "r1", timeout=timedelta(hours=1), poll=60, clock=clock,
                       sleep=clock.sleep)
    assert got.published and clock.slept == [2.0, 2.0]  # settling looks again every 2 s


def test_wait_gives_up_on_a_pointer_that_never_moves_after_the_settle_time(file_root):
    publish_written_run(store_for(file_root), "r1", live=False, writer={"publish": True})
    clock = FakeClock()
    got = wait_for_run(snapshots(file_root), "r1", timeout=timedelta(hours=1), poll=5, clock=clock, sleep=clock.sleep)
    assert got.kind == "not_live" and sum(clock.slept) == pytest.approx(POINTER_SETTLE.total_seconds(), abs=2.0)
