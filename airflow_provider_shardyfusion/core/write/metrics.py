"""The write job's figures as OpenTelemetry metrics, meter ``shardyfusion.writer`` (SPEC §19).

Reported once per succeeded run from its stats (the same figures the run record and the
operator's XCom carry): ``shardyfusion.writer.rows`` and ``shardyfusion.writer.bytes`` (counters)
and ``shardyfusion.writer.phase.duration`` (histogram, s, attribute ``phase``), each with the
attribute ``write_mode``. A no-op unless an OpenTelemetry SDK is configured in the job's process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.telemetry import meter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow_provider_shardyfusion.core.model.manifest import WriteMode

__all__ = ["METER_NAME", "report_write"]

METER_NAME = "shardyfusion.writer"

log = logging.getLogger(__name__)


def report_write(stats: Mapping[str, Any], durations_s: Mapping[str, float], *, write_mode: WriteMode,
                 meter_provider: Any = None) -> None:
    """Record a succeeded run's rows, bytes and phase durations; never fails the write."""
    try:
        m = meter(METER_NAME, meter_provider)
        if m is None:
            return
        attributes = {"write_mode": write_mode}
        m.create_counter("shardyfusion.writer.rows", unit="{row}",
                         description="Rows of the snapshots written").add(int(stats.get("rows") or 0), attributes)
        m.create_counter("shardyfusion.writer.bytes", unit="By",
                         description="Bytes of the snapshots written").add(int(stats.get("bytes") or 0), attributes)
        histogram = m.create_histogram("shardyfusion.writer.phase.duration", unit="s",
                                       description="Duration of each phase of a write job")
        for phase, seconds in durations_s.items():
            histogram.record(float(seconds), {**attributes, "phase": phase})
    except Exception as exc:  # metrics are a convenience: a broken exporter must not fail a published run
        log.warning("could not report the write's metrics: %s", exc)
