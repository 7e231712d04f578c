"""Delta snapshots end to end (SPEC §13): real Spark, both stores, readers fresh and refreshing.

After every step the snapshot is compared with a model dict the test builds on its own from the
changes it asked for; the per-layer counts are checked against the same model.
"""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    ConfigError,
    InputDataError,
    PublishManifestError,
    ReaderError,
)
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.run_record import read_run_record
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.spark_helpers import run, write_parquet

NUM_DBS = 4


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("shardyfusion-delta")
               .config("spark.ui.enabled", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def change_table(upserts: dict[int, str], deletes: list[int]) -> pa.Table:
    keys = [*upserts, *deletes]
    return pa.table({"id": pa.array(keys, pa.int64()),
                     "payload": [upserts.get(k) for k in keys],
                     "deleted": pa.array([False] * len(upserts) + [True] * len(deletes), pa.bool_())})


class Chain:
    """Writes through the real job and keeps the model: the data every step must read back."""

    def __init__(self, spark, tmp_path, root, options):
        self.spark, self.tmp_path, self.root, self.options = spark, tmp_path, root, options
        self.model: dict[int, bytes] = {}
        self.step = 0

    def write(self, mode: str, upserts: dict[int, str] | None = None, deletes: list[int] = (), **kw) -> dict:
        self.step += 1
        args = {"output_uri": self.root, "key_column": "id", "value_column": "payload",
                "storage_options": self.options, "run_id": f"step{self.step:02d}-{mode}", **kw}
        if mode == "full":
            table = pa.table({"id": pa.array(list(upserts), pa.int64()), "payload": list(upserts.values())})
            args.update(num_dbs=kw.get("num_dbs", NUM_DBS), input_path=write_parquet(self.tmp_path, table, f"in{self.step}"))
        elif mode == "delta":
            table = change_table(upserts or {}, list(deletes))
            args.update(write_mode="delta", delete_column="deleted",
                        input_path=write_parquet(self.tmp_path, table, f"in{self.step}"))
        else:
            args.update(write_mode="compact")
        record = run(self.spark, **args)
        if mode == "full":
            self.model = {}
        for k, v in (upserts or {}).items():
            self.model[k] = v.encode()
        for k in deletes:
            self.model.pop(k, None)
        return record

    def manifest(self):
        snapshots = SnapshotRoot(open_store(self.root, self.options))
        return snapshots.read_manifest(snapshots.current())

    def stored(self) -> dict:
        """The live manifest as stored: the JSON object itself, not the snapshot rebuilt from its chain."""
        store = open_store(self.root, self.options)
        pointer = SnapshotRoot(store).current()
        return json.loads(store.get(store.key_of(pointer.manifest_ref)).data)

    def check(self, reader: ShardedReader, absent=()) -> None:
        keys = sorted(self.model)
        assert reader.multi_get(keys) == [self.model[k] for k in keys]
        assert reader.multi_get(list(absent)) == [None] * len(absent)
        for k in list(absent)[:5]:
            assert reader.get(k) is None
        assert reader.manifest.row_count == len(self.model)


def sorted_runs(reader: ShardedReader, db_id: int) -> int:
    """Files a point look-up in the reader's local database of shard ``db_id`` may visit."""
    db = reader.open_shard(db_id)
    files = [db.property_int_value(f"rocksdb.num-files-at-level{level}") or 0 for level in range(7)]
    return files[0] + sum(1 for n in files[1:] if n)


def expected_counts(before: dict[int, bytes], upserts: dict[int, str], deletes: list[int]) -> dict[str, int]:
    return {"puts": len(upserts), "deletes": len(deletes),
            "inserted": sum(k not in before for k in upserts), "updated": sum(k in before for k in upserts),
            "deleted": sum(k in before for k in deletes), "deleted_absent": sum(k not in before for k in deletes)}


def test_a_chain_of_deltas_reads_back_exactly_fresh_and_refreshing(spark, tmp_path, any_root):
    root, options = any_root
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(600)})
    full = chain.manifest()
    assert full.format_version == 1 and full.chain_depth == 0 and full.base_run_id is None

    # A live follower (its layers ingested into the databases it serves), private cache: the served run's folder goes.
    refreshing = ShardedReader(root, storage_options=options, ingest_refreshes=True)
    chain.check(refreshing)
    # Compacts every shard it builds from more than one layer; reads the same, refreshes by the change.
    compacting = ShardedReader(root, storage_options=options, max_local_layers=1)
    chain.check(compacting)
    steps = [
        # updates, inserts, deletes of present keys and of absent ones
        ({**{k: f"v1-{k}" for k in range(0, 100, 2)}, **{k: f"v1-{k}" for k in range(600, 650)}},
         [*range(101, 200, 5), 5000, 5001]),
        # re-inserts of deleted keys, deletes of updated and of inserted keys
        ({k: f"v2-{k}" for k in range(101, 200, 5)}, [0, 2, 4, 600, 601, 7777]),
        # one key: one shard changes, the others keep their layers and their cached copies
        ({3: "v3-3"}, []),
    ]
    gone: set[int] = set()
    for depth, (upserts, deletes) in enumerate(steps, start=1):
        before = dict(chain.model)
        base_ref, base_run = SnapshotRoot(open_store(root, options)).current().manifest_ref, chain.manifest().run_id
        record = chain.write("delta", upserts, deletes)
        manifest = chain.manifest()
        assert manifest.run_id == record.run_id and manifest.format_version == 3
        # Stored: only the shards this run changed, each with only this run's layer, and the base by reference.
        stored = chain.stored()
        assert stored["base_manifest_ref"] == base_ref and stored["base_run_id"] == base_run
        assert sorted(s["db_id"] for s in stored["shards"]) == sorted(
            s.db_id for s in manifest.shards if s.layers[-1].run_id == manifest.run_id)
        assert all([layer["run_id"] for layer in s["layers"]] == [manifest.run_id] for s in stored["shards"])
        assert manifest.chain_depth == depth and manifest.base_run_id == f"step{depth:02d}-" + (
            "full" if depth == 1 else "delta")
        new_layers = [layer for s in manifest.shards for layer in s.layers if layer.run_id == manifest.run_id]
        got = {k: sum(getattr(layer, k) for layer in new_layers) for k in expected_counts({}, {}, [])}
        assert got == expected_counts(before, upserts, deletes)
        assert manifest.stats["rows"] == len(chain.model) == manifest.row_count
        for shard in manifest.shards:  # layers oldest first, the newest the entry's own files
            assert shard.layers[0].kind == "full" and shard.layers[0].run_id == "step01-full"
            assert (shard.db_url, shard.files) == (shard.layers[-1].db_url, shard.layers[-1].files)
        gone |= set(deletes)
        gone -= set(upserts)
        absent = sorted(gone | {9999})
        with ShardedReader(root, storage_options=options) as fresh, \
                ShardedReader(root, storage_options=options, max_local_layers=None) as layered, \
                ShardedReader(root, storage_options=options, max_local_layers=2) as bounded:
            for reader in (fresh, layered, bounded):
                chain.check(reader, absent)
            deepest = 0
            for shard in manifest.shards:  # every layer its own run, or compacted past the bound
                runs = sorted_runs(layered, shard.db_id)
                assert runs >= len(shard.layers)
                assert sorted_runs(bounded, shard.db_id) == (runs if runs <= 2 else 1)
                deepest = max(deepest, runs)
            assert deepest > 2 or depth == 1  # the bound was really crossed
        assert compacting.refresh() is True and compacting.last_refresh.bytes_downloaded == sum(
            layer.byte_size for layer in new_layers)
        chain.check(compacting, absent)
        assert {sorted_runs(compacting, s.db_id) for s in manifest.shards} == {1}
        assert compacting.last_refresh.shards_compacted == len(new_layers)  # every shard that gained a layer
        assert refreshing.refresh() is True and refreshing.run_id == manifest.run_id
        report = refreshing.last_refresh
        assert report is not None and report.previous_run_id != manifest.run_id
        # Only the new layers came down; the rest was built on the cached copies.
        layer_bytes = sum(layer.byte_size for layer in new_layers)
        assert report.layers_downloaded == len(new_layers) and report.bytes_downloaded == layer_bytes
        assert report.shards_rebuilt == len(new_layers) and report.layers_reused >= len(new_layers)
        before_reads = refreshing.cache_stats
        chain.check(refreshing, absent)
        # Every shard, changed or not, was carried over: reading all keys downloads nothing more.
        assert refreshing.cache_stats == before_reads

    # Compaction: the same data, one full layer per shard, depth 0.
    chain.write("compact")
    compacted = chain.manifest()
    assert compacted.chain_depth == 0 and compacted.write_mode == "compact" and compacted.base_run_id == "step04-delta"
    assert all(not s.layers and s.db_url.startswith(layout.join(root, layout.shards_prefix(compacted.run_id)))
               for s in compacted.shards)
    with ShardedReader(root, storage_options=options) as fresh:
        chain.check(fresh, sorted(gone))
    assert refreshing.refresh() is True
    chain.check(refreshing, sorted(gone))
    refreshing.close()
    assert compacting.refresh() is True
    chain.check(compacting, sorted(gone))
    compacting.close()
    with pytest.raises(ReaderError, match="max_local_layers must be a positive integer or None, got 0"):
        ShardedReader(root, storage_options=options, max_local_layers=0)


def test_publish_refuses_a_delta_on_a_base_that_is_not_live_and_rollback_works(spark, tmp_path, any_root):
    root, options = any_root
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(200)})
    first_model = dict(chain.model)
    chain.write("delta", {1: "d1"}, [2])
    d1_model = dict(chain.model)
    chain.write("delta", {3: "d2"}, [4])
    d2_model = dict(chain.model)
    # A delta on step02 while step03 is live, meant to go live: refused before any input is read
    # (the input path does not even exist), naming both runs, and nothing is written.
    store = open_store(root, options)
    snapshots = SnapshotRoot(store)
    before = {o.key for o in store.list(layout.SHARDS_DIR + "/")} | {o.key for o in store.list(layout.MANIFESTS_DIR + "/")}
    with pytest.raises(BaseNotLiveError, match=r"run 'step04-delta' is written on run 'step02-delta', but _CURRENT "
                                               r"names 'step03-delta'.*nothing was written") as refused:
        run(spark, output_uri=root, key_column="id", value_column="payload", storage_options=options,
            run_id="step04-delta", write_mode="delta", delete_column="deleted", base_run_id="step02-delta",
            input_path=str(tmp_path / "never-read"))
    assert "PublishSnapshotOperator" not in str(refused.value)
    after = {o.key for o in store.list(layout.SHARDS_DIR + "/")} | {o.key for o in store.list(layout.MANIFESTS_DIR + "/")}
    assert after == before and snapshots.current().run_id == "step03-delta"
    assert snapshots.read_run("step04-delta").status == "failed"
    chain.step += 1
    # Staged (publish=False) it is written, and its publish is refused until its base is live again.
    chain.write("delta", {5: "late"}, [], base_run_id="step02-delta", publish=False)
    late = snapshots.read_run("step05-delta")
    assert late.status == "succeeded" and late.published_at is None
    from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run

    with pytest.raises(BaseNotLiveError, match=r"'step05-delta'.*'step02-delta'.*'step03-delta'.*drop that run's changes"):
        publish_run(snapshots, run_id="step05-delta", sleep=lambda s: None)
    with pytest.raises(BaseNotLiveError, match="drop that run's changes"):
        publish_run(snapshots, run_id="step05-delta", allow_older=True, sleep=lambda s: None)
    if options is None:  # the operator says the same (its S3 use needs a connection; the core is tested on both)
        from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator
        from tests.operator_helpers import make_context

        operator = PublishSnapshotOperator(task_id="publish_late", output_uri=root, run_id="step05-delta",
                                           aws_conn_id=None)
        with pytest.raises(PublishManifestError, match=r"step05-delta.*step02-delta.*step03-delta"):
            operator.execute(make_context())
        assert snapshots.current().run_id == "step03-delta"
    # A reader pinned to a chain run keeps reading exactly that run, live or not.
    pinned = ShardedReader(root, storage_options=options, manifest_ref=snapshots.read_run("step03-delta").manifest_ref,
                           cache_dir=tmp_path / "pinned")
    assert pinned.multi_get(sorted(d2_model)) == [d2_model[k] for k in sorted(d2_model)]
    # Rolling back to any run of the chain that was live works, and forward again.
    for run_id, model in (("step02-delta", d1_model), ("step01-full", first_model)):
        publish_run(snapshots, run_id=run_id, allow_older=True, sleep=lambda s: None)
        with ShardedReader(root, storage_options=options) as reader:
            assert reader.run_id == run_id
            assert reader.multi_get(sorted(model)) == [model[k] for k in sorted(model)]
        pinned.refresh()  # pinned: the rollback does not move it
        assert pinned.run_id == "step03-delta"
        assert pinned.multi_get(sorted(d2_model)) == [d2_model[k] for k in sorted(d2_model)]
    pinned.close()
    # Its base live again (a rollback), the staged delta publishes and reads back exactly.
    publish_run(snapshots, run_id="step02-delta", allow_older=True, sleep=lambda s: None)
    publish_run(snapshots, run_id="step05-delta", sleep=lambda s: None)
    late_model = {**d1_model, 5: b"late"}
    with ShardedReader(root, storage_options=options) as reader:
        assert reader.run_id == "step05-delta"
        assert reader.multi_get(sorted(late_model)) == [late_model[k] for k in sorted(late_model)]
    # And a delta with nothing published refuses to start.
    with pytest.raises(ConfigError, match="needs a published snapshot"):
        run(spark, output_uri=layout.join(root, "empty"), key_column="id", value_column="payload",
            storage_options=options, write_mode="delta",
            input_path=write_parquet(tmp_path, change_table({1: "x"}, []), "lonely"))


def test_a_shared_cache_reuses_refreshed_builds_and_rebuilds_a_tampered_one(spark, tmp_path, file_root):
    """A refresh builds on a hard-linked copy of the previous build and records its files' checksums
    from that copy's verified marker; another reader on the same cache reuses the build as verified,
    and a byte flipped in one of its files is caught on reuse (rebuilt, read right)."""
    root, options = file_root, None
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(300)})
    cache = tmp_path / "cache"
    with ShardedReader(root, storage_options=options, cache_dir=cache) as follower:
        chain.check(follower)
        chain.write("delta", {k: f"v1-{k}" for k in range(0, 300, 7)} | {900: "v1-900"}, [1, 2, 3])
        assert follower.refresh() is True
        chain.check(follower, [1, 2, 3])
    manifest = chain.manifest()
    with ShardedReader(root, storage_options=options, cache_dir=cache) as again:
        chain.check(again, [1, 2, 3])
        assert again.cache_stats == {"layers_downloaded": 0, "bytes_downloaded": 0, "shards_built": 0,
                                     "layers_reused": 0, "shards_compacted": 0}
    shard = max(manifest.shards, key=lambda e: e.row_count)
    built = cache / f"run_id={manifest.run_id}" / f"db={shard.db_id:05d}"
    victim = max(built.glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with ShardedReader(root, storage_options=options, cache_dir=cache) as after:
        chain.check(after, [1, 2, 3])
        assert after.cache_stats["shards_built"] >= 1


def test_conflicting_sharding_and_automatic_compaction(spark, tmp_path, file_root):
    root, options = file_root, None
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(100)})
    with pytest.raises(ConfigError, match=r"num_dbs 8 vs the base's 4"):
        chain.write("delta", {1: "x"}, [], num_dbs=8)
    chain.model[1] = b"v0-1"  # that write was refused before anything was written
    chain.write("delta", {1: "d1"}, [2], max_chain_depth=1)
    assert chain.manifest().chain_depth == 1
    chain.write("delta", {3: "d2"}, [4], max_chain_depth=1)  # the base is at the limit: written compacted
    manifest = chain.manifest()
    assert manifest.chain_depth == 0 and manifest.write_mode == "compact" and not any(s.layers for s in manifest.shards)
    with ShardedReader(root, storage_options=options) as reader:
        chain.check(reader, [2, 4])
    # Written compacted, it is still a delta of 2 changes (put 3, delete 4) on a base of 99 rows.
    from airflow_provider_shardyfusion.core.errors import ManifestValidationError
    from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot

    snapshots = SnapshotRoot(open_store(root, options))
    check = validate_snapshot(snapshots, run_id=manifest.run_id, max_delta_ratio=0.05).check("max_delta_ratio")
    assert check.figure == round(2 / 99, 6) and not check.skipped and "(written compacted)" in check.detail
    with pytest.raises(ManifestValidationError, match=r"delta ratio 0.0202 exceeds max_delta_ratio 0.01"):
        validate_snapshot(snapshots, run_id=manifest.run_id, max_delta_ratio=0.01)


def test_a_delta_takes_the_value_format_and_columns_of_its_base(spark, tmp_path, file_root):
    root = file_root
    base = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"], "score": [10, 20, 30]})
    run(spark, output_uri=root, input_path=write_parquet(tmp_path, base, "base"), key_column="id", num_dbs=2,
        value_format="json", value_columns=["name", "score"], run_id="base-json")
    change = pa.table({"id": pa.array([2, 3, 4], pa.int64()), "name": ["B", None, "d"], "score": [21, None, 40],
                       "deleted": [False, True, False]})
    change_path = write_parquet(tmp_path, change, "change")
    for given, conflict in (({"value_format": "binary", "value_column": "name"}, "value_format 'binary' vs the base's 'json'"),
                            ({"value_columns": ["name"]}, "value_columns ['name'] vs the base's ['name', 'score']")):
        with pytest.raises(ConfigError, match=re.escape(conflict)):
            run(spark, output_uri=root, input_path=change_path, key_column="id", write_mode="delta",
                delete_column="deleted", run_id=f"refused-{len(conflict)}", **given)
    # Nothing about the value given: the base's format and columns, as with its sharding.
    run(spark, output_uri=root, input_path=change_path, key_column="id", write_mode="delta", delete_column="deleted",
        run_id="delta-inherits")
    with ShardedReader(root, cache_dir=str(tmp_path / "cache")) as reader:
        assert reader.manifest.run_id == "delta-inherits" and reader.manifest.value_format == "json"
        assert [reader.get(k) for k in (1, 2, 3, 4)] == [
            {"name": "a", "score": 10}, {"name": "B", "score": 21}, None, {"name": "d", "score": 40}]


def test_a_null_delete_flag_is_a_bad_row_and_nothing_is_published(spark, tmp_path, file_root):
    # A null flag used to be taken as an upsert: key 5's stored value became empty bytes.
    root, options = file_root, None
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(100)})
    store = open_store(root, options)
    before = store.get(layout.CURRENT_KEY).data
    table = pa.table({"id": pa.array([1, 2, 5], pa.int64()), "payload": ["d1", None, None],
                      "deleted": pa.array([False, True, None], pa.bool_())})
    with pytest.raises(InputDataError) as caught:
        run(spark, output_uri=root, key_column="id", value_column="payload", write_mode="delta",
            delete_column="deleted", input_path=write_parquet(tmp_path, table, "null-flag"), run_id="null-flag")
    message = str(caught.value)
    assert "column 'deleted'" in message and "key 5" in message and "null" in message, message
    record = read_run_record(store, "null-flag")
    assert record is not None and record.status == "failed" and record.error is not None
    assert (record.error.type, "column 'deleted'" in record.error.message) == ("InputDataError", True)
    assert store.get(layout.CURRENT_KEY).data == before
    with ShardedReader(root, storage_options=options) as reader:
        chain.check(reader)
        assert reader.get(5) == b"v0-5"


def test_cleanup_keeps_every_layer_a_kept_run_reads(spark, tmp_path, any_root):
    root, options = any_root
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(300)})
    chain.write("delta", {k: f"v1-{k}" for k in range(0, 300, 7)}, [1, 2, 3])
    chain.write("delta", {k: f"v2-{k}" for k in range(0, 300, 11)}, [5])
    store = open_store(root, options)
    snapshots = SnapshotRoot(store)

    def shard_objects(run_id):
        return sorted(o.key for o in store.list(layout.shards_prefix(run_id)))

    before = {r: shard_objects(r) for r in ("step01-full", "step02-delta", "step03-delta")}
    assert all(before.values())
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(0))
    assert not [i for i in plan.items if i.category == "expired_snapshots"], plan.to_dict()
    reasons = {s.run_id: s.reason for s in plan.skipped}
    assert reasons["step01-full"] == "its layers are read by kept run step03-delta"
    assert reasons["step02-delta"] == "its layers are read by kept run step03-delta"
    execute_cleanup(snapshots, plan)
    assert {r: shard_objects(r) for r in before} == before
    with ShardedReader(root, storage_options=options) as reader:
        chain.check(reader)

    chain.write("compact")
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(0))
    doomed = {i.run_id for i in plan.items if i.category == "expired_snapshots"}
    assert doomed == {"step01-full", "step02-delta", "step03-delta"}, plan.to_dict()
    execute_cleanup(snapshots, plan)
    assert all(shard_objects(r) == [] for r in before)
    with ShardedReader(root, storage_options=options) as reader:
        chain.check(reader)
    deleted_at = layout.format_ts(snapshots.read_run("step02-delta").deleted_at)
    with pytest.raises(ConfigError, match=rf"base_run_id 'step02-delta'.*deleted by cleanup at {deleted_at}"):
        chain.write("delta", {1: "late"}, [], base_run_id="step02-delta", publish=False)


def test_validation_over_a_chain(spark, tmp_path, any_root):
    from airflow_provider_shardyfusion.cli import main as cli
    from airflow_provider_shardyfusion.core.errors import ManifestValidationError
    from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot

    root, options = any_root
    chain = Chain(spark, tmp_path, root, options)
    chain.write("full", {k: f"v0-{k}" for k in range(400)})
    chain.write("delta", {**{k: f"v1-{k}" for k in range(10)}, 1000: "new"}, [20, 21, 22, 9999], publish=False)
    snapshots = SnapshotRoot(open_store(root, options))
    report = validate_snapshot(snapshots, run_id="step02-delta", max_delta_ratio=0.05, sample_lookups=8,
                               expected_keys=[0, 1000], absent_keys=[20, 21, 22, 9999], verify_checksums=True,
                               min_rows=len(chain.model), storage_options=options)
    checks = {c.name: c for c in report.checks}
    assert checks["max_delta_ratio"].figure == round(15 / 400, 6) and not checks["max_delta_ratio"].skipped
    assert checks["lookups"].figure["absent"] == 4 and report.rows == len(chain.model) == 398
    # Sampled look-ups reach the chain's shards too: their first and last live keys, read through the layers.
    assert checks["lookups"].ok and checks["lookups"].figure["sampled"] == 8
    assert checks["storage"].ok
    with pytest.raises(ManifestValidationError) as failed:
        validate_snapshot(snapshots, run_id="step02-delta", max_delta_ratio=0.01, absent_keys=[0],
                          storage_options=options)
    text = str(failed.value)
    assert "delta ratio 0.0375 exceeds max_delta_ratio 0.01" in text
    assert "key 0 should be absent (deleted) but reads a value" in text
    # A layer of the base gone missing is a storage problem of the delta, named with its layer.
    store = open_store(root, options)
    victim = next(o.key for o in store.list(layout.shards_prefix("step01-full")))
    store.delete_many([victim])
    with pytest.raises(ManifestValidationError, match=r"layer 0, written by run 'step01-full'.*is missing"):
        validate_snapshot(snapshots, run_id="step02-delta", storage_options=options)
    if options is None:  # the CLI twin, on the local store
        assert cli(["validate", root, "--run-id", "step02-delta", "--max-delta-ratio", "0.5",
                    "--absent-key", "20"]) == 1


def test_history_shows_layers_and_exact_changes_along_a_chain(spark, tmp_path, file_root):
    from airflow_provider_shardyfusion.core.lifecycle.history import diff_runs
    from tests.history_root import client_for

    root = file_root
    chain = Chain(spark, tmp_path, root, None)
    chain.write("full", {k: f"v0-{k}" for k in range(100)})
    chain.write("delta", {**{k: "u" for k in range(5)}, 200: "i", 201: "i"}, [50, 51, 999])
    chain.write("delta", {50: "back"}, [0])
    snapshots = SnapshotRoot(open_store(root))
    diff = diff_runs(snapshots, "step01-full", "step03-delta")
    assert diff.changes == {"inserted": 3, "updated": 5, "deleted": 3, "deleted_absent": 1}
    assert diff.rows_b - diff.rows_a == 3 - 3
    # Issue 28: the timeline says what each run did, from the counts the writer stored; the runs the
    # live delta still reads are "base of live", never just "superseded".
    client = client_for([root], None, tmp_path)
    timeline = {r["run_id"]: r for r in client.get("/root", params={"uri": root, "format": "json"}).json()["runs"]}
    assert {k: (v["state"], v["write_mode"]) for k, v in timeline.items()} == {
        "step01-full": ("base_of_live", "full"), "step02-delta": ("base_of_live", "delta"),
        "step03-delta": ("live", "delta")}
    assert timeline["step02-delta"]["changes"] == {"inserted": 2, "updated": 5, "deleted": 2, "deleted_absent": 1}
    assert timeline["step02-delta"]["rows_change"] == 0 and timeline["step03-delta"]["rows_change"] == 0
    page = client.get("/root", params={"uri": root}).text
    assert ">base of live</span>" in page and ">superseded</span>" not in page
    assert "+2</span> <span class='upd'>~5</span> <span class='del'>\u22122</span> (net 0)" in page
    # The run page: its base as a link with its diff, and a sample of the keys it changed, each linking its history.
    run3 = client.get("/run", params={"uri": root, "run_id": "step03-delta", "format": "json"}).json()
    changed = {c["key"]: (c["kind"], c["before"], c["after"]) for k in run3["samples"]["changes"].values() for c in k}
    assert changed == {50: ("inserted", None, "back"), 0: ("deleted", "u", None)}
    assert run3["samples"]["counts"] == {"inserted": 1, "updated": 0, "deleted": 1}
    assert run3["samples"]["more"] == {"inserted": False, "updated": False, "deleted": False}
    assert {s["db_id"]: s["files"] for s in run3["shards"]} == {  # every layer's files, not the newest layer's
        s.db_id: sum(len(x.files) for x in s.all_layers()) for s in chain.manifest().shards}
    assert any(len(s["layers"]) > 1 and s["files"] > len(s["layers"][-1:]) for s in run3["shards"])
    html = client.get("/run", params={"uri": root, "run_id": "step03-delta"}).text
    assert ">diff against base</a>" in html and "a=step02-delta&amp;b=step03-delta" in html
    assert "key=50\">50</a>" in html and "key=0\">0</a>" in html
    key = client.get("/key", params={"uri": root, "key": "50", "format": "json"}).json()
    assert [(r["run_id"], r["fate"]) for r in key["runs"]] == [
        ("step03-delta", "inserted"), ("step02-delta", "deleted"), ("step01-full", "inserted")]

    chain.write("compact")
    assert diff_runs(snapshots, "step03-delta", "step04-compact").changes is None  # not a chain extension

    run = client.get("/run", params={"uri": root, "run_id": "step03-delta", "format": "json"}).json()
    assert run["write_mode"] == "delta" and run["chain_depth"] == 2 and run["base_run_id"] == "step02-delta"
    assert sum(len(s["layers"]) for s in run["shards"]) >= NUM_DBS
    assert {x["run_id"] for s in run["shards"] for x in s["layers"]} <= {"step01-full", "step02-delta", "step03-delta"}
    html = client.get("/run", params={"uri": root, "run_id": "step03-delta"}).text
    assert "layers (oldest first)" in html and "step02-delta (+" in html
    page = client.get("/diff", params={"uri": root, "a": "step01-full", "b": "step03-delta"}).text
    assert "along the chain: 3 inserted, 5 updated, 3 deleted (1 deletions of absent keys)" in page


def test_many_small_shards_share_layer_tasks_and_read_back_exactly(spark, tmp_path, file_root):
    """More shards than 8 tasks per core (40 on local[2]: 16 tasks): a compaction writes the layers of
    a range of shards per task, as full writes do, and a delta in one task per core (2). One task per
    small shard made a delta on 1000 shards cost 7x its full write in scheduling alone, 8 tasks per
    core still spent ~40 % of it starting Python tasks, and 2 paid a pause between two waves
    (SPEC §17: the §13 ratios at 1000 shards)."""
    from airflow_provider_shardyfusion.spark_jobs.driver import TASKS_PER_CORE

    chain = Chain(spark, tmp_path, file_root, None)
    chain.write("full", {k: f"v0-{k}" for k in range(400)}, num_dbs=40)
    upserts = {k: f"v1-{k}" for k in range(0, 400, 3)} | {1000 + k: "new" for k in range(40)}
    deletes = [k for k in range(1, 400, 7) if k % 3]
    chain.write("delta", upserts, deletes)
    delta = chain.manifest()
    own = [layer for s in delta.shards for layer in s.layers if layer.run_id == delta.run_id]
    assert len(own) == 40  # every shard changed, each one layer
    assert len({re.search(r"-task=(\d+)$", layer.db_url)[1] for layer in own}) == 2  # local[2]
    with ShardedReader(file_root) as reader:
        chain.check(reader, absent=deletes)
    chain.write("compact")
    compacted = chain.manifest()
    assert compacted.write_mode == "compact" and len(compacted.shards) == 40
    assert len({s.task_attempt_id for s in compacted.shards}) == 2 * TASKS_PER_CORE
    with ShardedReader(file_root) as reader:
        chain.check(reader, absent=deletes)


def test_automatic_compaction_over_task_ranges_keeps_unchanged_shards(spark, tmp_path, file_root):
    """A delta written compacted (merge + change in one job) on 40 shards in 16 tasks: its rows reach
    2 shards, yet every shard of every task is compacted. Each task used to write only the shards
    its rows reached, and the compacted manifest lost the other 38 with their rows."""
    chain = Chain(spark, tmp_path, file_root, None)
    chain.write("full", {k: f"v0-{k}" for k in range(400)}, num_dbs=40)
    chain.write("delta", {1: "d1"}, [2], max_chain_depth=1)
    chain.write("delta", {3: "d2", 1000: "new"}, [4], max_chain_depth=1)  # the base is at the limit
    manifest = chain.manifest()
    assert manifest.write_mode == "compact" and manifest.chain_depth == 0
    assert len(manifest.shards) == 40 and manifest.row_count == len(chain.model) == 399
    assert len({s.task_attempt_id for s in manifest.shards}) <= 16
    with ShardedReader(file_root) as reader:
        chain.check(reader, absent=[2, 4])
        assert sum(reader.open_shard(s.db_id) is not None for s in manifest.shards) == 40


def test_a_delta_reads_the_key_indexes_of_its_base_not_its_data(spark, tmp_path, file_root, monkeypatch):
    """Every full shard the job writes ships a key index next to its data (a small delta layer does
    not); a delta's existence check downloads those instead of the data and still counts exactly; readers never ingest
    them; validation checks them like the data; cleanup keeps them with their attempt."""
    from airflow_provider_shardyfusion.core.lifecycle.integrity import check_storage
    from airflow_provider_shardyfusion.core.model.encoding import encode_key
    from airflow_provider_shardyfusion.core.model.routing import route_key
    from airflow_provider_shardyfusion.core.write import delta as delta_writes
    from airflow_provider_shardyfusion.core.write.delta import Change, TaskBase, base_exists
    from airflow_provider_shardyfusion.core.write.key_index import KEY_INDEX_FILE

    chain = Chain(spark, tmp_path, file_root, None)
    chain.write("full", {k: f"v0-{k}-" + "x" * 60 for k in range(400)})
    full = chain.manifest()
    assert all(s.key_index is not None and s.key_index.name == KEY_INDEX_FILE
               and KEY_INDEX_FILE not in {f.name for f in s.files} for s in full.shards)
    before = dict(chain.model)
    upserts = {**{k: f"v1-{k}" for k in range(0, 400, 3)}, **{k: f"v1-{k}" for k in range(400, 440)}}
    deletes = [*(k for k in range(1, 400, 10) if k % 3), 5000, 5001]
    chain.write("delta", upserts, deletes)
    delta = chain.manifest()
    new_layers = [layer for s in delta.shards for layer in s.layers if layer.run_id == delta.run_id]
    assert {k: sum(getattr(layer, k) for layer in new_layers) for k in expected_counts({}, {}, [])} \
        == expected_counts(before, upserts, deletes)
    layers = [layer for s in delta.shards for layer in s.all_layers()]
    # The full layers have key indexes; the delta's small layers (a few values each) have none.
    assert all((layer.key_index is None) is (layer.run_id == delta.run_id) for layer in layers)
    assert all(("key_index" in layer) is (layer["run_id"] != delta.run_id)
               for s in chain.stored()["shards"] for layer in s["layers"])

    # A reader ingests the data alone: every key reads its value (a key index would answer b"").
    cache = tmp_path / "cache"
    with ShardedReader(file_root, cache_dir=str(cache)) as reader:
        chain.check(reader, absent=[1, 11, 5000])
    assert not [name for _, _, names in os.walk(cache) for name in names if name == KEY_INDEX_FILE]

    # The next delta's existence check, as its task runs it: key indexes only, exact through tombstones.
    store = open_store(file_root)
    downloaded: list[str] = []
    real_download, real_get = store.download_file, store.get

    def recording_download(key: str, local: str) -> None:
        real_download(key, local)
        downloaded.append(key.rsplit("/", 1)[1])

    def recording_get(key: str):
        downloaded.append(key.rsplit("/", 1)[-1])
        return real_get(key)

    # The real reads, counted: small files are fetched with one GET, larger ones downloaded.
    store.download_file = recording_download  # type: ignore[method-assign]
    store.get = recording_get  # type: ignore[method-assign]
    shared = TaskBase(store, delta, str(tmp_path / "task"))
    probes = [*range(0, 450), 5000, 5001]
    try:
        for db_id in range(delta.num_dbs):
            mine = [k for k in probes if route_key(k, delta.num_dbs) == db_id]
            changes = [Change(encode_key(k, delta.key_encoding), b"y") for k in mine]
            assert base_exists(shared.shard_db(db_id), changes) == [k in chain.model for k in mine], db_id
    finally:
        shared.close()
    # A task of many shards starts a fresh database every KEY_INDEX_SHARDS_PER_DB shards: a look-up
    # visits every file its database holds (they all overlap in key range), so one database of all
    # the task's shards made each key pay for all of them. Exact across the restarts.
    monkeypatch.setattr(delta_writes, "KEY_INDEX_SHARDS_PER_DB", 2)
    restarting = TaskBase(open_store(file_root), delta, str(tmp_path / "task-restarting"))
    try:
        for db_id in range(delta.num_dbs):
            mine = [k for k in probes if route_key(k, delta.num_dbs) == db_id]
            db = restarting.shard_db(db_id)
            changes = [Change(encode_key(k, delta.key_encoding), b"y") for k in mine]
            assert base_exists(db, changes) == [k in chain.model for k in mine], db_id
            held = {s.db_id for s in delta.shards if s.db_id <= db_id and s.db_id >= db_id - db_id % 2}
            assert len(db.live_files()) == sum(len(s.all_layers()) for s in delta.shards if s.db_id in held), db_id
    finally:
        restarting.close()
    assert sorted(downloaded) == sorted(
        KEY_INDEX_FILE if layer.key_index is not None else f.name for layer in layers for f in layer.files)
    assert shared.bytes_read == sum(layer.key_index.size if layer.key_index is not None else layer.byte_size
                                    for layer in layers)
    assert shared.bytes_read < sum(layer.byte_size for layer in layers)

    # Validation checks each key index: present, its size, its checksum.
    snapshots = SnapshotRoot(store)
    assert check_storage(snapshots, delta, verify_checksums=True) == []
    victim = store.key_of(f"{full.shards[0].db_url}/{KEY_INDEX_FILE}")  # an inherited layer's, read by the delta
    local = tmp_path / "victim.sst"
    store.download_file(victim, str(local))
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0xFF
    local.write_bytes(bytes(data))
    store.upload_file(str(local), victim)
    assert check_storage(snapshots, delta) == []  # same size
    (problem,) = check_storage(snapshots, delta, verify_checksums=True)
    assert KEY_INDEX_FILE in problem and "checksum" in problem
    store.delete_many([victim])
    (problem,) = check_storage(snapshots, delta)
    assert KEY_INDEX_FILE in problem and "is missing" in problem

    # Cleanup removes attempt folders whole: a kept run's key indexes are no losing attempt nor orphan.
    plan = make_plan(snapshots, keep_runs=2, grace_period=timedelta(0))
    assert not [o.key for item in plan.items for o in item.objects if o.key.endswith(KEY_INDEX_FILE)], plan.to_dict()
