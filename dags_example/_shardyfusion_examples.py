"""Shared code of the example DAGs: input generation, look-up keys, the quickstart
DAG builder, and a consumer's wait for a published run.

Not a DAG file: it defines no DAG at import (``.airflowignore`` keeps the DAG processor
from parsing it at all). The DAG files import it from the DAGs folder, which Airflow
puts on ``sys.path``; copy it next to them when you copy an example into your own DAGs
folder.
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from airflow_provider_shardyfusion.sensors.current import CurrentSnapshotSensor

DEMO_DIR = os.path.abspath(
    os.environ.get("SHARDYFUSION_DEMO_DIR")
    or os.path.join(tempfile.gettempdir(), "shardyfusion-demo")
)
DEFAULT_ROWS = 100_000
NUM_DBS = 16
SAMPLE_KEYS_PER_RUN = 5


def snapshot_uri(dag_id: str) -> str:
    """Where the quickstart DAG ``dag_id`` publishes on the embedded default
    (``file://``)."""
    return f"file://{DEMO_DIR}/{dag_id}/snapshot"


def input_dir(dag_id: str, run_id: str) -> str:
    """The input folder of one DAG run (Airflow run ids hold ':' and '+': kept out of
    paths)."""
    return os.path.join(
        DEMO_DIR, dag_id, "input", re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
    )


def key_of(i: int) -> int:
    """Row ``i``'s key: spread out (not 0..n-1), non-negative as the default ``u64be``
    encoding needs."""
    return i * 7919 + 13


def payload_of(key: int) -> str:
    return f"payload-{key}"


def generate_input(
    path: str, rows: int = DEFAULT_ROWS, *, duplicate_keys: bool = False, files: int = 4
) -> str:
    """Write ``rows`` rows as ``files`` Parquet files into ``path`` (replaced); return
    ``path``."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    keys = [key_of(i) for i in range(rows)]
    if duplicate_keys and keys:
        keys.append(keys[len(keys) // 2])
    per_file = -(-len(keys) // files) if keys else 0
    for n in range(files):
        chunk = keys[n * per_file : (n + 1) * per_file]
        table = pa.table(
            {
                "id": pa.array(chunk, pa.int64()),
                "payload": pa.array([payload_of(k) for k in chunk], pa.string()),
            }
        )
        pq.write_table(table, os.path.join(path, f"part-{n:05d}.parquet"))
    return path


def sample_keys(rows: int) -> list[int]:
    picks = sorted({0, 1, rows // 2, rows - 1}) if rows else []
    return [key_of(i) for i in picks if 0 <= i < rows] + [
        7
    ]  # 7 is never written: a miss


def consumer_waits_for(
    task_id: str,
    output_uri: str,
    run_id: str,
    *,
    aws_conn_id: str | None,
    timeout: int = 600,
) -> CurrentSnapshotSensor:
    """A consumer's wait until ``_CURRENT`` names ``run_id`` (a template is fine): the
    task after a publish that proves readers now see that run. Deferrable, so the wait
    holds no worker slot; its XCom is the pointer it saw."""
    return CurrentSnapshotSensor(
        task_id=task_id,
        output_uri=output_uri,
        mode="run_id",
        run_id=run_id,
        deferrable=True,
        poll_interval=2,
        timeout=timeout,
        aws_conn_id=aws_conn_id,
    )


def build_quickstart_dag(
    dag_id: str,
    output_uri: str,
    *,
    aws_conn_id: str | None = "aws_default",
    description: str = "",
    spark_conn_id: str = "spark_default",
    spark_conf: dict[str, str] | None = None,
) -> DAG:
    with DAG(
        dag_id=dag_id,
        description=description
        or "Generate a table, publish a 16-shard RocksDB snapshot, read keys back",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["shardyfusion", "example"],
        params={
            "rows": Param(
                DEFAULT_ROWS, type="integer", minimum=0, description="rows to generate"
            ),
            "duplicate_keys": Param(
                False,
                type="boolean",
                description="repeat one key (the write must fail)",
            ),
        },
    ) as dag:

        @task
        def generate(
            params: dict[str, Any] | None = None, run_id: str | None = None
        ) -> str:
            params = params or {}
            # One folder per run: concurrent runs must not read (or delete) each other's
            # input. The scheme is explicit: a bare path would be refused (Spark's
            # default FS need not be local).
            return "file://" + generate_input(
                input_dir(dag_id, run_id or "manual"),
                int(params.get("rows", DEFAULT_ROWS)),
                duplicate_keys=bool(params.get("duplicate_keys")),
            )

        input_path = generate()

        write = ShardedWriteOperator(
            task_id="write_snapshot",
            output_uri=output_uri,
            input_path=input_path,
            input_format="parquet",
            key_column="id",
            value_column="payload",
            num_dbs=NUM_DBS,
            spark_conn_id=spark_conn_id,
            spark_conf=spark_conf
            if spark_conf is not None
            else {"spark.sql.shuffle.partitions": "16", "spark.ui.enabled": "false"},
            aws_conn_id=aws_conn_id,
        )

        @task
        def read_back(
            summary: dict[str, Any], params: dict[str, Any] | None = None
        ) -> dict[str, Any]:
            import logging

            from airflow_provider_shardyfusion.hooks.shardyfusion import (
                ShardyfusionHook,
            )

            log = logging.getLogger(__name__)
            keys = sample_keys(int((params or {}).get("rows", DEFAULT_ROWS)))
            with ShardyfusionHook(aws_conn_id=aws_conn_id).get_reader(
                summary["output_uri"]
            ) as reader:
                values = reader.multi_get(keys)
                run_id = reader.run_id
            found = {
                str(k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in zip(keys, values, strict=False)
            }
            for k, v in found.items():
                log.info("get(%s) -> %r", k, v)
            return {"run_id": run_id, "lookups": found}

        read_back(write.output)
    return dag
