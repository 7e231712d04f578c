"""The job's output in the task log: its own progress lines, not Spark's INFO lines or pandas warnings.

The real operator runs the real job through spark-submit (local mode); the hook keeps the whole
output here (its tail is widened for the test).
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.hooks import spark_submit
from tests.operator_helpers import connections, make_context, make_op

pytestmark = pytest.mark.spark

# log4j2's console pattern of Spark ("25/11/26 14:00:00 INFO SparkContext: ...").
SPARK_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ")


def write(tmp_path, name: str, spark_conf: dict) -> list[str]:
    keys = list(range(40))
    (tmp_path / name).mkdir()
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64()), "payload": [f"v{k}" for k in keys]}),
                   tmp_path / name / "part-0.parquet")
    root = f"file://{tmp_path}/{name}-snap"
    op = make_op(root, input_path=f"file://{tmp_path}/{name}", num_dbs=2, aws_conn_id=None, poll_interval=1,
                 spark_conf={"spark.sql.shuffle.partitions": "2", **spark_conf})
    context = make_context()
    summary = op.execute(context)
    with ShardedReader(root, cache_dir=str(tmp_path / f"{name}-cache")) as reader:
        assert reader.get(7) == b"v7"
        # The local driver (and its UI) ended with the job: no link to a dead page.
        assert reader.manifest.writer["spark_ui_url"] is None
    assert context["ti"].xcoms["spark_app_id"] == {"spark_app_id": summary["spark_app_id"], "url": None}
    return op._launcher.tail_text().splitlines()


def test_the_job_logs_its_progress_and_spark_only_warnings(monkeypatch, tmp_path):
    connections(monkeypatch)
    monkeypatch.setattr(spark_submit, "OUTPUT_TAIL_LINES", 100_000)
    lines = write(tmp_path, "quiet", {})
    text = "\n".join(lines)
    for progress in ("read_input done", "shards written 2/2 (40 rows, ", "verify_routing checked", "published run"):
        assert progress in text, f"{progress!r} missing from the job's output:\n{text}"
    # The task log stamps each line: the job's own lines (local mode) carry no second timestamp.
    done = next(line for line in lines if "read_input done" in line)
    assert done.startswith("INFO shardyfusion.job: run ") and done.endswith("s") and "read_input done in" in done, done
    # The level applies once the SparkContext starts: its three version lines come before.
    applied = next(i for i, line in enumerate(lines) if "Setting Spark log level to \"WARN\"" in line)
    assert [line for line in lines[applied:] if SPARK_INFO.match(line)] == []
    assert len([line for line in lines[:applied] if SPARK_INFO.match(line)]) <= 3
    assert "FutureWarning" not in text
    # The level is a default: spark_conf sets another.
    loud = write(tmp_path, "loud", {"spark.log.level": "INFO"})
    assert len([line for line in loud if SPARK_INFO.match(line)]) > 20
