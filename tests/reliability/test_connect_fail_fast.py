"""A Spark Connect write whose server is down, dies mid-write, or is set up wrongly fails fast and clearly.

Real parts: a Spark Connect server started as its own process on loopback (its whole process group
is killed with SIGKILL mid-write), the operator running the job as a Connect client child process,
real run records and snapshot folders. Nothing listens on the "down" server's port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, ShardyfusionError, SparkConnectError
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.run_record import read_run_record
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.write import job_environment as job_env
from airflow_provider_shardyfusion.submission.bundle import build_bundle
from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, encode_config
from tests.fault_env import set_faults
from tests.operator_helpers import connections, execute_in_thread, make_context, make_op
from tests.polling import wait_for
from tests.processes import free_port
from tests.spark_connect_server import connect_server_process
from tests.spark_helpers import int_table, write_parquet

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def doomed_server(tmp_path_factory):
    """A Connect server of this module only: its last test kills it."""
    with connect_server_process(tmp_path_factory.mktemp("doomed")) as (port, proc):
        yield port, proc


def timed_execute(monkeypatch, tmp_path, spark_conn: dict, root: str) -> tuple[ShardyfusionError, float]:
    connections(monkeypatch, spark=spark_conn)
    table, _ = int_table(20)
    op = make_op(root, aws_conn_id=None, input_path="file://" + write_parquet(tmp_path, table), num_dbs=2)
    started = time.monotonic()
    with pytest.raises(ShardyfusionError) as caught:
        op.execute(make_context())
    return caught.value, time.monotonic() - started


def test_a_server_that_is_down_fails_the_task_within_seconds(monkeypatch, tmp_path, figure):
    port = free_port()  # nothing listens there
    root = f"file://{tmp_path}/down"
    error, seconds = timed_execute(monkeypatch, tmp_path, {"conn_type": "spark_connect", "host": "127.0.0.1",
                                                           "port": port}, root)
    assert isinstance(error, SparkConnectError), repr(error)
    text = str(error)
    for part in ("'sf_spark'", f"127.0.0.1:{port}", "refused the connection", "gRPC UNAVAILABLE", "Connection refused"):
        assert part in text, text
    assert "did not answer" not in text  # a refusal is an answer
    assert "spark-submit" not in text
    assert seconds < 15
    assert list(open_store(root).list("")) == []  # checked before anything was written
    figure(seconds_to_error=f"{seconds:.1f}", objects_written=0)


def test_the_job_process_reports_the_cause_and_exits_when_the_server_goes_away(tmp_path, figure):
    """The job's own view (the server vanished between the task's check and the job's start): bounded,
    logged retries, then one verdict line with the gRPC cause, then the process exits."""
    table, _ = int_table(20)
    config = build_write_config(output_uri=f"file://{tmp_path}/gone", input_path="file://" + write_parquet(tmp_path, table),
                                key_column="id", value_column="payload", num_dbs=2)
    bundle = build_bundle()
    started = time.monotonic()
    job = subprocess.run(
        [sys.executable, bundle.entry_script, CONFIG_ARG, encode_config(config.to_json())], capture_output=True,
        text=True, env={**os.environ, job_env.REMOTE_URL: f"sc://127.0.0.1:{free_port()}",
                        job_env.BUNDLE: bundle.zip_path, "PYTHONPATH": bundle.zip_path}, cwd=str(tmp_path),
        timeout=120)
    seconds = time.monotonic() - started
    (verdict,) = [line for line in job.stderr.splitlines() if line.startswith("shardyfusion job failed:")]
    assert job.returncode == 2, job.stderr[-3000:]
    assert verdict.startswith("shardyfusion job failed: SparkConnectError: could not open the Spark session")
    assert "gRPC UNAVAILABLE" in verdict and "Connection refused" in verdict, verdict
    retries = job.stderr.count("Spark Connect server did not answer")
    assert retries == 5 and "Spark Connect server gone: no answer after 5 retries" in job.stderr
    assert seconds < 60
    figure(retries_logged=retries, seconds_to_exit=f"{seconds:.1f}", exit_code=job.returncode)


def test_bad_connection_settings_are_config_errors_before_anything_is_written(monkeypatch, tmp_path, doomed_server,
                                                                               figure):
    port, _ = doomed_server
    plain = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}
    cases = {
        "use_ssl": ({**plain, "extra": {"use_ssl": "maybe"}}, "\"use_ssl\": 'maybe'"),
        "scheme": ({**plain, "host": "https://127.0.0.1"}, "not https://"),
        "token": ({**plain, "password": "tok-3f9a"}, f"the server at 127.0.0.1:{port} speaks plain text"),
    }
    slowest = 0.0
    for name, (conn, expected) in cases.items():
        root = f"file://{tmp_path}/{name}"
        error, seconds = timed_execute(monkeypatch, tmp_path, conn, root)
        assert isinstance(error, ConfigError) and expected in str(error), (name, error)
        assert "'sf_spark'" in str(error) and "tok-3f9a" not in str(error)
        assert list(open_store(root).list("")) == [], name
        slowest = max(slowest, seconds)
    assert slowest < 15
    figure(settings_refused=len(cases), slowest_refusal_s=f"{slowest:.1f}", objects_written=0)


def test_a_server_killed_mid_write_fails_the_run_within_a_minute(monkeypatch, tmp_path, doomed_server, figure):
    """Runs last in this module: it kills the module's server."""
    port, server = doomed_server
    table, _ = int_table(2_000)
    marker = tmp_path / "held.pid"
    set_faults(monkeypatch, {"hold_shard_write": {
        "db_id": 1, "attempt": 0, "marker": str(marker), "release": str(tmp_path / "never"), "seconds": 600}})
    connections(monkeypatch, spark={"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})
    root = f"file://{tmp_path}/killed"
    op = make_op(root, aws_conn_id=None, input_path="file://" + write_parquet(tmp_path, table), num_dbs=4, run_id="run-lost")
    task, outcome = execute_in_thread(op)
    wait_for(marker.exists, 180, "a shard write to be held on the Connect server")
    os.killpg(server.pid, signal.SIGKILL)
    killed = time.monotonic()
    task.join(timeout=120)
    seconds = time.monotonic() - killed
    if task.is_alive():  # the unfixed client: stop it so the module can end
        op.on_kill()
    assert not task.is_alive() and "error" in outcome, outcome
    assert seconds < 60
    error = outcome["error"]
    assert error.error_type == SparkConnectError.__name__ and "gRPC UNAVAILABLE" in str(error), repr(error)
    record = read_run_record(open_store(root), "run-lost")
    assert record.status == "failed" and record.error.type == SparkConnectError.__name__, record.to_dict()
    assert "stopped answering" in record.error.message and "nothing was published" in record.error.message
    assert SnapshotRoot(open_store(root)).current() is None
    figure(servers_killed=1, seconds_to_failed_run=f"{seconds:.1f}", record=record.status, pointer_moves=0)


def test_a_server_stopped_gracefully_mid_write_fails_the_run_as_server_lost(monkeypatch, tmp_path, capfd, figure):
    """A Connect server stopped with SIGTERM (its shutdown hook stops the SparkContext under the query
    in flight, which answers with three JVM traces): one SparkConnectError saying the server was lost
    mid-write, with the server's first line only. A server of its own (about 15 s to start)."""
    table, _ = int_table(2_000)
    marker = tmp_path / "held.pid"
    set_faults(monkeypatch, {"hold_shard_write": {
        "db_id": 1, "attempt": 0, "marker": str(marker), "release": str(tmp_path / "never"), "seconds": 600}})
    root = f"file://{tmp_path}/stopped"
    with connect_server_process(tmp_path) as (port, server):
        connections(monkeypatch, spark={"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})
        op = make_op(root, aws_conn_id=None, input_path="file://" + write_parquet(tmp_path, table), num_dbs=4,
                     run_id="run-stopped")
        task, outcome = execute_in_thread(op)
        wait_for(marker.exists, 180, "a shard write to be held on the Connect server")
        capfd.readouterr()  # the task's log from here on: what the stop made it say
        server.send_signal(signal.SIGTERM)  # the JVM itself (spark-submit execs it): a graceful stop
        stopped = time.monotonic()
        task.join(timeout=120)
        seconds = time.monotonic() - stopped
        if task.is_alive():
            op.on_kill()
    assert not task.is_alive() and "error" in outcome, outcome
    error = outcome["error"]
    assert error.error_type == SparkConnectError.__name__, repr(error)
    record = read_run_record(open_store(root), "run-stopped")
    assert record.status == "failed" and record.error.type == SparkConnectError.__name__, record.to_dict()
    message = record.error.message
    assert message.startswith("the Spark Connect server was stopped while the job ran (server lost mid-write: "), message
    assert "stopped SparkContext" in message and "nothing was published" in message, message
    assert "\n" not in message and "JVM stacktrace" not in message and "org.apache.spark" not in message, message
    assert str(error).count("server lost mid-write") == 1, str(error)
    log = capfd.readouterr()
    said = log.out + log.err
    # Before: the run record's log line, the job's verdict and the traceback tail each carried the JVM traces.
    assert "org.apache.spark" not in said and "JVM stacktrace" not in said, said[-5000:]
    verdict = said.index("shardyfusion job failed: SparkConnectError: the Spark Connect server was stopped")
    # The client may retry while the server goes down; once the verdict is out, nothing retries a stopped server.
    assert "Spark Connect server did not answer" not in said[verdict:], said[verdict:]
    assert SnapshotRoot(open_store(root)).current() is None
    assert seconds < 60
    figure(servers_stopped=1, seconds_to_failed_run=f"{seconds:.1f}", record=record.status, pointer_moves=0)
