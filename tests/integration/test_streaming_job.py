"""``spark_jobs/streaming_job.py`` run as its own process, as spark-submit runs it (SPEC §14).

Files of upserts and deletes arrive between two ``available_now`` runs over one checkpoint; after
each run the snapshot equals a model and the job's report lists exactly the batches it published.
A query option ``asyncProgressTrackingEnabled`` is refused before any query starts. A
``processing_time`` query stops after the batch in progress on SIGTERM or the stop object, and
``StreamingSnapshotOperator.on_kill`` (what Airflow calls when the task is stopped) stops a real
spark-submit's query that way, ``execute`` then returning the batches published.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.stream.job import StreamSettings, encode_job_config, report_key
from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator
from tests.operator_helpers import connections, make_context
from tests.stream_files import put_changes

JOB = Path(__file__).resolve().parents[2] / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts" / "streaming_job.py"
STREAM = "orders.job"

pytestmark = pytest.mark.spark  # the job runs through spark-submit, which no fixture shows


def run_job(root: str, source: Path, checkpoint: Path, report_id: str, **stream_kw) -> subprocess.CompletedProcess:
    config = build_write_config(output_uri=root, input_path=str(source), key_column="id", value_column="payload",
                                num_dbs=3, write_mode="delta", delete_column="deleted")
    stream = StreamSettings(stream_id=STREAM, checkpoint_location=str(checkpoint), report_id=report_id,
                            source_path=str(source), **stream_kw).validate()
    arg = base64.urlsafe_b64encode(encode_job_config(config, stream).encode()).decode()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run([sys.executable, str(JOB), "--config-b64", arg], capture_output=True, text=True,
                          timeout=240, env=env, check=False)


def read_report(root: str, report_id: str) -> dict:
    return json.loads(SnapshotRoot.open(root).store.get(report_key(STREAM, report_id)).data)


def check_model(root: str, model: dict[int, str], absent: list[int]) -> None:
    reader = ShardedReader(root)
    keys = sorted(model)
    assert reader.multi_get(keys) == [model[k].encode() for k in keys]
    assert reader.multi_get(absent) == [None] * len(absent)


@pytest.mark.timeout(400)
def test_two_available_now_runs_publish_the_new_files_once(tmp_path):
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()
    root = layout.normalize_root(str(tmp_path / "root"))
    put_changes(source, 0, {1: "a", 2: "b", 3: "c"})
    put_changes(source, 1, {4: "d"}, deletes=[2])
    one_file = {"maxFilesPerTrigger": "1"}  # one batch per file: the files' order is the batches' order
    done = run_job(root, source, checkpoint, "first", source_options=one_file)
    assert done.returncode == 0, done.stderr[-3000:]
    first = read_report(root, "first")
    assert first["finished"] is True and first["error"] is None
    assert [(b["batch_id"], b["action"], b["run_id"]) for b in first["batches"]] == [
        (0, "written", f"{STREAM}-b{0:012d}"), (1, "written", f"{STREAM}-b{1:012d}")]
    assert first["batches"][0]["rows"] == 3
    assert "SHARDYFUSION_STREAM_RESULT" in done.stderr
    check_model(root, {1: "a", 3: "c", 4: "d"}, [2])

    put_changes(source, 2, {5: "e", 1: "a2"}, deletes=[3])
    done = run_job(root, source, checkpoint, "second", source_options=one_file)
    assert done.returncode == 0, done.stderr[-3000:]
    second = read_report(root, "second")
    assert [(b["batch_id"], b["action"], b["run_id"]) for b in second["batches"]] == [
        (2, "written", f"{STREAM}-b{2:012d}")]
    check_model(root, {1: "a2", 4: "d", 5: "e"}, [2, 3])
    assert SnapshotRoot.open(root).current().run_id == f"{STREAM}-b{2:012d}"


def test_async_progress_tracking_is_refused_before_the_query(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    root = layout.normalize_root(str(tmp_path / "root"))
    done = run_job(root, source, tmp_path / "cp", "r", source_options={"asyncProgressTrackingEnabled": "true"})
    assert done.returncode == 2
    assert "async progress tracking" in done.stderr
    assert SnapshotRoot.open(root).current() is None


@pytest.mark.timeout(400)
@pytest.mark.parametrize("how", ["stop_object", "sigterm"])
def test_a_processing_time_query_stops_gracefully(tmp_path, how):
    from airflow_provider_shardyfusion.core.stream.job import stop_key

    source = tmp_path / "source"
    source.mkdir()
    root = layout.normalize_root(str(tmp_path / "root"))
    put_changes(source, 0, {1: "a", 2: "b"})
    config = build_write_config(output_uri=root, input_path=str(source), key_column="id", value_column="payload",
                                num_dbs=2, write_mode="delta", delete_column="deleted")
    stream = StreamSettings(stream_id=STREAM, checkpoint_location=str(tmp_path / "cp"), report_id="cont",
                            source_path=str(source), trigger="processing_time", processing_time="1 second")
    arg = base64.urlsafe_b64encode(encode_job_config(config, stream.validate()).encode()).decode()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    log_path = tmp_path / "job.log"
    with log_path.open("w") as log_file:  # a file, not a pipe: a full pipe would block the job
        proc = subprocess.Popen([sys.executable, str(JOB), "--config-b64", arg], env=env, stderr=log_file)
    store = SnapshotRoot.open(root).store
    deadline = time.monotonic() + 180
    while not store.exists(report_key(STREAM, "cont")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
    put_changes(source, 1, {3: "c"}, deletes=[1])
    while len(read_report(root, "cont")["batches"]) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        store.put(stop_key(STREAM, "cont"), b"{}")
    proc.wait(timeout=120)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    report = read_report(root, "cont")
    assert report["finished"] is True and report["error"] is None, report
    assert [b["batch_id"] for b in report["batches"] if b["action"] == "written"] == [0, 1]
    check_model(root, {2: "b", 3: "c"}, [1])


@pytest.mark.timeout(400)
def test_on_kill_stops_a_processing_time_query_after_its_batch(monkeypatch, tmp_path):
    connections(monkeypatch)
    source = tmp_path / "source"
    source.mkdir()
    root = layout.normalize_root(str(tmp_path / "root"))
    put_changes(source, 0, {1: "a", 2: "b"})
    op = StreamingSnapshotOperator(
        task_id="ingest", output_uri=root, source_path=f"file://{source}", checkpoint_location=str(tmp_path / "cp"),
        trigger="processing_time", processing_time="1 second", key_column="id", value_column="payload",
        delete_column="deleted", num_dbs=2, spark_conn_id="sf_spark", stop_timeout=90,
        spark_conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    ctx = {**make_context(), "outlet_events": OutletEventAccessors()}
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = op.execute(ctx)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    store = SnapshotRoot.open(root).store
    stream = None
    deadline = time.monotonic() + 240

    def written() -> int:
        nonlocal stream
        stream = stream or op._stream
        if stream is None or not store.exists(report_key(stream.stream_id, stream.report_id)):
            return 0
        report = json.loads(store.get(report_key(stream.stream_id, stream.report_id)).data)
        return sum(b["action"] == "written" for b in report["batches"])

    while written() < 1 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(1)
    put_changes(source, 1, {3: "c"}, deletes=[1])
    while written() < 2 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(1)
    assert thread.is_alive(), outcome
    op.on_kill()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert [(b["batch_id"], b["action"]) for b in result["batches"]] == [(0, "written"), (1, "written")]
    assert result["live_run_id"] == f"{stream.stream_id}-b{1:012d}"
    reader = ShardedReader(root, cache_dir=tmp_path / "cache")
    assert reader.multi_get([1, 2, 3]) == [None, b"b", b"c"]
