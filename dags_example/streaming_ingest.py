"""Streaming ingestion: every hour, the files that arrived since the last run become one
published delta (SPEC §14).

``shardyfusion_streaming_ingest`` (hourly) runs a Structured Streaming query with
``trigger="available_now"`` over ``<demo dir>/shardyfusion_streaming/incoming``: it
processes every file new since the previous run (the checkpoint remembers which),
publishes each micro-batch as a delta on the live snapshot (the first one full), and
stops. One scheduled task, one increment:

    ingest (StreamingSnapshotOperator) → read_back

The files hold ``id`` (the key), ``payload`` (the value) and ``deleted`` (true: the row
deletes its key). Drop new files into the folder atomically (write elsewhere, then
rename into it). The batch id is the idempotency key: a retried task skips what is
already live and rewrites what failed, so no file is applied twice or lost. The stream
id is ``<dag_id>.<task_id>``; keep it and the checkpoint together.

Spark comes from ``spark_default`` (see the quickstart). The demo dir is
``$SHARDYFUSION_DEMO_DIR`` or ``<tmp>/shardyfusion-demo``.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_shardyfusion.operators.streaming_snapshot import (
    StreamingSnapshotOperator,
)

DEMO_DIR = os.path.abspath(
    os.environ.get("SHARDYFUSION_DEMO_DIR")
    or os.path.join(tempfile.gettempdir(), "shardyfusion-demo")
)
BASE = os.path.join(DEMO_DIR, "shardyfusion_streaming")
INCOMING = os.path.join(BASE, "incoming")
CHECKPOINT = os.path.join(BASE, "checkpoint")
OUTPUT_URI = f"file://{BASE}/snapshot"
NUM_DBS = 4
SCHEMA = "id LONG, payload STRING, deleted BOOLEAN"

with DAG(
    dag_id="shardyfusion_streaming_ingest",
    description=(
        "Hourly: the new files of a folder → one published delta per micro-batch"
    ),
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one query per stream (and per checkpoint) at a time
    tags=["shardyfusion", "example", "streaming"],
) as dag:

    @task
    def make_folders() -> str:
        os.makedirs(INCOMING, exist_ok=True)
        return INCOMING

    ingest = StreamingSnapshotOperator(
        task_id="ingest",
        output_uri=OUTPUT_URI,
        source_path=f"file://{INCOMING}",
        source_format="parquet",
        # The folder may be empty on the first run: no schema to read from files.
        source_schema=SCHEMA,
        checkpoint_location=CHECKPOINT,
        trigger="available_now",
        key_column="id",
        value_column="payload",
        delete_column="deleted",
        num_dbs=NUM_DBS,
        max_chain_depth=8,
        spark_conf={
            "spark.sql.shuffle.partitions": str(NUM_DBS),
            "spark.ui.enabled": "false",
        },
    )

    @task
    def read_back(result: dict[str, Any]) -> dict[str, Any]:
        """The live snapshot after the ingest: its run, rows and chain depth."""
        from airflow_provider_shardyfusion import ShardedReader

        with ShardedReader(OUTPUT_URI) as reader:
            manifest = reader.manifest
            return {
                "run_id": manifest.run_id,
                "rows": manifest.row_count,
                "chain_depth": manifest.chain_depth,
                "batches": [b["batch_id"] for b in result["batches"]],
            }

    make_folders() >> ingest
    read_back(ingest.output)
