"""Promise: cleanup never deletes a layer a kept run's chain reads, whatever records are missing or damaged.

A real chain (Spark local mode): a full base, a live delta on it, later a staged delta on that and a
full run published over both. Then the base's run record is deleted, then damaged, and the staged
delta's manifest is deleted; at each step cleanup runs with its defaults (``keep_runs=3``, 1 h
grace; planned two hours ahead so every object is past the grace) or ``keep_runs=2``. Nothing any
kept chain reads is deleted, each kept run is reported with the run that keeps it, and readers of
every chain read back exactly.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.integration import test_delta
from tests.spark_helpers import run, write_parquet

pytestmark = pytest.mark.spark
spark = test_delta.spark  # the same module-scoped local session fixture
LATER = timedelta(hours=2)  # planned as if two hours from now: everything written is past the 1 h grace


def write(spark, tmp_path, root, run_id, rows: dict[int, str], deletes=(), **kw) -> None:
    keys = [*rows, *deletes]
    table = {"id": pa.array(keys, pa.int64()), "payload": [rows.get(k) for k in keys]}
    args = {"output_uri": root, "key_column": "id", "value_column": "payload", "run_id": run_id, **kw}
    if kw.get("write_mode") == "delta":
        table["gone"] = pa.array([k in deletes for k in keys], pa.bool_())
        args["delete_column"] = "gone"
    else:
        args["num_dbs"] = 3
    run(spark, input_path=write_parquet(tmp_path, pa.table(table), run_id), **args)


def read_back(root, manifest_ref, model: dict[int, bytes], cache) -> int:
    with ShardedReader(root, manifest_ref=manifest_ref, cache_dir=cache) as reader:
        keys = sorted(model)
        assert reader.multi_get(keys) == [model[k] for k in keys]
        assert reader.manifest.row_count == len(model)
    return len(keys)


def test_cleanup_keeps_a_chain_whose_records_or_manifests_are_missing(spark, tmp_path, figure):
    root = f"file://{tmp_path}/snap"
    store = open_store(root)
    snapshots = SnapshotRoot(store)
    base = {k: f"base-{k}" for k in range(120)}
    write(spark, tmp_path, root, "r1-base", base)
    change = {k: f"d1-{k}" for k in range(0, 120, 5)}
    write(spark, tmp_path, root, "r2-delta", change, deletes=[1, 2], write_mode="delta")
    d1_model = {k: v.encode() for k, v in ({**base, **change}).items() if k not in (1, 2)}

    def shard_keys(run_id):
        return sorted(o.key for o in store.list(layout.shards_prefix(run_id)))

    base_layers = shard_keys("r1-base")
    assert base_layers
    record_key = layout.run_record_key("r1-base")
    record_bytes = store.get(record_key).data
    kept_with_keeper = deleted_from_chain = rows = 0

    # The base's record missing: its folder looks like an orphan, but the live delta reads it.
    store.delete_many([record_key])
    plan = make_plan(snapshots, now=layout.utc_now() + LATER)
    assert "r1-base" not in {i.run_id for i in plan.items}, plan.to_dict()
    reason = {s.run_id: s.reason for s in plan.skipped}["r1-base"]
    assert reason == "no run record, but its layers are read by kept run r2-delta", reason
    kept_with_keeper += 1
    execute_cleanup(snapshots, plan)
    deleted_from_chain += len(base_layers) - len(shard_keys("r1-base"))
    rows += read_back(root, None, d1_model, tmp_path / "c1")

    # The base's record damaged: left alone, and still read.
    store.put(record_key, b"{not json")
    plan = make_plan(snapshots, now=layout.utc_now() + LATER)
    assert "r1-base" not in {i.run_id for i in plan.items}, plan.to_dict()
    execute_cleanup(snapshots, plan)
    deleted_from_chain += len(base_layers) - len(shard_keys("r1-base"))
    rows += read_back(root, None, d1_model, tmp_path / "c2")
    store.put(record_key, record_bytes)

    # A staged delta on r2, then a full run live over it: keep_runs=2 keeps r4 and the staged r3,
    # whose chain reads r1 and r2. Its manifest deleted: what it reads is known only from its record.
    staged = {k: f"d2-{k}" for k in range(0, 120, 7)}
    write(spark, tmp_path, root, "r3-staged", staged, write_mode="delta", publish=False)
    staged_ref = snapshots.read_run("r3-staged").manifest_ref
    staged_model = {**d1_model, **{k: v.encode() for k, v in staged.items()}}
    rows += read_back(root, staged_ref, staged_model, tmp_path / "c3")
    write(spark, tmp_path, root, "r4-full", {k: "new" for k in range(10)})
    staged_manifest = store.get(store.key_of(staged_ref)).data
    store.delete_many([store.key_of(staged_ref)])
    plan = make_plan(snapshots, now=layout.utc_now() + LATER, keep_runs=2)
    assert not {"r1-base", "r2-delta"} & {i.run_id for i in plan.items}, plan.to_dict()
    reasons = {s.run_id: s.reason for s in plan.skipped}
    assert reasons["r1-base"] == reasons["r2-delta"] == "its layers are read by kept run r3-staged", reasons
    kept_with_keeper += 2
    r2_layers = shard_keys("r2-delta")
    execute_cleanup(snapshots, plan)
    deleted_from_chain += len(base_layers) - len(shard_keys("r1-base")) + len(r2_layers) - len(shard_keys("r2-delta"))
    store.put(store.key_of(staged_ref), staged_manifest)  # restored, the staged chain reads back exactly
    rows += read_back(root, staged_ref, staged_model, tmp_path / "c4")
    assert deleted_from_chain == 0
    figure(scenarios=3, runs_kept_and_named=kept_with_keeper, chain_objects_deleted=deleted_from_chain,
           rows_checked=rows)
