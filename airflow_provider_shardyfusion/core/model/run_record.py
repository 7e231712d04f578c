"""Run records (SPEC §7): the writer's state, renewed by a heartbeat lease.

The record is written with conditional puts: the lifecycle remembers the etag of its own last
write, so a record someone else changed (e.g. a cleanup that reaped an expired lease) is never
silently overwritten by a late heartbeat.
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ClockSkewError, ObjectNotFoundError, RunRecordError

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.storage.base import ObjectStore

__all__ = [
    "FAILED", "MAX_CLOCK_SKEW", "PUBLISH_CLAIM_HONOURED", "PUBLISH_CLAIM_TTL", "RUNNING", "RUN_RECORD_FORMAT_VERSION",
    "STATUSES", "SUCCEEDED", "RunError", "RunRecord", "RunRecordLifecycle", "RunStatus", "check_storage_clock",
    "read_run_record",
]

log = logging.getLogger(__name__)

RUN_RECORD_FORMAT_VERSION = 1
RunStatus = Literal["running", "succeeded", "failed"]
RUNNING: RunStatus = "running"
SUCCEEDED: RunStatus = "succeeded"
FAILED: RunStatus = "failed"
STATUSES: tuple[str, ...] = get_args(RunStatus)
_WHAT = "run record"
_ERR = RunRecordError
_TRACEBACK_TAIL_CHARS = 2000
# How long a publisher's claim (``publishing_at``) holds: a publish must move _CURRENT within it,
# and cleanup leaves a run claimed more recently alone.
PUBLISH_CLAIM_TTL = timedelta(minutes=15)
# How far a writer's clock may be from the storage's. Generous next to NTP (milliseconds) and to S3's
# whole-second LastModified, small next to the lease (10 min) and to the gaps between runs it orders.
MAX_CLOCK_SKEW = timedelta(minutes=2)
# How long cleanup honours a publisher's claim: longer than the publisher may use it, since each of
# the two clocks may be MAX_CLOCK_SKEW from the storage's, and the pointer move that follows the
# publisher's last check of its claim retries for seconds.
PUBLISH_CLAIM_HONOURED = PUBLISH_CLAIM_TTL + 2 * MAX_CLOCK_SKEW + timedelta(minutes=1)


def check_storage_clock(store: ObjectStore, key: str, ours: datetime, machine: str) -> timedelta | None:
    """The skew between ``ours`` (this machine's time when it just wrote ``key``) and the storage's stamp.

    ``None`` if the store gives no time; more than ``MAX_CLOCK_SKEW`` raises ``ClockSkewError``
    naming ``machine`` (what to synchronise).
    """
    info = store.head(key)
    if info is None or info.last_modified is None:
        return None
    theirs = info.last_modified
    skew = ours - theirs
    if abs(skew) > MAX_CLOCK_SKEW:
        raise ClockSkewError(
            f"this machine's clock read {layout.format_ts(ours)} when it wrote {store.uri(key)}, which the storage "
            f"stamped {layout.format_ts(theirs)}: {abs(skew.total_seconds()):.0f} s apart, more than the "
            f"{MAX_CLOCK_SKEW.total_seconds():.0f} s allowed. Run start times decide which run is newer, and "
            f"leases and claims expire by the clock; synchronise the clock (NTP) of {machine}"
        )
    return skew


@dataclass(frozen=True)
class RunError:
    """The error a failed run recorded: the writer's error type, message and traceback tail."""

    type: str
    message: str
    traceback_tail: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> RunError:
        tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_TRACEBACK_TAIL_CHARS:]
        return cls(type=type(exc).__name__, message=str(exc), traceback_tail=tail)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "traceback_tail": self.traceback_tail}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RunError:
        return _ERROR_CODEC.from_dict(obj)


@dataclass(frozen=True)
class RunRecord:
    """A run's state under ``runs/``: status, lease, manifest and its identity, publish/cleanup stamps and claims."""

    run_id: str
    status: RunStatus
    started_at: datetime
    updated_at: datetime
    lease_expires_at: datetime
    output_uri: str
    finished_at: datetime | None = None
    manifest_ref: str | None = None
    error: RunError | None = None
    num_dbs: int | None = None
    config_fingerprint: str | None = None
    writer: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    published_at: datetime | None = None  # last time _CURRENT was moved to this run; None while staged
    deleted_at: datetime | None = None  # set by cleanup when the run's data is gone (the record stays)
    # The cleanup/publish fence (README, reliability): each side claims the record with a
    # conditional put before it acts, so a publish and a deletion of one run never interleave.
    deleting_at: datetime | None = None  # cleanup claimed the run's data for deletion
    publishing_at: datetime | None = None  # a publisher claimed the run to move _CURRENT to it
    # The manifest the writer finished with: publish and validation refuse any other bytes.
    manifest_checksum: str | None = None
    manifest_size: int | None = None
    # The last validation report of the run (ValidateManifestOperator / 'shardyfusion validate'), for audits.
    validation: dict[str, Any] | None = None
    format_version: int = RUN_RECORD_FORMAT_VERSION

    @property
    def is_terminal(self) -> bool:
        return self.status in (SUCCEEDED, FAILED)

    def lease_expired(self, now: datetime) -> bool:
        return self.status == RUNNING and now >= self.lease_expires_at

    def validate(self) -> RunRecord:
        if self.status not in STATUSES:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: status {self.status!r} is not one of {list(STATUSES)}")
        try:
            layout.validate_run_id(self.run_id)
        except Exception as exc:
            raise _ERR(f"{_WHAT}: {exc}") from None
        if self.status == SUCCEEDED and not self.manifest_ref:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: status succeeded without manifest_ref")
        if self.status == FAILED and self.error is None:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: status failed without error")
        return self

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RunRecord:
        return _CODEC.from_dict(obj)

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> RunRecord:
        return _CODEC.from_bytes(data)


_CODEC = ser.Codec(RunRecord, _WHAT, _ERR, supported=RUN_RECORD_FORMAT_VERSION, finish=lambda record: record.validate())
_ERROR_CODEC = ser.Codec(RunError, f"{_WHAT} error", _ERR)


def read_run_record(store: ObjectStore, run_id: str) -> RunRecord | None:
    try:
        obj = store.get(layout.run_record_key(run_id))
    except ObjectNotFoundError:
        return None
    return RunRecord.from_bytes(obj.data)


class RunRecordLifecycle:
    """Start a run record, keep its lease alive from a daemon thread, and finish it exactly once.

    Use as a context manager: an exception inside marks the run failed (type, message, traceback
    tail) and is re-raised.
    """

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        *,
        lease_seconds: float = 600.0,
        heartbeat_seconds: float = 60.0,
        num_dbs: int | None = None,
        config_fingerprint: str | None = None,
        writer: dict[str, Any] | None = None,
        clock: Callable[[], datetime] = layout.utc_now,
    ):
        self.store = store
        self.key = layout.run_record_key(run_id)
        self.lease = timedelta(seconds=lease_seconds)
        self.heartbeat_seconds = heartbeat_seconds
        self.clock = clock
        now = clock()
        self.record = RunRecord(
            run_id=run_id, status=RUNNING, started_at=now, updated_at=now, lease_expires_at=now + self.lease,
            output_uri=store.root, num_dbs=num_dbs, config_fingerprint=config_fingerprint, writer=dict(writer or {}),
        )
        self._etag: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False  # someone else changed the record: stop renewing, never overwrite

    @property
    def ref(self) -> str:
        return self.store.uri(self.key)

    # -- writes ---------------------------------------------------------------------------------

    def _write(self, record: RunRecord) -> None:
        """Conditional write over our own last version; a foreign change marks the lease lost."""
        etag = self.store.put_if_match(self.key, record.to_bytes(), self._etag)
        if etag is None:
            self.lost = True
            raise RunRecordError(
                f"run record {self.ref} was changed by someone else (reaped as abandoned?); not overwriting it"
            )
        self._etag = etag
        self.record = record

    def start(self) -> RunRecordLifecycle:
        with self._lock:
            etag = self.store.put_if_match(self.key, self.record.to_bytes(), None)
            if etag is None:
                self.lost = True  # the record is another run's: never touch it
                raise RunRecordError(
                    f"a run record for run_id {self.record.run_id!r} already exists at {self.ref}; run ids must be "
                    "unique (pick a new run_id or leave it unset to generate one)"
                )
            self._etag = etag
        log.info("run %s: run record started at %s (lease %ss)", self.record.run_id, self.ref, self.lease.total_seconds())
        self._thread = threading.Thread(target=self._beat_loop, name=f"run-record-heartbeat-{self.record.run_id}", daemon=True)
        self._thread.start()
        return self

    def check_clock(self) -> timedelta | None:
        """Compare this machine's clock with the storage's (the time it stamped our new record).

        Returns the measured skew (``None`` if the store gives no time); more than
        ``MAX_CLOCK_SKEW`` raises ``ClockSkewError``. Run start times of different machines are
        compared by the never-backwards rule, so one clock hours behind would have its fresh run
        judged older than the live one and staged silently; refusing it here, before any data is
        written, says what is wrong instead.
        """
        return check_storage_clock(self.store, self.key, self.record.started_at, "the machine running the Spark driver")

    def heartbeat(self) -> bool:
        """Renew the lease once; a failed write is logged, never raised. True if renewed."""
        with self._lock:
            if self.record.is_terminal or self.lost:
                return False
            now = self.clock()
            try:
                self._write(replace(self.record, updated_at=now, lease_expires_at=now + self.lease))
                return True
            except Exception as exc:
                log.warning("run %s: heartbeat could not renew the lease: %s", self.record.run_id, exc)
                return False

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            self.heartbeat()
            if self.lost:
                return

    def update(self, **changes: Any) -> None:
        """Record facts learned during the run (num_dbs, stats, writer info)."""
        with self._lock:
            self._write(replace(self.record, updated_at=self.clock(), **changes))

    def still_running(self) -> bool:
        """Re-read our record from storage: False if it is no longer ours and running."""
        current = read_run_record(self.store, self.record.run_id)
        return current is not None and current.status == RUNNING and not self.lost

    def succeed(self, manifest_ref: str, stats: dict[str, Any] | None = None, *, manifest_checksum: str | None = None,
                manifest_size: int | None = None, publishing: bool = False) -> RunRecord:
        """Finish the run ``succeeded`` with its manifest's identity; ``publishing`` claims the pointer move."""
        self._finish(status=SUCCEEDED, manifest_ref=manifest_ref, stats=dict(stats or self.record.stats),
                     manifest_checksum=manifest_checksum, manifest_size=manifest_size,
                     publishing_at=self.clock() if publishing else None)
        log.info("run %s: run record marked succeeded (manifest %s)", self.record.run_id, manifest_ref)
        return self.record

    def fail(self, exc: BaseException) -> RunRecord:
        self._finish(status=FAILED, error=RunError.from_exception(exc))
        log.error("run %s: run record marked failed: %s: %s", self.record.run_id, type(exc).__name__, exc)
        return self.record

    def _finish(self, **changes: Any) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        now = self.clock()
        with self._lock:
            if self.record.is_terminal:
                return
            self._write(replace(self.record, updated_at=now, finished_at=now, **changes))

    def __enter__(self) -> RunRecordLifecycle:
        return self.start() if self._thread is None else self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and not self.record.is_terminal and not self.lost:
            try:
                self.fail(exc)
            except Exception as write_exc:  # the original error matters more than the bookkeeping
                log.error("run %s: could not mark the run failed: %s", self.record.run_id, write_exc)
        self._stop.set()
