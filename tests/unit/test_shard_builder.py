"""ShardBuilder on real RocksDB files: sort runs, presorted input, duplicates, encodings."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pyarrow as pa
import pytest
from rocksdict import AccessType, Options, Rdict

from airflow_provider_shardyfusion.core.errors import InputDataError, KeyEncodingError
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.model.checksum import file_checksum
from airflow_provider_shardyfusion.core.storage.rate_limit import WriteLimiter
from airflow_provider_shardyfusion.core.write.shard_builder import ShardBuilder, compressible


def build(tmp_path, key_encoding, chunks, **kwargs):
    builder = ShardBuilder(str(tmp_path / "work"), key_encoding, key_column="k", **kwargs)
    for keys, values in chunks:
        builder.add(pa.array(keys), pa.array(values, pa.binary()))
    built = builder.finish()
    db = Rdict(built.db_dir, options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items = list(db.items())
    finally:
        db.close()
    return builder, built, items


@pytest.mark.parametrize("presorted", [False, True])
def test_several_sort_runs_give_one_sorted_exact_database(tmp_path, presorted):
    keys = list(range(10_000))
    if not presorted:
        random.Random(1).shuffle(keys)
    chunks = [(keys[i : i + 700], [b"v%d" % k for k in keys[i : i + 700]]) for i in range(0, 10_000, 700)]
    builder, built, items = build(tmp_path, "u64be", chunks, sort_run_rows=2_000, batch_size=333, presorted=presorted)
    assert [k for k, _ in items] == [encoding.encode_key(k, "u64be") for k in range(10_000)]
    assert all(v == b"v%d" % encoding.decode_key(k, "u64be") for k, v in items)
    assert built.row_count == 10_000
    assert built.min_key == encoding.encode_key(0, "u64be") and built.max_key == encoding.encode_key(9_999, "u64be")
    for f in built.files:
        assert f.checksum == file_checksum(f"{built.db_dir}/{f.name}")
    assert "LOCK" not in {f.name for f in built.files}
    builder.close()


@pytest.mark.parametrize("presorted", [False, True])
def test_duplicate_across_sort_runs_is_named(tmp_path, presorted):
    first = [1, 2, 3, 4] if presorted else [4, 1, 3, 2]
    second = [4, 5, 6] if presorted else [6, 4, 5]
    builder = ShardBuilder(str(tmp_path), "u64be", key_column="user_id", sort_run_rows=4, presorted=presorted)
    builder.add(pa.array(first), pa.array([b"a"] * 4, pa.binary()))
    def add_and_finish() -> None:
        builder.add(pa.array(second), pa.array([b"b"] * 3, pa.binary()))
        builder.finish()

    with pytest.raises(InputDataError, match=r"column 'user_id': duplicate key 4"):
        add_and_finish()
    builder.close()


def test_presorted_input_out_of_order_is_refused(tmp_path):
    builder = ShardBuilder(str(tmp_path), "utf8", key_column="name", presorted=True)
    builder.add(pa.array(["a", "c", "b"]), pa.array([b"1", b"2", b"3"], pa.binary()))
    with pytest.raises(InputDataError, match="'b' arrives out of order"):
        builder.finish()
    builder.close()


def test_allow_duplicate_keys_keeps_the_last_row_seen(tmp_path):
    _, _, items = build(tmp_path, "utf8", [(["x", "y", "x"], [b"first", b"y", b"last"])], allow_duplicate_keys=True)
    assert items == [(b"x", b"last"), (b"y", b"y")]


@pytest.mark.parametrize("presorted", [False, True])
@pytest.mark.parametrize("layout", ["db", "sst"])
def test_allowed_duplicates_across_sort_runs_are_counted_once(tmp_path, presorted, layout):
    """The row count stays exact when a later sort run overwrites keys an earlier one stored."""
    from rocksdict import IngestExternalFileOptions

    first = [1, 2, 3, 4] if presorted else [4, 1, 3, 2]
    second = [4, 5, 6] if presorted else [6, 4, 2]  # unsorted: 4 and 2 again; sorted: only the boundary
    builder = ShardBuilder(str(tmp_path / "work"), "u64be", key_column="k", sort_run_rows=4, presorted=presorted,
                           allow_duplicate_keys=True, shard_layout=layout)
    builder.add(pa.array(first), pa.array([b"a%d" % k for k in first], pa.binary()))
    builder.add(pa.array(second), pa.array([b"b%d" % k for k in second], pa.binary()))
    built = builder.finish()
    if layout == "sst":  # as a reader builds it: the runs ingested in order, the later winning
        db = Rdict(str(tmp_path / "read"), options=Options(raw_mode=True))
        for f in built.files:
            db.ingest_external_file([f"{built.db_dir}/{f.name}"], IngestExternalFileOptions())
    else:
        db = Rdict(built.db_dir, options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items = {encoding.decode_key(k, "u64be"): v for k, v in db.items()}
    finally:
        db.close()
    expected = {**{k: b"a%d" % k for k in first}, **{k: b"b%d" % k for k in second}}
    assert items == expected and built.row_count == len(expected)
    builder.close()


def add_then_finish(builder: ShardBuilder, keys: list[int]) -> None:
    builder.add(pa.array(keys), pa.array([b"a"] * len(keys), pa.binary()))
    builder.finish()


def test_u32be_and_negative_keys_fail_naming_the_value(tmp_path):
    builder = ShardBuilder(str(tmp_path / "a"), "u32be", key_column="id")
    with pytest.raises(KeyEncodingError, match="4294967296"):
        add_then_finish(builder, [1, 2**32])
    builder.close()
    builder = ShardBuilder(str(tmp_path / "b"), "u64be", key_column="id")
    with pytest.raises(KeyEncodingError, match="-7"):
        add_then_finish(builder, [3, -7])
    builder.close()


def test_binary_keys_sort_bytewise_and_rate_limiter_is_used(tmp_path):
    keys = [b"\xff", b"\x00\x01", b"\x00", b"a"]
    limiter = WriteLimiter(rows_per_s=1_000_000, bytes_per_s=None)
    _, built, items = build(tmp_path, "raw", [(keys, [k * 2 for k in keys])], limiter=limiter, batch_size=2)
    assert [k for k, _ in items] == sorted(keys)
    assert all(v == k * 2 for k, v in items)
    assert built.timings["rate_limit_wait_s"] >= 0.0


def test_empty_builder_returns_none(tmp_path):
    builder = ShardBuilder(str(tmp_path), "u64be")
    assert builder.finish() is None
    builder.close()


def test_u32be_keys_ending_in_zero_bytes_keep_their_width(tmp_path):
    keys = [65536, 0, 256, 2**32 - 1, 16777216]
    _, _built, items = build(tmp_path, "u32be", [(keys, [b"%d" % k for k in keys])])
    assert items == [(encoding.encode_key(k, "u32be"), b"%d" % k) for k in sorted(keys)]
    assert all(len(k) == 4 for k, _ in items)


def key_index_items(path: str, tmp_path) -> list[tuple[bytes, bytes]]:
    """What a key index holds, as a writer's existence check sees it: ingested into a database."""
    db = Rdict(str(tmp_path / "keys-read"), options=Options(raw_mode=True))
    try:
        db.ingest_external_file([path])
        return list(db.items())
    finally:
        db.close()


@pytest.mark.parametrize("presorted", [False, True])
@pytest.mark.parametrize("runs", [1, 4])
def test_an_sst_shard_ships_a_key_index_of_exactly_its_keys(tmp_path, presorted, runs):
    """One key index per shard, whatever its sort runs: every key once (repeats across runs allowed), empty values."""
    keys = list(range(0, 2_000, 2))
    if not presorted:
        random.Random(3).shuffle(keys)
    keys.append(keys[-1])  # a repeat in the last run, overwritten by the last row seen
    builder = ShardBuilder(str(tmp_path / "work"), "u64be", key_column="k", sort_run_rows=2_000 if runs == 1 else 300,
                           presorted=presorted, allow_duplicate_keys=True, shard_layout="sst")
    for i in range(0, len(keys), 50):
        builder.add(pa.array(keys[i : i + 50]), pa.array([b"v%d" % k for k in keys[i : i + 50]], pa.binary()))
    built = builder.finish()
    assert len(built.files) == runs and built.row_count == 1_000
    index = built.key_index
    assert index is not None and index.name == "keys-00000.sst" and index.name not in {f.name for f in built.files}
    path = f"{built.db_dir}/{index.name}"
    assert (index.size, index.checksum) == (os.path.getsize(path), file_checksum(path))
    assert key_index_items(path, tmp_path) == [(encoding.encode_key(k, "u64be"), b"") for k in range(0, 2_000, 2)]
    assert index.size < built.byte_size
    builder.close()


def test_a_database_shard_has_no_key_index(tmp_path):
    _, built, _ = build(tmp_path, "u64be", [([3, 1, 2], [b"a", b"b", b"c"])])
    assert built.key_index is None


def _sst_dump(path: str, *args: str) -> str:
    tool = shutil.which("sst_dump")
    assert tool, "sst_dump (Debian's rocksdb-tools, installed by `make install`) is needed to read the SSTs"
    proc = subprocess.run([tool, f"--file={path}", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"sst_dump refused {path}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("kind", ["random", "json"])
def test_values_snappy_cannot_shrink_are_written_uncompressed_and_read_back(tmp_path, kind):
    """Random bytes are stored raw (RocksDB would keep Snappy's blocks only where they save an
    eighth); JSON-like values stay compressed; the key index always is; RocksDB 7.8 reads both."""
    rng = random.Random(7)
    keys = list(range(5_000))
    if kind == "random":
        values = [rng.randbytes(100) for _ in keys]
    else:
        values = [b'{"count":%d,"name":"%040x","score":%r}' % (k, rng.getrandbits(160), k / 7) for k in keys]
    builder = ShardBuilder(str(tmp_path / "work"), "u64be", key_column="k", shard_layout="sst")
    builder.add(pa.array(keys), pa.array(values, pa.binary()))
    built = builder.finish()
    (data,) = built.files
    assert key_index_items(f"{built.db_dir}/{data.name}", tmp_path) == [
        (encoding.encode_key(k, "u64be"), v) for k, v in zip(keys, values, strict=True)]
    assert compressible(pa.array(values, pa.binary())) is (kind == "json")
    algo = "NoCompression" if kind == "random" else "Snappy"
    assert f"SST file compression algo: {algo}" in _sst_dump(f"{built.db_dir}/{data.name}", "--show_properties")
    scanned = _sst_dump(f"{built.db_dir}/{data.name}", "--command=scan", "--output_hex").splitlines()
    assert len([line for line in scanned if "=>" in line]) == len(keys)
    assert built.key_index is not None
    index = f"{built.db_dir}/{built.key_index.name}"
    assert "SST file compression algo: Snappy" in _sst_dump(index, "--show_properties")
    if kind == "random":  # stored raw: the file holds every value byte, and little more
        assert sum(map(len, values)) < data.size < 1.3 * sum(map(len, values)) + 65536
    builder.close()


def test_compressible_judges_block_sized_samples():
    assert compressible(pa.array([], pa.binary())) and compressible(pa.array([None] * 3, pa.binary()))
    assert compressible(pa.array([b"a" * 100] * 1000, pa.binary()))
    rng = random.Random(1)
    assert not compressible(pa.array([rng.randbytes(64) for _ in range(1000)], pa.binary()))
    # Values larger than a block: one per sample, whatever follows it.
    big = [rng.randbytes(1 << 20) for _ in range(4)]
    assert not compressible(pa.array(big * 8, pa.binary()))
    assert compressible(pa.array([b"x" * (1 << 20)] * 32 + [None], pa.binary()))
