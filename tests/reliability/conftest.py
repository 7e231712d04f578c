"""Reliability suite helpers: each test reports one figure line, printed again in the run summary."""

from __future__ import annotations

import pytest

from tests.figures import PROPERTY


@pytest.fixture
def figure(request):
    """``figure(requests_faulted=…, retries_seen=…, rows_checked=…)``: print and keep one line."""

    def report(**numbers: object) -> str:
        line = f"FIGURE {request.node.name}: " + ", ".join(f"{k.replace('_', ' ')}={v}" for k, v in numbers.items())
        print(line)
        # On the test's report: the summary (tests/conftest.py) then sees xdist workers' figures too.
        request.node.user_properties.append((PROPERTY, line))
        return line

    return report


@pytest.fixture(scope="module")
def spark():
    """A local Spark session for the streaming ownership tests (one per module)."""
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("shardyfusion-stream-ownership")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
