"""The door to the OpenTelemetry metrics API (SPEC §19), optional everywhere ``core`` runs.

Airflow installs ``opentelemetry-api``; a Spark driver or a bare service may not have it. The API
alone is a no-op until an SDK's ``MeterProvider`` is set, so the provider reports nothing unless its
user configured metrics; without the API at all, ``meter()`` answers None and callers skip metrics.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["meter"]


def meter(name: str, meter_provider: Any = None) -> Any:
    """The meter ``name`` of ``meter_provider`` (None: the global one), or None without the OTel API."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    return provider.get_meter(name, _own_version())


# The same modules ship in the provider and in the reader-only distribution (reader/pyproject.toml).
_DISTRIBUTIONS = ("airflow-provider-shardyfusion", "shardyfusion-reader")


def _own_version() -> str | None:
    for name in _DISTRIBUTIONS:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None  # a source checkout that was never installed
