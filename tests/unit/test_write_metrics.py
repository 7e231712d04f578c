"""The write side's metrics: the Spark job's OpenTelemetry figures and the operator's Airflow stats."""

from __future__ import annotations

from datetime import timedelta

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from airflow_provider_shardyfusion.core.write.metrics import report_write
from airflow_provider_shardyfusion.operators.write_stats import emit_write_stats

STATS = {"rows": 1200, "bytes": 34567, "write_mode": "delta", "durations_s": {"read_input": 1.5, "publish": 0.25}}


def test_the_job_reports_rows_bytes_and_phases_to_opentelemetry():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    report_write(STATS, STATS["durations_s"], write_mode="delta", meter_provider=provider)
    (scope,) = reader.get_metrics_data().resource_metrics[0].scope_metrics
    assert scope.scope.name == "shardyfusion.writer"
    got = {m.name: (m.unit, sorted((tuple(sorted(p.attributes.items())), getattr(p, "value", None) or p.sum)
                                   for p in m.data.data_points)) for m in scope.metrics}
    assert got == {
        "shardyfusion.writer.rows": ("{row}", [((("write_mode", "delta"),), 1200)]),
        "shardyfusion.writer.bytes": ("By", [((("write_mode", "delta"),), 34567)]),
        "shardyfusion.writer.phase.duration": ("s", [((("phase", "publish"), ("write_mode", "delta")), 0.25),
                                                     ((("phase", "read_input"), ("write_mode", "delta")), 1.5)]),
    }
    provider.shutdown()


class _Recorder:
    """A backend for Airflow's stats module, installed through its own ``initialize(factory=…)``."""

    calls: list[tuple] = []  # noqa: RUF012

    def incr(self, stat, count=1, rate=1, *, tags=None):
        self.calls.append(("incr", stat, count, tags))

    def timing(self, stat, dt, *, tags=None):
        self.calls.append(("timing", stat, dt, tags))


def test_the_operator_emits_the_same_figures_through_airflow_stats(monkeypatch):
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk.observability import stats

    # initialize() replaces module globals: monkeypatch puts Airflow's own back after the test.
    for name in ("_factory", "_backend", "_export_legacy_names"):
        monkeypatch.setattr(stats_module, name, getattr(stats_module, name))
    _Recorder.calls = []
    stats.initialize(factory=_Recorder, export_legacy_names=False)
    emit_write_stats({"rows": 1200, "bytes": 34567}, STATS)
    tags = {"write_mode": "delta"}
    assert _Recorder.calls == [
        ("incr", "shardyfusion.writer.rows", 1200, tags),
        ("incr", "shardyfusion.writer.bytes", 34567, tags),
        ("timing", "shardyfusion.writer.phase.duration.read_input", timedelta(seconds=1.5), {**tags, "phase": "read_input"}),
        ("timing", "shardyfusion.writer.phase.duration.publish", timedelta(seconds=0.25), {**tags, "phase": "publish"}),
    ]
