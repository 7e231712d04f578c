"""A succeeded write's figures through Airflow's own metrics (``airflow.sdk.observability.stats``).

They reach whatever Airflow's metrics are configured for (StatsD, Datadog, or OpenTelemetry with
``[metrics] otel_on``), under the names the Spark job reports to OpenTelemetry (``core.write.metrics``):
``shardyfusion.writer.rows`` and ``shardyfusion.writer.bytes`` (counters) and, per phase,
``shardyfusion.writer.phase.duration.<phase>`` (a timing; StatsD has no attributes, so the phase is
in the name, and in the ``phase`` tag as well).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["emit_write_stats"]

log = logging.getLogger(__name__)


def emit_write_stats(summary: Mapping[str, Any], run_stats: Mapping[str, Any]) -> None:
    """Emit rows, bytes and phase durations of a succeeded run; never fails the task."""
    try:
        from airflow.sdk.observability import stats

        write_mode = str(run_stats.get("write_mode") or "full")
        tags = {"write_mode": write_mode}
        stats.incr("shardyfusion.writer.rows", int(summary.get("rows") or 0), tags=tags)
        stats.incr("shardyfusion.writer.bytes", int(summary.get("bytes") or 0), tags=tags)
        for phase, seconds in (run_stats.get("durations_s") or {}).items():
            stats.timing(f"shardyfusion.writer.phase.duration.{phase}", timedelta(seconds=float(seconds)),
                         tags={**tags, "phase": phase})
    except Exception as exc:  # the run is published; its metrics are a convenience
        log.warning("could not emit the write's metrics: %s", exc)
