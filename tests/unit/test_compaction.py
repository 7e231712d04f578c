"""A compaction task's shards on a real chain of real RocksDB files (no Spark): one local database
per task, every shard merged exactly, tombstones dropped, every base file verified (SPEC §13)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import pytest
import rocksdict

from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError
from airflow_provider_shardyfusion.core.model.encoding import encode_binary_value, encode_key
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.spark_jobs.chain_write import ChainPlan, _task_layers
from airflow_provider_shardyfusion.spark_jobs.faults import NO_FAULTS
from tests.reader_probes import record_databases
from tests.snapshot_factory import build_delta, build_snapshot

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.write.delta import LayerResult

NUM_DBS, NUM_TASKS = 24, 3


def compact_plan(root: str, base_ref: str) -> ChainPlan:
    return ChainPlan(output_uri=root, storage_options={}, run_id="compact-t", base_manifest_ref=base_ref,
                     key_column="key", key_encoding="u64be", value_format="binary", value_columns=(),
                     delete_column=None, allow_duplicate_keys=False, compact=True, has_input=False,
                     num_tasks=NUM_TASKS, num_dbs=NUM_DBS)


@pytest.fixture
def chain(file_root):
    """A base of 24 shards and two deltas on it (updates, inserts, deletions of present and absent
    keys, and every key of one shard deleted); returns the live manifest's ref and the model."""
    model = {k: f"v0-{k}" for k in range(600)}
    build_snapshot(file_root, model.items(), num_dbs=NUM_DBS, shard_layout="sst", ssts_per_shard=2)
    steps = [lambda: ({k: f"v1-{k}" for k in range(0, 600, 5)} | {1000 + k: "new" for k in range(30)},
                      [*(k for k in range(1, 600, 11) if k % 5), 5000]),
             lambda: ({k: f"v2-{k}" for k in range(0, 600, 15) if route_key(k, NUM_DBS) != 5},
                      [*(k for k in model if route_key(k, NUM_DBS) == 5), 7000])]
    ref = ""
    for step in steps:
        upserts, deletes = step()
        ref = build_delta(file_root, upserts, deletes).manifest_ref
        model.update(upserts)
        for k in deletes:
            model.pop(k, None)
    return ref, model


def read_layer(store, result: LayerResult, work: str) -> list[tuple[bytes, bytes]]:
    """A compacted layer as uploaded, read back through a database of its own."""
    from airflow_provider_shardyfusion.core.model.rocksdb_options import rocksdb_options

    db = rocksdict.Rdict(os.path.join(work, f"check-{result.db_id}"), rocksdb_options())
    try:
        for f in result.files:
            local = os.path.join(work, f"check-{result.db_id}-{f.name}")
            store.download_file(f"{store.key_of(result.db_url)}/{f.name}", local)
            db.ingest_external_file([local])
        return list(db.items())
    finally:
        db.close()


def test_a_task_compacts_its_shards_in_one_database_exactly(file_root, tmp_path, monkeypatch, chain):
    ref, model = chain
    expected: dict[int, list[tuple[bytes, bytes]]] = {}
    for k, v in sorted(model.items()):
        expected.setdefault(route_key(k, NUM_DBS), []).append((encode_key(k, "u64be"), encode_binary_value(v)))
    for items in expected.values():
        items.sort()
    assert 5 not in expected  # every key of shard 5 was deleted: it compacts to nothing

    # RocksDB runs for real; the wrapper only records each database opened, by any code path.
    opened: list[str] = []
    real = rocksdict.Rdict

    def recording(path, *args, **kwargs):
        opened.append(os.path.realpath(path))
        return real(path, *args, **kwargs)

    results, per_task = [], []
    with monkeypatch.context() as patch:
        patch.setattr(rocksdict, "Rdict", recording)
        record_databases(patch, recording)
        for task in range(NUM_TASKS):
            opened.clear()
            results += _task_layers(compact_plan(file_root, ref), iter([]), task=task, attempt=0, task_attempt_id=9,
                                    faults=NO_FAULTS)
            per_task.append(len(set(opened)))
    # 8 shards a task; a database per shard made 1000s of small shards cost twice their full write.
    assert per_task == [1] * NUM_TASKS

    assert sorted(r.db_id for r in results) == list(range(NUM_DBS))  # every shard of every task
    store = open_store(file_root)
    written = {r.db_id: r for r in results if r.db_url is not None}
    assert set(written) == set(expected)
    for db_id, result in written.items():
        assert read_layer(store, result, str(tmp_path)) == expected[db_id], f"shard {db_id}"
        assert result.row_count == len(expected[db_id])
        assert (result.min_key, result.max_key) == (expected[db_id][0][0].hex(), expected[db_id][-1][0].hex())
    assert sum(r.row_count for r in results) == len(model)


def test_an_altered_base_file_stops_the_compaction_naming_it(file_root, chain):
    ref, _ = chain
    store = open_store(file_root)
    victim = next(o.key for o in store.list("") if o.key.endswith(".sst") and "db=00001" in o.key)
    path = os.path.join(store.root.removeprefix("file://"), victim)
    with open(path, "r+b") as fh:  # one byte flipped mid-file: same size, other checksum
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    named = rf"{re.escape(victim)} \(shard 1 of base run .*\): checksum .* does not match"
    with pytest.raises(ChecksumMismatchError, match=named):
        list(_task_layers(compact_plan(file_root, ref), iter([]), task=0, attempt=0, task_attempt_id=9,
                          faults=NO_FAULTS))
