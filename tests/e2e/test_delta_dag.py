"""Delta snapshots under real Airflow (``dag.test()``) with real local Spark, file:// store (SPEC §13).

full → hourly delta (batch 1) → hourly delta (batch 2) → compaction + cleanup, all from
``dags_example/delta_snapshots.py``. After every step the snapshot is read back with fresh
``ShardedReader``s and with one that follows along with ``refresh()``, and compared with a model
dict this test builds on its own from the change rules below; the per-layer counts, chain depth,
the validation report and what the cleanup keeps are checked against the same model.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion import ShardedReader
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import make_plan
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})
ROWS = 3000
CHANGES = 400  # per batch: 200 updates, 100 deletes, 100 inserts, 1 deletion of a key never written
MAX_DELTA_RATIO = 0.2


# The DAG file's rules, restated here so the expected snapshot does not come from the code under test.
def key(i: int) -> int:
    return i * 7919 + 13


def value(k: int, batch: int) -> bytes:
    return f"value-{k}-b{batch}".encode()


def changes_of(batch: int) -> tuple[dict[int, bytes], list[int]]:
    """Batch ``batch``: rows [batch*200, batch*200+200) updated, the next 100 deleted, 100 new keys
    (3000 + (batch-1)*100 on) inserted, and the key batch*7919+5 (never written) deleted."""
    start = batch * CHANGES // 2
    updated = [key(i % ROWS) for i in range(start, start + 200)]
    deleted = [key(i % ROWS) for i in range(start + 200, start + 300)] + [batch * 7919 + 5]
    inserted = [key(ROWS + (batch - 1) * 100 + j) for j in range(100)]
    return {k: value(k, batch) for k in updated + inserted}, deleted


def layer_counts(model: dict[int, bytes], upserts: dict[int, bytes], deletes: list[int]) -> dict[str, int]:
    return {"puts": len(upserts), "deletes": len(deletes),
            "inserted": sum(k not in model for k in upserts), "updated": sum(k in model for k in upserts),
            "deleted": sum(k in model for k in deletes), "deleted_absent": sum(k not in model for k in deletes)}


def assert_reads(reader: ShardedReader, model: dict[int, bytes], absent: list[int]) -> None:
    keys = sorted(model)
    got = reader.multi_get(keys)
    wrong = [k for k, v in zip(keys, got, strict=True) if v != model[k]]
    assert not wrong, f"{len(wrong)} of {len(keys)} keys read back wrong, e.g. {wrong[:5]}"
    assert reader.multi_get(absent) == [None] * len(absent)
    assert reader.manifest.row_count == len(model)


def test_full_then_hourly_deltas_then_compaction(run_dag, tmp_path):
    env = {"SHARDYFUSION_DEMO_DIR": str(tmp_path), "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK}
    root = f"file://{tmp_path}/shardyfusion_delta/snapshot"
    snapshots = SnapshotRoot(open_store(root))

    full = run_dag("shardyfusion_delta_full", conf={"rows": ROWS}, extra_env=env)
    full_run = full.xcoms["write_full"]["run_id"]
    assert full.xcoms["write_full"]["published"] is True and full.xcoms["write_full"]["rows"] == ROWS
    model = {key(i): value(key(i), 0) for i in range(ROWS)}
    manifest = snapshots.read_manifest(snapshots.current())
    assert (manifest.run_id, manifest.write_mode, manifest.chain_depth, manifest.base_run_id) == (
        full_run, "full", 0, None)
    follower = ShardedReader(root, cache_dir=tmp_path / "follower-cache")
    assert_reads(follower, model, [])  # opens every shard, so each refresh rebuilds them on the cache

    runs = [full_run]
    gone: set[int] = set()
    for batch in (1, 2):
        upserts, deletes = changes_of(batch)
        expected_counts = layer_counts(model, upserts, deletes)
        base_rows = len(model)
        result = run_dag("shardyfusion_delta_hourly", extra_env=env, conf={
            "rows": ROWS, "changes": CHANGES, "batch": batch, "max_delta_ratio": MAX_DELTA_RATIO})
        model.update(upserts)
        for k in deletes:
            model.pop(k, None)
        gone = (gone | set(deletes)) - set(upserts)

        staged = result.xcoms["write_delta"]
        run_id = staged["run_id"]
        assert staged["published"] is False and staged["rows"] == len(model)
        assert result.xcoms["generate_changes"]["batch"] == batch
        assert sorted(result.xcoms["generate_changes"]["deleted_keys"]) == sorted(deletes)

        report = result.xcoms["validate_delta"]
        assert report["ok"] is True and report["run_id"] == run_id and report["rows"] == len(model)
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["max_delta_ratio"]["figure"] == round((len(upserts) + len(deletes)) / base_rows, 6)
        assert not checks["max_delta_ratio"]["skipped"] and checks["max_delta_ratio"]["limit"] == MAX_DELTA_RATIO
        assert checks["lookups"]["figure"] == {"sampled": 0, "expected": len(upserts), "absent": len(deletes),
                                               "found": len(upserts), "missing_expected": 0}
        assert checks["storage"]["ok"] and checks["run_record"]["ok"]

        published = result.xcoms["publish_delta"]
        assert published["moved"] is True and published["rollback"] is False
        assert published["pointer"]["run_id"] == run_id and published["previous_run_id"] == runs[-1]
        back = result.xcoms["read_back"]
        assert (back["run_id"], back["write_mode"], back["chain_depth"], back["base_run_id"]) == (
            run_id, "delta", batch, runs[-1])
        assert back["rows"] == len(model)
        for k, v in back["lookups"].items():
            assert (v.encode() if v is not None else None) == model.get(int(k)), k
        assert sum(v is None for v in back["lookups"].values()) == 3  # two deleted keys, one never written

        manifest = snapshots.read_manifest(snapshots.current())
        assert manifest.run_id == run_id and manifest.format_version == 3
        assert (manifest.write_mode, manifest.chain_depth, manifest.base_run_id) == ("delta", batch, runs[-1])
        new_layers = [layer for s in manifest.shards for layer in s.layers if layer.run_id == run_id]
        assert new_layers
        assert {c: sum(getattr(layer, c) for layer in new_layers) for c in expected_counts} == expected_counts
        for shard in manifest.shards:  # every shard reads the full write's layer first, then the deltas
            assert shard.layers[0].run_id == full_run
            assert [layer.kind for layer in shard.layers] == ["full"] + ["delta"] * (len(shard.layers) - 1)
        runs.append(run_id)

        with ShardedReader(root) as fresh:
            assert_reads(fresh, model, sorted(gone))
        assert follower.refresh() is True and follower.run_id == run_id
        refresh = follower.last_refresh
        assert refresh is not None and refresh.previous_run_id == runs[-2]
        # Only the delta's layers came down; the rest was built on the cached shards.
        assert refresh.layers_downloaded == len(new_layers) == refresh.shards_rebuilt
        assert refresh.bytes_downloaded == sum(layer.byte_size for layer in new_layers)
        assert refresh.layers_reused >= len(new_layers)
        assert_reads(follower, model, sorted(gone))

    # Before compaction: a cleanup keeping one run keeps every run whose layers it reads.
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(0))
    assert not plan.of("expired_snapshots"), plan.to_dict()
    reasons = {s.run_id: s.reason for s in plan.skipped}
    assert reasons[runs[0]] == reasons[runs[1]] == f"its layers are read by kept run {runs[2]}"

    compacted = run_dag("shardyfusion_delta_compact", conf={"keep_runs": 1, "grace_minutes": 0}, extra_env=env)
    compact_run = compacted.xcoms["compact_snapshot"]["run_id"]
    assert compacted.xcoms["compact_snapshot"]["published"] is True
    assert compacted.xcoms["compact_snapshot"]["rows"] == len(model)
    manifest = snapshots.read_manifest(snapshots.current())
    assert (manifest.run_id, manifest.write_mode, manifest.chain_depth, manifest.base_run_id) == (
        compact_run, "compact", 0, runs[-1])
    assert all(not s.layers for s in manifest.shards)

    # The compacted snapshot reads no layer of the chain, so the cleanup took the whole chain.
    cleanup = compacted.xcoms["cleanup"]
    assert cleanup["dry_run"] is False and not cleanup["errors"] and not cleanup["abandoned"]
    assert {i["run_id"] for i in cleanup["plan"]["items"] if i["category"] == "expired_snapshots"} == set(runs)
    assert set(cleanup["marked_deleted"]) == set(runs)
    left = [o.key for o in snapshots.store.list("")]
    shard_runs = {p.run_id for k in left if (p := layout.parse_shard_key(k)) is not None}
    manifest_runs = {p.run_id for k in left if (p := layout.parse_manifest_key(k)) is not None}
    assert shard_runs == manifest_runs == {compact_run}
    assert all(snapshots.read_run(r).deleted_at is not None for r in runs)

    with ShardedReader(root) as fresh:
        assert_reads(fresh, model, sorted(gone))
    assert follower.refresh() is True and follower.run_id == compact_run
    assert_reads(follower, model, sorted(gone))
    follower.close()
