"""A DAG that must fail: its write names a column its input does not have (``make try`` e2e test).

The write is refused before Spark starts (``core.write.input_check``), so the DAG runs in seconds.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator

BASE = os.path.join(os.environ.get("SHARDYFUSION_DEMO_DIR", "/tmp/shardyfusion-demo"), "typo")

with DAG(dag_id="shardyfusion_try_typo", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:

    @task
    def make_input() -> str:
        import pyarrow as pa
        import pyarrow.parquet as pq

        os.makedirs(BASE, exist_ok=True)
        pq.write_table(pa.table({"id": [1, 2], "payload": ["a", "b"]}), os.path.join(BASE, "part-0.parquet"))
        return f"file://{BASE}"

    ShardedWriteOperator(task_id="write", output_uri=f"file://{BASE}-snapshot", input_path=make_input(),
                         key_column="id", value_column="paylod", num_dbs=2)
