"""How the job names a Spark Connect server lost under a write or a stream (SPEC §15).

The error is the one a real Connect server (Spark 4.2, ``local[2,2]``) answered when it was stopped
with SIGTERM while a shard write ran: pyspark's own ``UnknownException``, built here with the reason
and message captured from that run (its JVM traces shortened to their first and last lines). The
live case is ``tests/reliability/test_connect_fail_fast.py``; this pins the classification.
"""

from __future__ import annotations

from pyspark.errors.exceptions.connect import UnknownException

from airflow_provider_shardyfusion.core.errors import SparkConnectError
from airflow_provider_shardyfusion.spark_jobs.errors import connect_server_lost, translate
from airflow_provider_shardyfusion.spark_jobs.streaming_job import _failure

STOPPED_MESSAGE = """Cannot call methods on a stopped SparkContext.
This stopped SparkContext was created at:

org.apache.spark.sql.connect.service.SparkConnectServer.main(SparkConnectServer.scala)
org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)

And it was stopped at:

org.apache.spark.util.SparkShutdownHookManager$$anon$2.run(ShutdownHookManager.scala:184)
java.base/java.lang.Thread.run(Thread.java:840)

The currently active SparkContext was created at:

org.apache.spark.sql.connect.service.SparkConnectServer.main(SparkConnectServer.scala)
org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)
         """
FIRST_LINE = "(java.lang.IllegalStateException) Cannot call methods on a stopped SparkContext."


def stopped_server_error() -> UnknownException:
    return UnknownException(STOPPED_MESSAGE, reason="java.lang.IllegalStateException")


def test_a_stopped_server_is_one_line_saying_it_was_lost_mid_write():
    error = stopped_server_error()
    assert str(error).startswith(FIRST_LINE)  # what the run record said before: this, then the traces
    translated = translate(error)
    assert isinstance(translated, SparkConnectError)
    assert str(translated) == (
        f"the Spark Connect server was stopped while the job ran (server lost mid-write: {FIRST_LINE}); "
        "nothing was published. Run the write again once the server is back")
    # Raised from another error (the driver's own wrapping) it is found all the same.
    wrapped = RuntimeError("shard write failed")
    wrapped.__cause__ = error
    assert isinstance(translate(wrapped), SparkConnectError)


def test_a_stream_over_a_stopped_server_ends_with_the_same_verdict():
    assert _failure(stopped_server_error()) == (
        "SparkConnectError", f"the Spark Connect server was stopped while the job ran (server lost mid-write: {FIRST_LINE})")


def test_the_same_words_from_a_classic_job_or_another_connect_error_are_not_a_lost_server():
    # A classic (spark-submit) job whose SparkContext stopped has lost its own JVM, not a Connect server.
    assert connect_server_lost(RuntimeError(STOPPED_MESSAGE)) is None
    assert connect_server_lost(UnknownException("Table or view not found: lake.profiles")) is None
    assert translate(RuntimeError(STOPPED_MESSAGE)).__class__ is RuntimeError
