"""What a run's end means to anyone waiting on it: one model for the operator, both sensors and the trigger.

A ``RunOutcome`` is built from a run record (plus, for a succeeded run meant to go live, where it
stands against ``_CURRENT``), from the absence of a record, from a read that failed, or from a
trigger event; it turns into a trigger event (``to_event``) and into the one exception a failed
run raises (``to_exception``: ``RunFailedError`` as the writer's own error class).

The rule the operator and the sensors share: a run is over when its record is ``failed``, its
lease expired (writer lost), or it is ``succeeded`` and either staged (``publish=False``) or
settled against ``_CURRENT``. The writer records ``succeeded`` just before it moves ``_CURRENT``,
so a run meant to go live counts as still running until ``_CURRENT`` names it (live), a run that
started later is live (superseded: it stays staged, not a failure), or ``POINTER_SETTLE`` has
passed since it finished (not live: an error, publish it with ``PublishSnapshotOperator``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    ManifestValidationError,
    PublishManifestError,
    RunFailedError,
    RunRecordError,
    StorageError,
    WriterLost,
    error_type_by_name,
)
from airflow_provider_shardyfusion.core.model.run_record import FAILED, SUCCEEDED, RunRecord
from airflow_provider_shardyfusion.core.model.snapshot import REWRITE_ON_LIVE, base_not_live
from airflow_provider_shardyfusion.core.write.job_contract import RunStats, WriterIdentity

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

__all__ = [
    "POINTER_SETTLE", "LiveState", "LiveStateName", "OutcomeKind", "RunOutcome", "meant_to_publish", "read_live_state",
    "read_outcome", "snapshot_summary", "wait_for_run",
]

# Longer than the writer's pointer move with its retries (1 s, 2 s, 4 s; SPEC §6).
POINTER_SETTLE = timedelta(seconds=30)
# While a succeeded run settles, look again at least this often (the move takes seconds).
_SETTLE_POLL_S = 2.0

LiveStateName = Literal["live", "staged", "superseded", "not_live"]
OutcomeKind = Literal["running", "absent", "succeeded", "failed", "writer_lost", "missing", "unreadable",
                      "not_live", "timed_out"]
_KINDS: tuple[str, ...] = get_args(OutcomeKind)
_WAITING: tuple[str, ...] = ("running", "absent")


@dataclass(frozen=True)
class LiveState:
    """Where a succeeded run stands against ``_CURRENT``.

    ``live``: ``_CURRENT`` names it, or did (``published_at``). ``staged``: it was not meant to go
    live (``publish=False``). ``superseded``: a run that started later is live, so the
    never-backwards rule keeps this one staged. ``not_live``: none of these (yet).
    """

    state: LiveStateName
    live_run_id: str | None = None  # the run _CURRENT names (None: no pointer, or not read)

    @classmethod
    def of(cls, record: RunRecord, live: CurrentPointer | None, *, live_started_at: datetime | None = None,
           own_started_at: datetime | None = None) -> LiveState:
        """Pure: the state from the pointer and the two runs' start times (from their manifests)."""
        live_id = live.run_id if live is not None else None
        if record.published_at is not None or live_id == record.run_id:
            return cls("live", live_id)
        if live_started_at is not None and own_started_at is not None and live_started_at > own_started_at:
            return cls("superseded", live_id)
        return cls("not_live", live_id)


def read_live_state(snapshots: SnapshotRoot, record: RunRecord) -> LiveState:
    """``LiveState`` of the succeeded ``record``, read from ``_CURRENT`` and the two manifests."""
    live = snapshots.current()
    if live is None or live.run_id == record.run_id or record.published_at is not None or not record.manifest_ref:
        return LiveState.of(record, live)
    try:
        live_started = snapshots.read_manifest_document(live).run_started_at
    except (StorageError, ManifestValidationError):
        live_started = None  # an unreadable live manifest counts as older, as the pointer move treats it
    own = snapshots.read_manifest_document(record.manifest_ref)
    return LiveState.of(record, live, live_started_at=live_started, own_started_at=own.run_started_at)


def meant_to_publish(record: RunRecord, publish: bool | None = None) -> bool:
    """Whether the writer was to move ``_CURRENT``: ``publish`` when the caller knows, else the
    record's ``writer.publish`` (records written before it was kept say nothing: treated as staged)."""
    return bool(publish) if publish is not None else WriterIdentity.from_dict(record.writer).publish is True


@dataclass(frozen=True)
class RunOutcome:
    """What a run record (or its absence, or a failed read) means to someone waiting on the run."""

    kind: OutcomeKind
    run_id: str
    record: RunRecord | None = None
    live: LiveState | None = None  # succeeded runs (and not_live): where the run stands against _CURRENT
    message: str = ""
    error_type: str | None = None  # the writer's own error type when the run failed
    writer_message: str | None = None
    traceback_tail: str | None = None

    # -- reading it ------------------------------------------------------------------------------

    @property
    def is_final(self) -> bool:
        return self.kind not in _WAITING

    @property
    def succeeded(self) -> bool:
        return self.kind == "succeeded"

    @property
    def settling(self) -> bool:
        """Succeeded and meant to go live, but ``_CURRENT`` has not moved yet."""
        return self.kind == "running" and self.record is not None and self.record.status == SUCCEEDED

    @property
    def published(self) -> bool:
        return self.live is not None and self.live.state == "live"

    @property
    def superseded_by(self) -> str | None:
        return self.live.live_run_id if self.live is not None and self.live.state == "superseded" else None

    # -- building it -----------------------------------------------------------------------------

    @staticmethod
    def awaits_pointer(record: RunRecord, publish: bool | None = None) -> bool:
        """True when ``from_record`` needs the ``LiveState``: succeeded, meant to go live, not stamped live."""
        return record.status == SUCCEEDED and record.published_at is None and meant_to_publish(record, publish)

    @classmethod
    def from_record(cls, record: RunRecord, run_id: str, now: datetime, *, pointer: LiveState | None = None,
                    publish: bool | None = None, settle: timedelta = POINTER_SETTLE) -> RunOutcome:
        """The outcome the record says. ``publish``: whether the run was meant to go live (default:
        the record's ``writer.publish``); ``pointer`` is required when ``awaits_pointer`` says so."""
        if record.run_id != run_id:
            raise RunRecordError(
                f"run record at {layout.run_record_key(run_id)} names run {record.run_id!r}, expected {run_id!r}"
            )
        if record.status == SUCCEEDED:
            return cls._succeeded(record, now, pointer, publish, settle)
        if record.status == FAILED:
            err = record.error
            error_type = err.type if err else RunRecordError.__name__
            message = err.message if err else "failed without an error in its run record"
            return cls("failed", run_id, record, None, f"run {run_id!r} failed: {error_type}: {message}", error_type,
                       message, err.traceback_tail if err else None)
        if record.lease_expired(now):
            return cls(
                "writer_lost", run_id, record, None,
                f"writer lost: run {run_id!r} is still 'running' but its lease expired at "
                f"{layout.format_ts(record.lease_expires_at)} (last heartbeat {layout.format_ts(record.updated_at)}); "
                "the writer (Spark driver) probably died without marking the run failed",
                WriterLost.__name__,
            )
        return cls("running", run_id, record, message=f"run {run_id!r} is running")

    @classmethod
    def _succeeded(cls, record: RunRecord, now: datetime, pointer: LiveState | None, publish: bool | None,
                   settle: timedelta) -> RunOutcome:
        run_id, where = record.run_id, f"_CURRENT at {record.output_uri} "
        if not cls.awaits_pointer(record, publish):
            state = LiveState("live" if record.published_at is not None else "staged")
            return cls("succeeded", run_id, record, state, f"run {run_id!r} succeeded ({state.state})")
        if pointer is None:
            raise ValueError(f"run {run_id!r}: the outcome of a run meant to go live needs its LiveState")
        where += f"names run {pointer.live_run_id!r}" if pointer.live_run_id else "does not exist"
        base = RunStats.from_dict(record.stats).base_run_id
        if base is not None and pointer.state != "live" and pointer.live_run_id != base:
            # Publish would refuse it (SPEC §13): no advice to publish it, and none to roll back over the live run.
            return cls("not_live", run_id, record, pointer,
                       f"{base_not_live(run_id, base, pointer.live_run_id)}. {REWRITE_ON_LIVE}",
                       BaseNotLiveError.__name__)
        if pointer.state == "superseded":
            return cls("succeeded", run_id, record, pointer, (
                f"run {run_id!r} is written and recorded succeeded but stays staged: {where}, which started later, "
                "and _CURRENT never moves back to an older run. To make it live anyway, publish it with "
                f"PublishSnapshotOperator(run_id={run_id!r}, allow_older=True)"))
        if pointer.state == "live":
            return cls("succeeded", run_id, record, pointer, f"run {run_id!r} is live")
        if now < (record.finished_at or record.updated_at) + settle:
            return cls("running", run_id, record, pointer, f"run {run_id!r} succeeded; waiting for _CURRENT to name it")
        return cls("not_live", run_id, record, pointer, (
            f"run {run_id!r} was written completely (run record succeeded) but did not go live: {where}. "
            f"Publish it with PublishSnapshotOperator(run_id={run_id!r}) or 'shardyfusion publish'"),
            PublishManifestError.__name__)

    @classmethod
    def absent(cls, run_id: str, output_uri: str) -> RunOutcome:
        """No run record (yet): a waiter keeps waiting, up to its ``missing_timeout``."""
        return cls("absent", run_id, message=f"run record of run {run_id!r} not found under {output_uri} yet")

    @classmethod
    def missing(cls, run_id: str, output_uri: str, waited: float, missing_timeout: float) -> RunOutcome:
        return cls(
            "missing", run_id, None, None,
            f"run record of run {run_id!r} does not exist under {output_uri} after {waited:.0f}s "
            f"(missing_timeout={missing_timeout}s); did the writer start, and is output_uri right?",
            RunRecordError.__name__,
        )

    @classmethod
    def unreadable(cls, run_id: str, output_uri: str, exc: BaseException) -> RunOutcome:
        """The record could not be read (a storage error, or a malformed record): not "no record"."""
        return cls("unreadable", run_id, None, None,
                   f"could not read the run record of run {run_id!r} under {output_uri}: {type(exc).__name__}: {exc}",
                   type(exc).__name__, str(exc))

    @classmethod
    def failure(cls, run_id: str, error_type: str, message: str, *, record: RunRecord | None = None,
                traceback_tail: str | None = None) -> RunOutcome:
        """A failure known from elsewhere than the record (spark-submit, the job's verdict line)."""
        return cls("failed", run_id, record, None, message, error_type, message, traceback_tail)

    @classmethod
    def timed_out(cls, last: RunOutcome, timeout: timedelta) -> RunOutcome:
        state = "absent" if last.kind == "absent" else "still running"
        return cls("timed_out", last.run_id, last.record, last.live,
                   f"run {last.run_id!r} is {state} after waiting {timeout}", RunRecordError.__name__)

    @property
    def transient(self) -> bool:
        """An unreadable record because of a storage error: reading again may work."""
        return self.kind == "unreadable" and issubclass(error_type_by_name(self.error_type or ""), StorageError)

    # -- events and exceptions -------------------------------------------------------------------

    def to_event(self) -> dict[str, Any]:
        """The trigger event (plain JSON): ``status`` success or error, and what a resumed task needs."""
        rec = self.record.to_dict() if self.record is not None else None
        if self.succeeded:
            return {"status": "success", "run_id": self.run_id, "run_record": rec,
                    "live_state": self.live.state if self.live else None,
                    "live_run_id": self.live.live_run_id if self.live else None}
        out: dict[str, Any] = {"status": "error", "message": self.message, "error_type": self.error_type,
                               "reason": self.kind, "run_id": self.run_id}
        if self.writer_message is not None:
            out["writer_message"] = self.writer_message
        if rec is not None:
            out["run_record"] = rec
        return out

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> RunOutcome:
        """Parse a trigger event back (also the triggers' generic read errors, which name no run)."""
        rec = RunRecord.from_dict(event["run_record"]) if event.get("run_record") else None
        run_id = str(event.get("run_id") or (rec.run_id if rec else ""))
        if event.get("status") == "success" and rec is not None:
            state = event.get("live_state")
            live = LiveState(cast("LiveStateName", state), event.get("live_run_id")) \
                if state in get_args(LiveStateName) else LiveState("live" if rec.published_at is not None else "staged")
            return cls("succeeded", run_id, rec, live, f"run {run_id!r} succeeded ({live.state})")
        reason = event.get("reason")
        kind: OutcomeKind = reason if reason in _KINDS and reason not in (*_WAITING, "succeeded") else "unreadable"
        message = str(event.get("message") or f"run record trigger failed without a message: {event!r}")
        return cls(kind, run_id, rec, None, message, event.get("error_type"), event.get("writer_message"))

    def to_exception(self, context: str = "") -> RunFailedError:
        """The one exception a run that did not succeed raises: the writer's own class and message
        (``RunFailedError`` too); ``context`` is appended in parentheses."""
        if self.succeeded or not self.is_final:
            raise ValueError(f"run {self.run_id!r} is {self.kind}: not a failure")
        message = self.writer_message if self.kind == "failed" and self.writer_message else self.message
        if context:
            message = f"{message} ({context})"
        return RunFailedError.of(self.error_type, message, reason=self.kind, run_id=self.run_id,
                                 writer_message=self.writer_message)

    def summary(self) -> dict[str, Any]:
        """The small, JSON-able description of the succeeded run's snapshot (the write operator's XCom)."""
        if self.record is None or not self.succeeded:
            raise ValueError(f"run {self.run_id!r} is {self.kind}: no snapshot to describe")
        out = snapshot_summary(self.record, published=self.published)
        if self.superseded_by:
            out["superseded_by"] = self.superseded_by
        return out


def snapshot_summary(record: RunRecord, *, published: bool) -> dict[str, Any]:
    """``{"published", "run_id", "output_uri", "manifest_ref", "run_record_ref", "num_dbs", "rows",
    "bytes", "empty_shards", "spark_app_id"}`` of a succeeded run."""
    stats = RunStats.from_dict(record.stats)
    return {
        "published": record.published_at is not None or published,
        "run_id": record.run_id,
        "output_uri": record.output_uri,
        "manifest_ref": record.manifest_ref,
        "run_record_ref": layout.join(record.output_uri, layout.run_record_key(record.run_id)),
        "num_dbs": record.num_dbs if record.num_dbs is not None else stats.num_dbs,
        "rows": stats.rows,
        "bytes": stats.bytes,
        "empty_shards": stats.empty_shards,
        "spark_app_id": WriterIdentity.from_dict(record.writer).spark_app_id,
    }


# ---- reading and waiting ---------------------------------------------------------------------------


def read_outcome(snapshots: SnapshotRoot, run_id: str, now: datetime, *, publish: bool | None = None) -> RunOutcome:
    """The run's outcome as stored now; a failed read is ``unreadable``, never ``absent``."""
    try:
        record = snapshots.read_run(run_id)
        if record is None:
            return RunOutcome.absent(run_id, snapshots.root)
        pointer = read_live_state(snapshots, record) if RunOutcome.awaits_pointer(record, publish) else None
        return RunOutcome.from_record(record, run_id, now, pointer=pointer, publish=publish)
    except (StorageError, RunRecordError, ManifestValidationError) as exc:
        return RunOutcome.unreadable(run_id, snapshots.root, exc)


def wait_for_run(snapshots: SnapshotRoot, run_id: str, *, timeout: timedelta, poll: float,
                 publish: bool | None = None, missing_timeout: float | None = None,
                 clock: Callable[[], datetime] | None = None, sleep: Callable[[float], None] | None = None,
                 ) -> RunOutcome:
    """Poll the run record until the outcome is final (see the module doc), at most ``timeout``.

    An absent record is waited for up to ``missing_timeout`` seconds (``None``: up to
    ``timeout``); a storage error is read again until ``timeout`` and then returned as
    ``unreadable``; a malformed record is ``unreadable`` at once. ``clock`` / ``sleep`` are
    injectable so tests drive time.
    """
    clock = clock or layout.utc_now
    sleep = sleep or time.sleep
    started = clock()
    while True:
        now = clock()
        outcome = read_outcome(snapshots, run_id, now, publish=publish)
        waited = (now - started).total_seconds()
        if outcome.kind == "absent" and missing_timeout is not None and waited >= missing_timeout:
            return RunOutcome.missing(run_id, snapshots.root, waited, missing_timeout)
        if outcome.is_final and not outcome.transient:
            return outcome
        left = (timeout - (now - started)).total_seconds()
        if left <= 0:
            return outcome if outcome.transient else RunOutcome.timed_out(outcome, timeout)
        sleep(min(poll, _SETTLE_POLL_S, left) if outcome.settling else min(poll, left))
