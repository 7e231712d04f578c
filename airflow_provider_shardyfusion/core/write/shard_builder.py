"""Build one RocksDB shard from Arrow batches with bounded memory (SPEC §6 step 8).

Rows are buffered as Arrow columns until ``sort_run_rows``; each run is sorted by encoded key
(numpy for integer keys, Arrow for strings/bytes) and written as one SST with ``SstFileWriter``
in slices of ``batch_size`` rows (the only place Python objects per row exist).

Two shard layouts (``core.model.manifest.SHARD_LAYOUTS``): "sst" ships the SSTs themselves, one per sort
run, and readers ingest them; "db" ingests them into a RocksDB database here and ships its files.
"sst" spares every shard a database's creation, ingestion, fsyncs and close (a fixed cost even
on tmpfs, the largest left when thousands of small shards are written). Later runs are
checked for keys already stored: at the boundary for presorted input, else by look-ups in a
database (the shard's own with "db"; with "sst" a scratch one that only overlapping runs pay for).

An "sst" shard also gets its key index (``core.write.key_index.KEY_INDEX_FILE``: its keys with empty
values), which a later delta reads instead of the data to learn which keys exist. Each run writes
its keys next to its data; a shard of several runs merges them in a scratch database (large
shards only, where that costs little next to their data).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_shardyfusion.core import scratch
from airflow_provider_shardyfusion.core.errors import InputDataError, show_value
from airflow_provider_shardyfusion.core.model import checksum, encoding
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUT_DB, SHARD_LAYOUT_SST, SHARD_LAYOUTS, ShardFile
from airflow_provider_shardyfusion.core.model.rocksdb_options import ingest_only_options, rocksdb_options
from airflow_provider_shardyfusion.core.write.arrow_codec import first_null_row
from airflow_provider_shardyfusion.core.write.key_index import (
    KEY_INDEX_FILE,
    finish_key_index,
    key_index_file,
    key_index_writer,
    sst_writer,
)

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding
    from airflow_provider_shardyfusion.core.storage.rate_limit import WriteLimiter

__all__ = ["WRITER_SHARD_LAYOUT", "BuiltShard", "ShardBuilder", "compressible", "shard_file_needed"]

log = logging.getLogger(__name__)

# What the Spark writer ships (recorded in the manifest's storage_engine["shard_layout"]).
WRITER_SHARD_LAYOUT = SHARD_LAYOUT_SST


def shard_file_needed(name: str) -> bool:
    """Whether a read-only open needs this file of a freshly built database.

    Only CURRENT, the MANIFEST it names and the SSTs are. Left out: LOCK and LOG*, the empty WAL
    (``*.log``, ingestion bypasses it), IDENTITY (read-only opens do without it), rocksdict's own
    config, and OPTIONS-*: it names options newer than older RocksDB releases know, which makes
    e.g. RocksDB 7.8's ``ldb`` refuse the whole database.
    """
    return name == "CURRENT" or name.startswith("MANIFEST-") or name.endswith(".sst")


# RocksDB keeps a compressed block only if it saved at least an eighth (GoodCompressionRatio);
# blocks are ~4 KiB of consecutive values. The sample: that many blocks, spread over the run.
_KEPT_IF_BELOW = 7 / 8
_SAMPLE_BLOCK_BYTES = 4096
_SAMPLE_BLOCKS = 16


def compressible(values: pa.Array) -> bool:
    """Whether RocksDB's Snappy would shrink blocks of ``values`` (in the order they are written).

    Judged on a few block-sized runs of rows with Arrow's Snappy: values it cannot shrink (random
    bytes, hashes, embeddings, already compressed payloads) are then written uncompressed, which
    spares the attempt and stores the same bytes.
    """
    n = len(values)
    codec = pa.Codec("snappy")
    raw = packed = 0
    for start in range(0, n, max(1, n // _SAMPLE_BLOCKS)):
        # Only the rows that fill a block are copied out: a value may be megabytes.
        window = values.slice(start, _SAMPLE_BLOCK_BYTES)
        sizes = np.cumsum(pc.fill_null(pc.binary_length(window), 0).to_numpy(zero_copy_only=False))
        rows = int(np.searchsorted(sizes, _SAMPLE_BLOCK_BYTES)) + 1
        block = b"".join(v for v in window.slice(0, rows).to_pylist() if v is not None)
        if block:
            raw += len(block)
            packed += len(codec.compress(block, asbytes=True))
    return raw == 0 or packed < raw * _KEPT_IF_BELOW


@dataclass(frozen=True)
class BuiltShard:
    """A shard written to local disk: its folder, row count, key range and files, ready to upload."""

    db_dir: str  # the folder holding ``files``: the database ("db") or the SSTs ("sst")
    row_count: int
    min_key: bytes
    max_key: bytes
    files: tuple[ShardFile, ...]
    timings: dict[str, float] = field(default_factory=dict)
    key_index: ShardFile | None = None  # in ``db_dir`` too ("sst" layout only); uploaded, never data

    @property
    def byte_size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class _Run:
    keys: list[bytes]
    order: np.ndarray | None
    values: pa.Array


class ShardBuilder:
    """Build one shard from batches of rows: encode, sort by encoded key in bounded sort runs, write SST(s)."""

    def __init__(
        self,
        workdir: str,
        key_encoding: KeyEncoding,
        *,
        key_column: str = "key",
        sort_run_rows: int = 1_000_000,
        batch_size: int = 50_000,
        allow_duplicate_keys: bool = False,
        limiter: WriteLimiter | None = None,
        presorted: bool = False,
        memory_dir: str | None = None,
        memory_max_bytes: int = 0,
        shard_layout: str = SHARD_LAYOUT_DB,
    ):
        if shard_layout not in SHARD_LAYOUTS:
            raise ValueError(f"shard_layout {shard_layout!r} is not one of {list(SHARD_LAYOUTS)}")
        self.shard_layout = shard_layout
        self.workdir = workdir
        # Where the SSTs and the database are built; moves to memory_dir for a small one-run shard.
        self._build_dir = workdir
        self.db_dir = self._files_dir(workdir)
        # A memory-backed folder (tmpfs) for shards of at most memory_max_bytes that fit one sort
        # run: RocksDB's dozen fsyncs per database created cost nothing there, and are most of a
        # small shard's time on a disk, which thousands of small shards paid one by one.
        self.memory_dir = memory_dir
        self.memory_max_bytes = memory_max_bytes
        self._memory_workdir: str | None = None
        self.key_encoding = key_encoding
        self.key_kind = encoding.key_kind_of_encoding(key_encoding)
        self.key_column = key_column
        self.sort_run_rows = sort_run_rows
        self.batch_size = batch_size
        self.allow_duplicate_keys = allow_duplicate_keys
        self.limiter = limiter
        # presorted: rows arrive in encoded-key order (Spark sorted them); verify instead of sorting.
        self.presorted = presorted
        self._keys: list[pa.Array] = []
        self._values: list[pa.Array] = []
        self._buffered = 0
        self._db: Any = None
        self._runs = 0
        # "sst": the run files shipped, and those not yet in the scratch look-up database.
        self._ssts: list[str] = []
        self._unchecked_ssts: list[str] = []
        self._key_runs: list[str] = []  # each run's keys, merged into the key index by finish()
        self.rows_written = 0
        self._min: bytes | None = None
        self._max: bytes | None = None
        self.timings: dict[str, float] = {"sort_s": 0.0, "sst_write_s": 0.0, "ingest_s": 0.0, "rate_limit_wait_s": 0.0}
        # workdir is created on first use: a shard built in memory_dir never touches it.

    def _files_dir(self, build_dir: str) -> str:
        return os.path.join(build_dir, "db") if self.shard_layout == SHARD_LAYOUT_DB else build_dir

    # -- input ----------------------------------------------------------------------------------

    def add(self, keys: pa.Array, values: pa.Array) -> None:
        if len(keys) == 0:
            return
        null_at = first_null_row(keys)
        if null_at is not None:
            raise encoding.null_key_error(self.key_column)
        self._keys.append(keys)
        self._values.append(values)
        self._buffered += len(keys)
        if self._buffered >= self.sort_run_rows:
            self._flush_run()

    # -- one sorted run -------------------------------------------------------------------------

    def _sorted_int_keys(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        arr = keys.cast(pa.int64()).to_numpy(zero_copy_only=False) if not pa.types.is_uint64(keys.type) else None
        if arr is None:  # uint64 columns cannot be negative; keep their full range
            u = keys.to_numpy(zero_copy_only=False).astype(np.uint64)
        else:
            if arr.size and arr.min() < 0:
                encoding.encode_key(int(arr[arr < 0][0]), self.key_encoding, column=self.key_column)
            u = arr.astype(np.uint64)
        if self.key_encoding == "u32be" and u.size and u.max() > np.uint64(0xFFFFFFFF):
            encoding.encode_key(int(u[u > np.uint64(0xFFFFFFFF)][0]), self.key_encoding, column=self.key_column)
        if self.presorted:
            self._check_sorted(u[1:] < u[:-1], lambda i: int(u[i]))
            return u, np.arange(len(u))
        # Stability only matters when duplicates are allowed (the last row seen must win).
        order = np.argsort(u, kind="stable" if self.allow_duplicate_keys else "quicksort")
        return u[order], order

    def _check_sorted(self, descending: np.ndarray, key_at: Any) -> None:
        if descending.any():
            at = int(np.argmax(descending)) + 1
            raise InputDataError(
                f"column {self.key_column!r}: key {show_value(key_at(at))} arrives out of order "
                "(rule: with presorted input, rows must come in encoded-key order)"
            )

    def _duplicates(self, sorted_keys: Any, n: int) -> np.ndarray:
        """Boolean mask over positions 1..n-1: True where the key equals its predecessor."""
        if n < 2:
            return np.zeros(0, dtype=bool)
        if isinstance(sorted_keys, np.ndarray):
            return sorted_keys[1:] == sorted_keys[:-1]
        eq = pc.equal(sorted_keys.slice(1), sorted_keys.slice(0, n - 1))
        return eq.to_numpy(zero_copy_only=False).astype(bool)

    def _decode_for_message(self, key_bytes: bytes) -> Any:
        return encoding.decode_key(key_bytes, self.key_encoding)

    def _prepare_run(self) -> _Run:
        keys = pa.concat_arrays(self._keys) if len(self._keys) > 1 else self._keys[0]
        values = pa.concat_arrays(self._values) if len(self._values) > 1 else self._values[0]
        self._keys, self._values, self._buffered = [], [], 0
        n = len(keys)
        order: np.ndarray | None
        if self.key_kind == "int":
            sorted_u, order = self._sorted_int_keys(keys)
            width = 8 if self.key_encoding == "u64be" else 4
            big_endian = sorted_u.astype(">u8" if width == 8 else ">u4")
            dup = self._duplicates(sorted_u, n)
            # A void view turns into bytes objects in C, faster than slicing a bytes buffer,
            # and unlike "S" dtypes it keeps trailing zero bytes.
            key_list = big_endian.view(f"V{width}").tolist()
        else:
            bin_keys = keys.cast(pa.binary()) if not pa.types.is_binary(keys.type) else keys
            if self.key_kind == "string" and not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
                encoding.encode_key(keys[0].as_py(), self.key_encoding, column=self.key_column)
            if self.key_kind == "binary" and (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
                encoding.encode_key(keys[0].as_py(), self.key_encoding, column=self.key_column)
            if self.presorted:
                n_keys = len(bin_keys)
                if n_keys > 1:
                    desc = pc.less(bin_keys.slice(1), bin_keys.slice(0, n_keys - 1))
                    self._check_sorted(desc.to_numpy(zero_copy_only=False).astype(bool), lambda i: keys[i].as_py())
                order = np.arange(n_keys)
                sorted_bin = bin_keys
            else:
                order = pc.sort_indices(bin_keys).to_numpy()
                sorted_bin = bin_keys.take(pa.array(order))
            dup = self._duplicates(sorted_bin, n)
            key_list = sorted_bin.to_pylist()
        if dup.any():
            if not self.allow_duplicate_keys:
                at = int(np.argmax(dup)) + 1
                shown = show_value(self._decode_for_message(key_list[at]))
                raise InputDataError(
                    f"column {self.key_column!r}: duplicate key {shown} (rule: keys must be unique within a snapshot; "
                    "allow_duplicate_keys=True keeps the last row seen, non-deterministically)"
                )
            # Last seen wins: with a stable sort the later row of equal keys comes last.
            keep = np.append(~dup, True)
            order = order[keep]
            key_list = [k for k, kept in zip(key_list, keep, strict=False) if kept]
        elif self.presorted:
            order = None  # rows already in key order: no gather needed
        return _Run(keys=key_list, order=order, values=values)

    def _use_memory_dir(self, final: bool) -> None:
        if not final or self._runs > 0 or self.memory_dir is None or self.memory_max_bytes <= 0:
            return
        size = sum(a.nbytes for a in self._keys) + sum(a.nbytes for a in self._values)
        self._memory_workdir = scratch.memory_workdir(size, self.memory_max_bytes, base=self.memory_dir,
                                                      prefix="shardyfusion-db-")
        if self._memory_workdir is None:
            return  # no usable memory folder: build on disk as usual
        self._build_dir = self._memory_workdir
        self.db_dir = self._files_dir(self._memory_workdir)

    def _flush_run(self, final: bool = False) -> None:  # noqa: C901 - the write hot path: one sort run to one SST, in order
        if not self._keys:
            return
        t0 = time.perf_counter()
        self._use_memory_dir(final)
        run = self._prepare_run()
        t1 = time.perf_counter()
        self.timings["sort_s"] += t1 - t0
        from rocksdict import IngestExternalFileOptions, Rdict, SstFileWriter

        values = run.values if run.order is None else run.values.take(pa.array(run.order))
        opts = rocksdb_options(compress=compressible(values))
        as_db = self.shard_layout == SHARD_LAYOUT_DB
        if as_db and self._db is None:
            os.makedirs(self.db_dir, exist_ok=True)  # creates the build folder too
            self._db = Rdict(self.db_dir, options=opts)
        elif not as_db:
            os.makedirs(self._build_dir, exist_ok=True)
        # A run whose keys overlap those stored before may repeat one of them: refused, or (with
        # allow_duplicate_keys) overwritten, and then counted once so the row count stays exact.
        check_existing = self._runs > 0 and self._max is not None and run.keys[0] <= self._max
        repeated = 0
        if check_existing and self.presorted:
            # Sorted runs only meet at their boundary: the first key is stored already iff it is
            # the largest key stored, so two comparisons replace the look-ups.
            last = self._max
            assert last is not None  # check_existing: something was stored already
            self._check_sorted(np.array([run.keys[0] < last]), lambda _: self._decode_for_message(run.keys[0]))
            if run.keys[0] == self._max:
                if not self.allow_duplicate_keys:
                    self._raise_duplicate(run.keys[0])
                repeated = 1
            check_existing = False
        if check_existing and not as_db:
            self._load_lookup_db(opts)
        sst_path = os.path.join(self._build_dir, f"run-{self._runs:05d}.sst")
        writer = SstFileWriter(options=opts)
        writer.open(sst_path)
        keys_writer = None
        keys_path = os.path.join(self._build_dir, f"keys-run-{self._runs:05d}.sst")
        if not as_db:  # the key index's own options: keys compress well whatever the values are
            keys_writer = sst_writer(keys_path)
        n = len(run.keys)
        for start in range(0, n, self.batch_size):
            ks = run.keys[start : start + self.batch_size]
            vs = values.slice(start, len(ks)).to_pylist()
            if check_existing:
                repeated += self._stored_already(ks)
            if self.limiter is not None and self.limiter.active:
                self.limiter.acquire(len(ks), sum(map(len, ks)) + sum(map(len, vs)))
            deque(map(writer.__setitem__, ks, vs), maxlen=0)  # the per-row loop without Python bytecode
            if keys_writer is not None:
                deque(map(keys_writer.__setitem__, ks, repeat(b"")), maxlen=0)
        writer.finish()
        if keys_writer is not None:
            keys_writer.finish()
            self._key_runs.append(keys_path)
        t2 = time.perf_counter()
        self.timings["sst_write_s"] += t2 - t1
        if as_db:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            self._db.ingest_external_file([sst_path], ingest)
            self.timings["ingest_s"] += time.perf_counter() - t2
        else:
            self._ssts.append(sst_path)
            self._unchecked_ssts.append(sst_path)
        self._min = run.keys[0] if self._min is None else min(self._min, run.keys[0])
        self._max = run.keys[-1] if self._max is None else max(self._max, run.keys[-1])
        self.rows_written += n - repeated
        self._runs += 1
        log.info("shard run %d: %d rows sorted and written (%.2fs sort, %.2fs write)", self._runs, n, t1 - t0, t2 - t1)

    def _load_lookup_db(self, opts: Any) -> None:
        """"sst": bring the earlier runs into a scratch database that answers the look-ups.

        Only unsorted input whose runs overlap gets here (large shards, where a database is no
        measurable cost). The runs are copied in, never moved: the shipped SSTs stay untouched.
        """
        from rocksdict import IngestExternalFileOptions, Rdict

        if self._db is None:
            self._db = Rdict(os.path.join(self._build_dir, "lookup-db"), options=opts)
        if self._unchecked_ssts:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(False)
            for path in self._unchecked_ssts:  # one at a time: runs may overlap each other
                self._db.ingest_external_file([path], ingest)
            self._unchecked_ssts = []

    def _raise_duplicate(self, key: bytes) -> None:
        raise InputDataError(
            f"column {self.key_column!r}: duplicate key {show_value(self._decode_for_message(key))} "
            "(rule: keys must be unique within a snapshot)"
        )

    def _stored_already(self, keys: list[bytes]) -> int:
        """How many of ``keys`` an earlier run stored; a duplicate key error unless they are allowed."""
        found = self._db.get(keys)
        repeated = 0
        for k, v in zip(keys, found, strict=False):
            if v is not None:
                if not self.allow_duplicate_keys:
                    self._raise_duplicate(k)
                repeated += 1
        return repeated

    # -- result ---------------------------------------------------------------------------------

    def finish(self) -> BuiltShard | None:
        """Flush, close and describe the shard's files; ``None`` if no row was added."""
        self._flush_run(final=True)
        if self._runs == 0:
            return None
        if self._db is not None:
            self._db.close()
            self._db = None
        if self.limiter is not None:
            self.timings["rate_limit_wait_s"] = self.limiter.waited_s
        t0 = time.perf_counter()
        if self.shard_layout == SHARD_LAYOUT_SST:
            paths = list(self._ssts)  # run order: a reader ingests them in this order
        else:
            paths = [os.path.join(self.db_dir, name) for name in sorted(os.listdir(self.db_dir))
                     if shard_file_needed(name) and os.path.isfile(os.path.join(self.db_dir, name))]
        files = [ShardFile(name=os.path.basename(p), size=os.path.getsize(p), checksum=checksum.file_checksum(p))
                 for p in paths]
        self.timings["checksum_s"] = time.perf_counter() - t0
        key_index = self._key_index() if self._key_runs else None
        assert self._min is not None
        assert self._max is not None
        return BuiltShard(db_dir=self.db_dir, row_count=self.rows_written, min_key=self._min, max_key=self._max,
                          files=tuple(files), timings=dict(self.timings), key_index=key_index)

    def _key_index(self) -> ShardFile:
        """The shard's key index in ``db_dir``: its one run's keys, or the keys of all its runs merged."""
        from rocksdict import IngestExternalFileOptions, Rdict

        if len(self._key_runs) == 1:
            os.replace(self._key_runs[0], os.path.join(self.db_dir, KEY_INDEX_FILE))
            return key_index_file(self.db_dir)
        t0 = time.perf_counter()
        merged = os.path.join(self._build_dir, "keys-db")
        db = Rdict(merged, ingest_only_options())
        try:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            for path in self._key_runs:  # one at a time: runs of unsorted input overlap
                db.ingest_external_file([path], ingest)
            writer = key_index_writer(self.db_dir)
            deque(map(writer.__setitem__, db.keys(), repeat(b"")), maxlen=0)
            key_index = finish_key_index(writer, self.db_dir)
        finally:
            db.close()
            shutil.rmtree(merged, ignore_errors=True)
        self.timings["key_index_merge_s"] = time.perf_counter() - t0
        return key_index

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            finally:
                self._db = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._memory_workdir is not None:
            shutil.rmtree(self._memory_workdir, ignore_errors=True)
