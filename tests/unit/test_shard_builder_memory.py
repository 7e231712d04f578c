"""Small one-run shards are built in the memory-backed folder; larger ones on the work folder."""

from __future__ import annotations

import os

import pyarrow as pa
from rocksdict import AccessType, Options, Rdict

from airflow_provider_shardyfusion.core.write.shard_builder import ShardBuilder


def items(db_dir):
    db = Rdict(db_dir, options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return list(db.items())
    finally:
        db.close()


def test_one_run_shard_within_the_limit_is_built_in_memory_dir_and_removed_on_close(tmp_path):
    mem = tmp_path / "mem"
    mem.mkdir()
    builder = ShardBuilder(str(tmp_path / "work"), "u64be", sort_run_rows=1_000, memory_dir=str(mem),
                           memory_max_bytes=1 << 20)
    builder.add(pa.array([3, 1, 2]), pa.array([b"c", b"a", b"b"]))
    built = builder.finish()
    assert built.db_dir.startswith(str(mem))
    assert items(built.db_dir) == [((i).to_bytes(8, "big"), v) for i, v in [(1, b"a"), (2, b"b"), (3, b"c")]]
    assert {f.name for f in built.files} >= {"CURRENT"}
    builder.close()
    assert os.listdir(mem) == [] and not os.path.exists(tmp_path / "work")


def test_shards_over_the_limit_or_over_one_run_stay_on_the_work_folder(tmp_path):
    mem = tmp_path / "mem"
    mem.mkdir()
    big = ShardBuilder(str(tmp_path / "a"), "u64be", memory_dir=str(mem), memory_max_bytes=10)
    big.add(pa.array(range(100)), pa.array([b"x"] * 100))
    assert big.finish().db_dir.startswith(str(tmp_path / "a"))
    big.close()
    runs = ShardBuilder(str(tmp_path / "b"), "u64be", sort_run_rows=50, memory_dir=str(mem), memory_max_bytes=1 << 20)
    runs.add(pa.array(range(100)), pa.array([b"x"] * 100))  # a full run is flushed before the size is known
    built = runs.finish()
    assert built.db_dir.startswith(str(tmp_path / "b")) and len(items(built.db_dir)) == 100
    runs.close()
    assert os.listdir(mem) == []
