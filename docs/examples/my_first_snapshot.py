"""Your first snapshot DAG: make a small table, write it as 4 shards, validate, publish,
read back.

Copy this file into your DAGs folder and run ``airflow dags test my_first_snapshot``
(the steps are in docs/getting-started.md; tests/e2e/test_getting_started.py runs them
exactly as written). Everything lands under ``$AIRFLOW_HOME/my_first_snapshot/``: the
input Parquet file and the snapshot root.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from airflow_provider_shardyfusion.operators.validate import ValidateManifestOperator

HOME = os.path.abspath(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
)
INPUT = os.path.join(HOME, "my_first_snapshot", "input")
ROOT = "file://" + os.path.join(
    HOME, "my_first_snapshot", "snapshot"
)  # or s3://bucket/prefix
ROWS = 1000
RUN_ID = "{{ ti.xcom_pull(task_ids='write')['run_id'] }}"

with DAG(
    dag_id="my_first_snapshot",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
):

    @task
    def make_input() -> str:
        import pyarrow as pa
        import pyarrow.parquet as pq

        os.makedirs(INPUT, exist_ok=True)
        table = pa.table(
            {
                "user_id": pa.array(range(ROWS), pa.int64()),
                "name": [f"user-{i}" for i in range(ROWS)],
                "tier": ["gold" if i % 10 == 0 else "basic" for i in range(ROWS)],
            }
        )
        pq.write_table(table, os.path.join(INPUT, "part-00000.parquet"))
        return "file://" + INPUT

    # Staged (publish=False): the snapshot is written but readers keep the previous one
    # until the validation passed and publish moved the _CURRENT pointer.
    write = ShardedWriteOperator(
        task_id="write",
        input_path=make_input(),
        input_format="parquet",
        key_column="user_id",
        value_columns=["name", "tier"],
        value_format="json",
        num_dbs=4,
        output_uri=ROOT,
        publish=False,
        aws_conn_id=None,
        spark_conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"},
    )
    validate = ValidateManifestOperator(
        task_id="validate",
        output_uri=ROOT,
        run_id=RUN_ID,
        min_rows=ROWS,
        max_empty_shards=0,
        expected_keys=[0, 42, ROWS - 1],
        absent_keys=[ROWS],
        aws_conn_id=None,
    )
    publish = PublishSnapshotOperator(
        task_id="publish", output_uri=ROOT, run_id=RUN_ID, aws_conn_id=None
    )

    @task
    def read_back() -> dict:
        from airflow_provider_shardyfusion import ShardedReader

        with ShardedReader(ROOT) as reader:
            value = reader.get(42)
        if value != {"name": "user-42", "tier": "basic"}:
            raise ValueError(f"get(42) read {value!r}")
        return value

    write >> validate >> publish >> read_back()
