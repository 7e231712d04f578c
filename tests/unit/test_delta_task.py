"""A delta task's shards on a real base of real RocksDB files (no Spark): each shard's layer holds
exactly its change and counts, and the task's fixed costs do not grow with its shards (SPEC §13)."""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa
import pytest
import rocksdict

from airflow_provider_shardyfusion.core.model import rocksdb_options as rocksdb_options_module
from airflow_provider_shardyfusion.core.model.encoding import encode_binary_value, encode_key
from airflow_provider_shardyfusion.core.model.rocksdb_options import rocksdb_options
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.core.write import arrow_codec
from airflow_provider_shardyfusion.spark_jobs.chain_write import ChainPlan, _task_layers
from airflow_provider_shardyfusion.spark_jobs.faults import NO_FAULTS
from airflow_provider_shardyfusion.spark_jobs.routing_task import SHARD_ID_COL
from airflow_provider_shardyfusion.spark_jobs.shard_task import task_of_shard
from tests.snapshot_factory import build_snapshot

NUM_DBS, NUM_TASKS = 24, 3


def delta_plan(root: str, base_ref: str) -> ChainPlan:
    return ChainPlan(output_uri=root, storage_options={}, run_id="delta-t", base_manifest_ref=base_ref,
                     key_column="key", key_encoding="u64be", value_format="binary", value_columns=("value",),
                     delete_column="deleted", allow_duplicate_keys=False, compact=False, has_input=True,
                     num_tasks=NUM_TASKS, num_dbs=NUM_DBS)


def task_batches(rows: list[tuple[int, int, bytes | None]]) -> list[pa.RecordBatch]:
    """A task's input as Spark hands it: sorted by shard id, in two batches split mid-shard."""
    batch = pa.record_batch({
        "key": pa.array([k for _, k, _ in rows], pa.int64()),
        "value": pa.array([v if v is not None else b"" for _, _, v in rows], pa.binary()),
        "deleted": pa.array([v is None for _, _, v in rows]),
        SHARD_ID_COL: pa.array([d for d, _, _ in rows], pa.int32()),
    })
    half = len(rows) // 2
    return [batch.slice(0, half), batch.slice(half)]


def test_a_task_writes_each_shards_change_exactly_with_fixed_costs_per_task(file_root, tmp_path, monkeypatch):
    base = {k: f"v0-{k}".encode() for k in range(400)}
    build_snapshot(file_root, base.items(), num_dbs=NUM_DBS, shard_layout="sst", key_index=True)
    snapshots = SnapshotRoot(open_store(file_root))
    ref = snapshots.current().manifest_ref  # type: ignore[union-attr]
    # Updates, inserts, deletions of present and absent keys, in every shard.
    change: dict[int, bytes | None] = {k: f"v1-{k}".encode() for k in range(0, 400, 3)}
    change |= {1000 + k: b"new" for k in range(40)} | {k: None for k in range(1, 400, 7)} | {5000: None}
    rows = sorted((route_key(k, NUM_DBS), k, v) for k, v in change.items())

    # The real functions run; the wrappers only count calls.
    folders, encodes, requests, options = [], [], [], []
    real_mkdtemp, real_encode = tempfile.mkdtemp, arrow_codec.encode_values
    real_get, real_download = LocalStore.get, LocalStore.download_file
    real_options = rocksdb_options_module.rocksdb_options
    monkeypatch.setattr(rocksdb_options_module, "rocksdb_options",
                        lambda **kw: options.append(1) or real_options(**kw))
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: folders.append(1) or real_mkdtemp(*a, **kw))
    monkeypatch.setattr(arrow_codec, "encode_values", lambda *a, **kw: encodes.append(1) or real_encode(*a, **kw))
    monkeypatch.setattr(LocalStore, "get", lambda self, key: requests.append(("get", key)) or real_get(self, key))
    monkeypatch.setattr(LocalStore, "download_file",
                        lambda self, key, local: requests.append(("download", key)) or real_download(self, key, local))
    results, per_task = [], []
    for task in range(NUM_TASKS):
        folders.clear()
        encodes.clear()
        requests.clear()
        options.clear()
        mine = [r for r in rows if task_of_shard(r[0], NUM_DBS, NUM_TASKS) == task]
        results += _task_layers(delta_plan(file_root, ref), iter(task_batches(mine)), task=task, attempt=0,
                                task_attempt_id=9, faults=NO_FAULTS)
        per_task.append((len(folders), len(encodes), sorted({how for how, key in requests if key.endswith(".sst")}),
                         sum(1 for _, key in requests if key.endswith("/keys-00000.sst")), len(options) <= 2))
    # 8 shards a task: one scratch folder for its base shards and one for its layers, its rows
    # encoded once per batch, each base key index read by one request (a GET, checked in memory: a
    # download costs a HEAD first on S3), and RocksDB options built for its database and at most
    # once for its SST writers; per shard these cost ~0.4 ms at 1000s of shards.
    assert per_task == [(2, 2, ["get"], 8, True)] * NUM_TASKS

    store = open_store(file_root)
    assert sorted(r.db_id for r in results) == list(range(NUM_DBS))
    for result in results:
        db_id = result.db_id
        mine = {k: v for d, k, v in rows if d == db_id}
        before = {k: v for k, v in base.items() if route_key(k, NUM_DBS) == db_id}
        after = {k: v for k, v in (before | mine).items() if v is not None}
        counts = result.counts
        assert counts.inserted == sum(1 for k, v in mine.items() if v is not None and k not in before)
        assert counts.updated == sum(1 for k, v in mine.items() if v is not None and k in before)
        assert counts.deleted == sum(1 for k, v in mine.items() if v is None and k in before)
        assert counts.deleted_absent == sum(1 for k, v in mine.items() if v is None and k not in before)
        assert result.row_count == len(after)
        # The base shard's rows with the uploaded layer ingested on top read as the shard after the change.
        db = rocksdict.Rdict(str(tmp_path / f"check-{db_id}"), rocksdb_options())
        try:
            for k, v in before.items():
                db[encode_key(k, "u64be")] = encode_binary_value(v)
            for f in result.files:
                local = str(tmp_path / f"check-{db_id}-{f.name}")
                store.download_file(f"{store.key_of(result.db_url)}/{f.name}", local)
                db.ingest_external_file([local])
            assert list(db.items()) == sorted((encode_key(k, "u64be"), encode_binary_value(v)) for k, v in after.items())
        finally:
            db.close()


@pytest.mark.parametrize("memory", [True, False])
def test_task_scratch_reuses_one_folder_and_empties_it(tmp_path, monkeypatch, memory):
    from airflow_provider_shardyfusion.core import scratch

    monkeypatch.setattr(scratch, "memory_dir", lambda: str(tmp_path) if memory else None)
    work = scratch.TaskScratch(1 << 20, prefix="t-")
    seen = set()
    for i in range(3):
        with work.folder(100) as folder:
            assert os.listdir(folder) == []
            os.makedirs(os.path.join(folder, "sub"))
            with open(os.path.join(folder, f"f{i}"), "wb") as fh:
                fh.write(b"x")
            seen.add(folder)
    assert len(seen) == 1 and os.listdir(seen.pop()) == []
    with work.folder(2 << 20) as big:  # too large for memory: on disk, not in the memory folder
        assert not big.startswith(str(tmp_path))
    work.close()
    assert not os.path.exists(big)
