"""Test tiers: which real parts a test uses, so ``-m "not s3"`` (and spark, airflow) means what it says.

Markers come from the fixtures a test really requests (the S3 server, a Spark session, a migrated
Airflow), so a new test is placed in its tier without anyone remembering a marker. A test that
reaches a part its tier excludes by another road (``request.getfixturevalue``, a helper that runs
spark-submit) is caught by the guards in ``tests/conftest.py`` and fails naming the marker it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

# Fixture name → marker of the real part it starts.
FIXTURE_MARKERS = {
    "s3_server": "s3",
    "spark": "spark",
    "speculative_spark": "spark",
    "standalone_master": "spark",
    "connect_conn": "spark",
    "thin_server": "spark",
    "airflow_env": "airflow",
    "run_dag": "airflow",
}
# A parametrized test whose store parameter is "s3" talks to the S3 server in that case only.
S3_PARAM_VALUES = frozenset({"s3"})


def markers_for(fixturenames: list[str] | tuple[str, ...], params: dict[str, object]) -> set[str]:
    found = {marker for name, marker in FIXTURE_MARKERS.items() if name in fixturenames}
    if any(isinstance(value, str) and value in S3_PARAM_VALUES for value in params.values()):
        found.add("s3")
    return found


def excluded_parts(markexpr: str) -> set[str]:
    """The parts a ``-m`` expression leaves out, read from its ``not <marker>`` terms."""
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return {words[i + 1] for i, word in enumerate(words[:-1]) if word == "not" and words[i + 1] in {"s3", "spark", "airflow"}}


def write_spark_refusal(folder: Path) -> Path:
    """A SPARK_HOME whose launchers refuse to start: a test that runs Spark unmarked fails saying so."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    message = "this test runs Spark but is not marked 'spark': add pytest.mark.spark (tests/tiers.py)"
    for name in ("spark-submit", "spark-class", "pyspark"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"{message}\" >&2\nexit 3\n")
        script.chmod(0o755)
    return folder
