"""When ``shardyfusion serve`` is ready (``GET /readyz``): a snapshot loaded, confirmed current recently.

A failed check of ``_CURRENT`` alone keeps a server ready: its snapshot answers exactly as it did a
moment before, and a storage blip would otherwise take a whole fleet out of rotation at once. The
server leaves rotation once its reader has not confirmed it serves what ``_CURRENT`` names for
longer than ``max_staleness_s`` (``ReaderHealth.last_success_at``), or has no snapshot. The run's
age is not a reason: a pipeline that publishes daily leaves a day-old run current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.read.health import UNHEALTHY, unconfirmed_s

if TYPE_CHECKING:
    from datetime import datetime

    from airflow_provider_shardyfusion.core.read.health import ReaderHealth

__all__ = ["unready_reason"]


def unready_reason(health: ReaderHealth, max_staleness_s: float | None, *, now: datetime | None = None) -> str | None:
    """None when a server whose reader says ``health`` is ready, else why it is not (one line)."""
    if health.status == UNHEALTHY:
        return "no snapshot is loaded (the reader is closed)"
    if max_staleness_s is None:
        return None
    unconfirmed = unconfirmed_s(health.last_success_at, now)
    if unconfirmed <= max_staleness_s:
        return None
    since = "ever" if unconfirmed == float("inf") else f"for {unconfirmed:.0f}s"
    if health.last_error is not None:
        return (f"the check of _CURRENT has failed {since}, longer than max_staleness_s ({max_staleness_s:g}s); "
                f"last error: {health.last_error}; still serving run {health.run_id}")
    return (f"the reader has not confirmed that it serves what _CURRENT names {since}, longer than "
            f"max_staleness_s ({max_staleness_s:g}s); still serving run {health.run_id}")
