"""Helpers shared by the Spark write tests: run the job in-process, write inputs, read snapshots back."""

from __future__ import annotations

import os
import random
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model import encoding, routing
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import read_run_record
from airflow_provider_shardyfusion.core.storage import open_store


def run(spark, faults=None, **kwargs):
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write
    from airflow_provider_shardyfusion.spark_jobs.faults import NO_FAULTS, Faults

    return run_write(spark, build_write_config(**kwargs), faults=Faults(faults) if faults else NO_FAULTS)


def write_parquet(tmp_path, table: pa.Table, name="input") -> str:
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(table, path)
    return path


def read_snapshot(root, storage_options=None):
    """Follow _CURRENT → manifest, download every shard and return (manifest, {db_id: {key: value}})."""
    from rocksdict import AccessType, Options, Rdict

    store = open_store(root, storage_options)
    pointer = CurrentPointer.from_bytes(store.get(layout.CURRENT_KEY).data)
    pointer.check_root(store.root)
    manifest = Manifest.from_bytes(store.get(store.key_of(pointer.manifest_ref)).data)
    assert manifest.run_id == pointer.run_id
    shards = {}
    for shard in manifest.shards:
        local = tempfile.mkdtemp()
        prefix = store.key_of(shard.db_url)
        for f in shard.files:
            store.download_file(f"{prefix}/{f.name}", os.path.join(local, f.name))
            assert os.path.getsize(os.path.join(local, f.name)) == f.size
        if manifest.shard_layout == "sst":  # SST files only: ingest them, in order, into a fresh database
            ssts = [os.path.join(local, f.name) for f in shard.files]
            assert ssts and all(p.endswith(".sst") for p in ssts)
            local = os.path.join(local, "db")
            fresh = Rdict(local, options=Options(raw_mode=True))
            for sst in ssts:
                fresh.ingest_external_file([sst])
            fresh.close()
        db = Rdict(local, options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            shards[shard.db_id] = dict(db.items())
        finally:
            db.close()
        assert len(shards[shard.db_id]) == shard.row_count
        keys = sorted(shards[shard.db_id])
        assert keys[0].hex() == shard.min_key and keys[-1].hex() == shard.max_key
    record = read_run_record(store, manifest.run_id)
    assert record is not None and record.status == "succeeded"
    assert record.manifest_ref == pointer.manifest_ref
    assert record.num_dbs == manifest.num_dbs
    return manifest, shards


def assert_exact(manifest, shards, expected: dict, key_encoding: str, router=None):
    """Every input row stored once, in the shard its key routes to, with the exact value."""
    seen = 0
    for db_id, items in shards.items():
        for kb, vb in items.items():
            key = encoding.decode_key(kb, key_encoding)
            assert key in expected, f"unexpected key {key!r}"
            assert vb == expected[key], f"value of {key!r} differs"
            want = router(key) if router else routing.route_key(key, manifest.num_dbs)
            assert want == db_id, f"key {key!r} stored in shard {db_id}, routes to {want}"
            seen += 1
    assert seen == len(expected)
    assert manifest.row_count == len(expected)


def assert_reader_agrees(root, expected: dict, storage_options=None, decode=lambda v: v, absent=()):
    """``ShardedReader`` finds every written key with its value (and ``None`` for ``absent`` keys)."""
    from airflow_provider_shardyfusion import ShardedReader

    keys = list(expected)
    with ShardedReader(root, storage_options=storage_options, cache_dir=tempfile.mkdtemp()) as reader:
        got = reader.multi_get(keys + list(absent))
        assert got[: len(keys)] == [decode(expected[k]) for k in keys]
        assert got[len(keys):] == [None] * len(absent)
        assert reader.get(keys[0]) == decode(expected[keys[0]])


def int_table(n, seed=0):
    keys = list(range(n))
    random.Random(seed).shuffle(keys)
    return pa.table({"id": pa.array(keys, pa.int64()), "payload": [f"value-{k}" for k in keys]}), {
        k: f"value-{k}".encode() for k in keys
    }
