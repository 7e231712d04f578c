"""Delta and compacted layers (core.write.delta) on real RocksDB files: each ships a key index that
answers existence exactly as its data does (a delta layer when its values are worth skipping)."""

from __future__ import annotations

import os

from rocksdict import Options, Rdict

from airflow_provider_shardyfusion.core.model.checksum import file_checksum
from airflow_provider_shardyfusion.core.model.encoding import decode_key, encode_key
from airflow_provider_shardyfusion.core.write.delta import (
    DELTA_KEY_INDEX_MIN_VALUE_BYTES,
    LAYER_FILE,
    Change,
    write_compacted_layer,
    write_delta_layer,
)
from airflow_provider_shardyfusion.core.write.key_index import KEY_INDEX_FILE, finish_key_index, key_index_writer


def k(i: int) -> bytes:
    return encode_key(i, "u64be")


def ingested(folder: str, paths: list[str]) -> Rdict:
    """A database of ``paths`` ingested oldest first, as readers and the writer's existence check build one."""
    db = Rdict(folder, options=Options(raw_mode=True))
    for path in paths:
        db.ingest_external_file([path])
    return db


def test_the_key_indexes_of_a_shards_layers_answer_existence_as_its_data(tmp_path):
    base = {i: b"base-%d" % i for i in range(100)}
    os.makedirs(tmp_path / "base")
    writer = key_index_writer(str(tmp_path / "base"))
    for i in sorted(base):
        writer[k(i)] = b""
    base_index = finish_key_index(writer, str(tmp_path / "base"))
    base_db = Rdict(str(tmp_path / "base-db"), options=Options(raw_mode=True))
    for i, v in base.items():
        base_db[k(i)] = v
    pad = b"x" * 5000  # 15 values of 5 kB: enough value bytes for a delta layer's key index
    changes = sorted([*(Change(k(i), b"new-%d" % i + pad) for i in [*range(0, 10), *range(100, 105)]),
                      *(Change(k(i), None) for i in [*range(50, 55), 200])], key=lambda c: c.key)
    built = write_delta_layer(str(tmp_path / "delta"), changes, base_db=base_db, base_rows=len(base))
    after = {**base, **{i: b"new-%d" % i + pad for i in [*range(0, 10), *range(100, 105)]}}
    for i in range(50, 55):
        del after[i]
    assert built.counts.to_dict() == {"puts": 15, "deletes": 6, "inserted": 5, "updated": 10, "deleted": 5,
                                      "deleted_absent": 1}
    assert built.row_count == len(after)
    index = built.key_index
    assert index is not None and index.name == KEY_INDEX_FILE and index not in built.files
    index_path = str(tmp_path / "delta" / KEY_INDEX_FILE)
    assert index.checksum == file_checksum(index_path) and index.size == os.path.getsize(index_path)

    keys = ingested(str(tmp_path / "keys-db"), [str(tmp_path / "base" / base_index.name), index_path])
    data = ingested(str(tmp_path / "data-db"), [str(tmp_path / "delta" / f.name) for f in built.files])
    try:
        probes = [k(i) for i in range(0, 210)]
        assert [v is not None for v in keys.get(probes)] == [i in after for i in range(0, 210)]
        assert set(keys.get([k(i) for i in after])) == {b""}  # keys only: no value is copied
        # Its data layer, read alone, holds the puts (values included); the tombstones hide nothing there.
        assert [(decode_key(key, "u64be"), v) for key, v in data.items()] == [
            (i, b"new-%d" % i + pad) for i in [*range(0, 10), *range(100, 105)]]
    finally:
        keys.close()
        data.close()

    compacted = write_compacted_layer(str(tmp_path / "compact"), changes, base_db=base_db, run_rows=40)
    base_db.close()
    assert compacted is not None and len(compacted.files) == 3 and compacted.key_index is not None
    keys = ingested(str(tmp_path / "compact-keys"), [str(tmp_path / "compact" / KEY_INDEX_FILE)])
    try:
        assert list(keys.items()) == [(k(i), b"") for i in sorted(after)]  # one file, tombstones dropped
    finally:
        keys.close()


def test_a_small_delta_layer_has_no_key_index_and_still_counts_exactly(tmp_path):
    """Below DELTA_KEY_INDEX_MIN_VALUE_BYTES of values a delta layer ships its data alone: the next
    delta reads it for what an index would cost, and a shard saves a file."""
    base_db = Rdict(str(tmp_path / "base-db"), options=Options(raw_mode=True))
    for i in range(10):
        base_db[k(i)] = b"base"
    changes = sorted([Change(k(1), b"a"), Change(k(20), b"b"), Change(k(2), None), Change(k(30), None)],
                     key=lambda c: c.key)
    assert sum(len(c.value or b"") for c in changes) < DELTA_KEY_INDEX_MIN_VALUE_BYTES
    built = write_delta_layer(str(tmp_path / "delta"), changes, base_db=base_db, base_rows=10)
    base_db.close()
    assert built.key_index is None and os.listdir(tmp_path / "delta") == [LAYER_FILE]
    assert built.counts.to_dict() == {"puts": 2, "deletes": 2, "inserted": 1, "updated": 1, "deleted": 1,
                                      "deleted_absent": 1}
    assert built.row_count == 10
