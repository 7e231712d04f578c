"""The tier guards of tests/conftest.py, proven on a tiny inner suite run by pytester.

An unmarked test must fail naming its marker in every run (`make test` included), however it
reaches Spark or the S3 server: after a marked test in the same process, through
``request.getfixturevalue``, or with a client or address a marked test left behind.

The inner marked Spark test only imports pyspark: a real gateway takes about a minute to start on
the shared 2-core machine (measured while writing this), and the guard refuses at pyspark's entry
points before pyspark looks at its gateway, so whether one is up does not change the outcome. The
S3 server is the real one (moto on loopback), hence the 's3' marker.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiers import S3_MARKER_MESSAGE, SPARK_MARKER_MESSAGE

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]

INNER = '''
import os

import boto3
import pytest

LEFT_BEHIND = {}


def test_a_marked_s3_test_reads_back_what_it_wrote(s3_server, s3_root):
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    bucket = s3_root.split("/")[2]
    client.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    LEFT_BEHIND.update(client=client, url=s3_server, bucket=bucket)


def test_b_unmarked_asks_for_the_server(request):
    request.getfixturevalue("s3_server")


def test_c_unmarked_reuses_the_pooled_client():
    LEFT_BEHIND["client"].get_object(Bucket=LEFT_BEHIND["bucket"], Key="k")


def test_d_unmarked_opens_a_client_on_the_left_address():
    boto3.client("s3", endpoint_url=LEFT_BEHIND["url"], region_name="us-east-1").list_buckets()


@pytest.mark.spark
def test_e_marked_spark_test_gets_the_real_entry_points():
    from pyspark.core.context import SparkContext
    from pyspark.sql import SparkSession

    assert "shardyfusion-no-spark-" not in os.environ.get("SPARK_HOME", "")
    assert SparkSession.Builder.getOrCreate.__module__ == "pyspark.sql.session"
    assert SparkContext._ensure_initialized.__module__ == "pyspark.core.context"


@pytest.mark.parametrize("way", ["builder", "context", "context_get", "active"])
def test_f_unmarked_spark_after_a_marked_one(way):
    from pyspark.core.context import SparkContext
    from pyspark.sql import SparkSession

    assert "shardyfusion-no-spark-" in os.environ["SPARK_HOME"]
    if way == "builder":
        SparkSession.builder.master("local[1]").getOrCreate()
    elif way == "context":
        SparkContext("local[1]", "unmarked")
    elif way == "context_get":
        SparkContext.getOrCreate()
    else:
        SparkSession.getActiveSession()
'''


@pytest.mark.s3
def test_unmarked_tests_fail_naming_their_marker_and_marked_ones_pass(pytester, monkeypatch):
    pytester.makeini("[pytest]\nmarkers =\n    spark: Spark\n    s3: S3 server\n    airflow: Airflow\n")
    pytester.makepyfile(test_inner=INNER)
    # The inner run is a pytest of its own: its guard sets SPARK_HOME per test, from a clean start.
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                              if "shardyfusion-no-spark-" not in p))
    monkeypatch.setenv("COLUMNS", "1000")  # the short summary keeps the whole failure message
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("-p", "tests.conftest", "-p", "no:cacheprovider", "-rf", "-q")

    result.assert_outcomes(passed=2, failed=7)
    s3_failures = ["b_unmarked_asks_for_the_server", "c_unmarked_reuses_the_pooled_client",
                   "d_unmarked_opens_a_client_on_the_left_address"]
    spark_failures = [f"f_unmarked_spark_after_a_marked_one[{way}]"
                      for way in ("builder", "context", "context_get", "active")]
    result.stdout.fnmatch_lines_random(
        [f"FAILED test_inner.py::test_{name} - Failed: {S3_MARKER_MESSAGE}" for name in s3_failures]
        + [f"FAILED test_inner.py::test_{name} - Failed: {SPARK_MARKER_MESSAGE}" for name in spark_failures])
