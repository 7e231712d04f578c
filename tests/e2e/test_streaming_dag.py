"""Streaming ingestion under real Airflow (``dag.test()``) with real local Spark, file:// store (SPEC §14).

``dags_example/streaming_ingest.py``: two files land, the hourly ``available_now`` run publishes
them as batch 0 (full); a third file of updates, inserts and deletes lands, the next run publishes
exactly batch 1 (a delta). After each run the snapshot read back equals a model this test builds
on its own by applying the files in order.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion import ShardedReader
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})
DAG_ID = "shardyfusion_streaming_ingest"
STREAM = f"{DAG_ID}.ingest"


def land(folder, name: str, upserts: dict[int, str], deletes: list[int], model: dict[int, bytes]) -> None:
    """Write a file elsewhere, rename it into the folder, and apply it to the model."""
    keys = [*upserts, *deletes]
    table = pa.table({"id": pa.array(keys, pa.int64()), "payload": [upserts.get(k) for k in keys],
                      "deleted": pa.array([False] * len(upserts) + [True] * len(deletes), pa.bool_())})
    staged = folder.parent / f".{name}"
    pq.write_table(table, staged)
    os.replace(staged, folder / name)
    model.update({k: v.encode() for k, v in upserts.items()})
    for k in deletes:
        model.pop(k, None)


def assert_snapshot(root: str, model: dict[int, bytes], absent: list[int], cache) -> None:
    with ShardedReader(root, cache_dir=cache) as reader:
        keys = sorted(model)
        assert reader.multi_get(keys) == [model[k] for k in keys]
        assert reader.multi_get(absent) == [None] * len(absent)
        assert reader.manifest.row_count == len(model)


def test_hourly_available_now_runs_publish_each_increment_once(run_dag, tmp_path):
    env = {"SHARDYFUSION_DEMO_DIR": str(tmp_path), "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK}
    base = tmp_path / "shardyfusion_streaming"
    incoming = base / "incoming"
    incoming.mkdir(parents=True)
    root = f"file://{base}/snapshot"
    model: dict[int, bytes] = {}
    # One available_now run takes both files in one micro-batch: no key appears in both.
    land(incoming, "part-0000.parquet", {k: f"a{k}" for k in range(1, 21)}, [], model)
    land(incoming, "part-0001.parquet", {k: f"b{k}" for k in range(21, 31)}, [], model)

    first = run_dag(DAG_ID, extra_env=env, timeout=300)
    result = first.xcoms["ingest"]
    batch0 = f"{STREAM}-b{0:012d}"
    assert result["stream_id"] == STREAM and result["trigger"] == "available_now"
    assert result["batches"] == [{"batch_id": 0, "run_id": batch0, "action": "written", "rows": 30}]
    assert result["published"] == 1 and result["live_run_id"] == batch0
    assert first.xcoms["read_back"] == {"run_id": batch0, "rows": 30, "chain_depth": 0, "batches": [0]}
    assert_snapshot(root, model, [0, 31], tmp_path / "cache1")

    land(incoming, "part-0002.parquet", {5: "c5", 6: "c6", 40: "c40"}, [7, 8, 99], model)
    second = run_dag(DAG_ID, extra_env=env, timeout=300)
    result = second.xcoms["ingest"]
    batch1 = f"{STREAM}-b{1:012d}"
    assert [(b["batch_id"], b["run_id"], b["action"]) for b in result["batches"]] == [(1, batch1, "written")]
    assert result["published"] == 1 and result["live_run_id"] == batch1
    assert second.xcoms["read_back"]["run_id"] == batch1 and second.xcoms["read_back"]["chain_depth"] == 1
    assert_snapshot(root, model, [7, 8, 99, 0], tmp_path / "cache2")

    snapshots = SnapshotRoot(open_store(root))
    manifest = snapshots.read_manifest(snapshots.current())
    assert manifest.writer["stream_id"] == STREAM and manifest.writer["batch_id"] == 1
