"""``ShardedReader.health()`` (SPEC §19): is the reader serving, which run, how stale, did its last check fail.

Health is asked often (a readiness probe, a metrics scrape), so it makes no request: the run's
publication time is the ``updated_at`` of the pointer the reader loaded (the time the run went
live), and the last check is whatever the follower, or the user's own ``refresh()``, last did.
Staleness is measured from the last check that succeeded, not from the publication: a reader
that keeps confirming it serves what ``_CURRENT`` names is current however old the run is.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot

__all__ = [
    "DEGRADED", "HEALTHY", "UNHEALTHY", "CheckLog", "HealthStatus", "ReaderHealth", "cached_bytes", "reader_health",
    "unconfirmed_s",
]

HealthStatus = Literal["healthy", "degraded", "unhealthy"]
HEALTHY: HealthStatus = "healthy"
DEGRADED: HealthStatus = "degraded"
UNHEALTHY: HealthStatus = "unhealthy"


@dataclass(frozen=True)
class ReaderHealth:
    """What ``ShardedReader.health()`` says, a copy later events leave as it is.

    ``status``: ``"healthy"``; ``"degraded"`` when the last check of ``_CURRENT`` failed
    (``last_error`` says why; the reader goes on serving ``run_id``) or the reader has not confirmed
    it serves what ``_CURRENT`` names for longer than its ``max_staleness_s`` (``last_success_at``
    is older than that); ``"unhealthy"`` when no snapshot is loaded (the reader is closed). A check
    fails when ``_CURRENT`` cannot be read, or names a run the reader cannot serve (a malformed
    pointer, a missing or invalid manifest: the reader keeps its snapshot and the error names that run).
    ``published_at``: when ``run_id`` went live (the ``updated_at`` of the ``_CURRENT`` it was loaded
    from; for a ``manifest_ref`` reader, when its manifest was written); ``age_s``: seconds since
    then, which says nothing about health (a pipeline publishing daily leaves a day-old run
    current). ``last_check_at``: when ``_CURRENT`` was last read, by the follower, by ``refresh()``
    or at construction. ``last_success_at``: the last time such a check (or the load) succeeded,
    i.e. the reader last confirmed it serves what ``_CURRENT`` names: what ``max_staleness_s``
    and a readiness probe measure. ``last_error``: the last check's error as text (type and
    message), or None when it succeeded. ``shards_open``: shard databases open now.
    ``cache_bytes``: the bytes, as the manifest records them, of the served run's shards present in
    the local cache. ``shards_read_only``: for a reader that ingests refreshes, the shards of the
    served run it serves read-only from the cache because its memory-backed folder had no room for
    them (it may have filled after the reader opened; the reads are exact, a refresh tries them
    live again); ``read_only_reason``: why, for one of them (None when there are none). Neither
    changes ``status``.
    """

    status: HealthStatus
    run_id: str | None
    published_at: datetime | None
    age_s: float | None
    last_check_at: datetime | None
    last_success_at: datetime | None
    last_error: str | None
    shards_open: int
    cache_bytes: int
    shards_read_only: int = 0
    read_only_reason: str | None = None


class CheckLog:
    """When ``_CURRENT`` was last read, whether that failed, and when a read last succeeded:
    written by the follower and by ``refresh()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checked_at: datetime | None = None
        self.succeeded_at: datetime | None = None
        self.error: BaseException | None = None

    def record(self, error: BaseException | None) -> None:
        with self._lock:
            self.checked_at = datetime.now(UTC)
            self.error = error
            if error is None:
                self.succeeded_at = self.checked_at

    def read(self) -> tuple[datetime | None, datetime | None, BaseException | None]:
        """``(checked_at, succeeded_at, error)``, one consistent copy."""
        with self._lock:
            return self.checked_at, self.succeeded_at, self.error


def reader_health(snapshot: LoadedSnapshot | None, checks: CheckLog, *, max_staleness_s: float | None,
                  now: datetime | None = None) -> ReaderHealth:
    """The health of a reader serving ``snapshot`` (None: closed), from its check log."""
    checked_at, succeeded_at, error = checks.read()
    last_error = None if error is None else f"{type(error).__name__}: {error}"
    if snapshot is None:
        return ReaderHealth(status=UNHEALTHY, run_id=None, published_at=None, age_s=None, last_check_at=checked_at,
                            last_success_at=succeeded_at, last_error=last_error, shards_open=0, cache_bytes=0)
    now = now or datetime.now(UTC)
    published_at = snapshot.pointer.updated_at
    age_s = max(0.0, (now - published_at).total_seconds())
    # Stale is about the reader, not the pipeline: not confirmed current for too long.
    stale = max_staleness_s is not None and unconfirmed_s(succeeded_at, now) > max_staleness_s
    read_only = dict(snapshot.read_only)  # one step under the GIL, as reads may add to it
    return ReaderHealth(
        status=DEGRADED if error is not None or stale else HEALTHY, run_id=snapshot.run_id, published_at=published_at,
        age_s=age_s, last_check_at=checked_at, last_success_at=succeeded_at, last_error=last_error,
        shards_open=len(snapshot.handles),
        cache_bytes=cached_bytes(snapshot), shards_read_only=len(read_only),
        read_only_reason=next(iter(read_only.values()), None),
    )


def unconfirmed_s(last_success_at: datetime | None, now: datetime | None = None) -> float:
    """Seconds since ``last_success_at`` (infinite when the reader never confirmed it is current)."""
    if last_success_at is None:
        return float("inf")
    return max(0.0, ((now or datetime.now(UTC)) - last_success_at).total_seconds())


def cached_bytes(snapshot: LoadedSnapshot) -> int:
    """Bytes of ``snapshot``'s shards built or verified in the cache, from the manifest (no disk walk)."""
    shards = snapshot.shards
    # list() of a dict the reads may grow copies it in one step under the GIL.
    return sum(shards[db_id].byte_size for db_id in list(snapshot.paths) if db_id in shards)
