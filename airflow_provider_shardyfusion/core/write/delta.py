"""Delta layers of one shard (SPEC §13): the change a delta run applies, and compaction.

A delta layer is one SST holding the change of one shard, sorted by encoded key: a put for every
upserted row and a point tombstone for every deleted key. Readers ingest layers oldest first, so
a newer put replaces an older value and a tombstone hides it.

Exact row counts need to know, for every changed key, whether the base snapshot holds it. Full
and compacted layers, and delta layers with enough value bytes, have a key index next to their
data: one SST ``keys-00000.sst`` of its keys with empty values (and a point tombstone per deleted
key), so the key indexes of a shard, ingested oldest first, hold exactly the keys its layers do.
A delta task downloads those (verified) and asks one batched look-up (RocksDB MultiGet) of the
changed keys: it costs the keys of the shards it touches, not their values. A layer without one
(a small delta layer, or written before key indexes existed) is read as its data instead.

A shard's change is sorted in memory: a delta is the change, not the table.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import InputDataError, ShardWriteError, show_value
from airflow_provider_shardyfusion.core.model import checksum, encoding
from airflow_provider_shardyfusion.core.model.manifest import LayerCounts, ShardFile
from airflow_provider_shardyfusion.core.write.key_index import finish_key_index, key_index_writer, shard_file, sst_writer

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardLayer

__all__ = [
    "COMPACT_RUN_ROWS",
    "DELTA_KEY_INDEX_MIN_VALUE_BYTES",
    "FETCH_IN_MEMORY_MAX_BYTES",
    "KEY_INDEX_SHARDS_PER_DB",
    "LAYER_FILE",
    "BuiltLayer",
    "Change",
    "LayerCounts",
    "LayerResult",
    "TaskBase",
    "TaskFiles",
    "base_exists",
    "chain_shards",
    "chain_stats",
    "count_changes",
    "merged_items",
    "select_layer_winners",
    "sorted_changes",
    "write_compacted_layer",
    "write_delta_layer",
]

LAYER_FILE = "layer-00000.sst"
# A delta layer whose values total less gets no key index: the next delta reads the small layer
# itself for about what its index would cost (an SST's fixed overhead dominates both), and a
# delta touching thousands of shards, or a stream batch every minute, would pay a second file per
# shard (an S3 PUT now, a GET per later delta) for nothing. Full and compacted layers always get one.
DELTA_KEY_INDEX_MIN_VALUE_BYTES = 64 * 1024
# Rows written per SST of a compacted layer; a reader ingests them in order (sort runs do not overlap).
COMPACT_RUN_ROWS = 2_000_000
# Base shards whose key indexes one task database of a delta holds at once (``TaskBase``): about
# the shards a task wrote when deltas had 8 tasks per core at 1000 shards: look-ups in a larger
# database stay cheap per key, and a fresh database per few shards cost more than their change.
KEY_INDEX_SHARDS_PER_DB = 64
# Base files up to this size are read into memory, checked there and written once (``TaskFiles``).
FETCH_IN_MEMORY_MAX_BYTES = 8 << 20


@dataclass(frozen=True)
class Change:
    """One changed key of a shard: its encoded bytes and its new value (None: deleted)."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True)
class BuiltLayer:
    """A layer written to local disk: its folder and files, the key range it touches, its counts, rows after it."""

    folder: str
    files: tuple[ShardFile, ...]
    min_key: bytes | None
    max_key: bytes | None
    counts: LayerCounts
    row_count: int  # rows of the shard once this layer is applied (exact)
    key_index: ShardFile | None = None  # in ``folder`` too; uploaded with the files, never data

    @property
    def byte_size(self) -> int:
        return sum(f.size for f in self.files)


def sorted_changes(keys: Sequence[Any], values: Sequence[bytes | None], *, key_encoding: KeyEncoding, key_column: str,
                   allow_duplicate_keys: bool) -> list[Change]:
    """The changes of one shard in encoded-key order; a duplicate key follows SPEC §5."""
    pairs = [(encoding.encode_key(k, key_encoding, column=key_column), v) for k, v in zip(keys, values, strict=True)]
    # A stable sort keeps input order among equal keys, so with duplicates allowed the last row seen wins.
    pairs.sort(key=lambda p: p[0])
    out: list[Change] = []
    for key, value in pairs:
        if out and out[-1].key == key:
            if not allow_duplicate_keys:
                raise InputDataError(
                    f"column {key_column!r}: duplicate key {show_value(encoding.decode_key(key, key_encoding))} in the "
                    "delta (rule: keys must be unique within a snapshot; allow_duplicate_keys=True keeps the last "
                    "row seen, non-deterministically)"
                )
            out[-1] = Change(key, value)
        else:
            out.append(Change(key, value))
    return out


def count_changes(changes: Sequence[Change], exists: Sequence[bool]) -> LayerCounts:
    """Classify each change against whether the base holds its key."""
    puts = sum(1 for c in changes if c.value is not None)
    inserted = sum(1 for c, e in zip(changes, exists, strict=True) if c.value is not None and not e)
    deleted = sum(1 for c, e in zip(changes, exists, strict=True) if c.value is None and e)
    deletes = len(changes) - puts
    return LayerCounts(puts=puts, deletes=deletes, inserted=inserted, updated=puts - inserted, deleted=deleted,
                       deleted_absent=deletes - deleted)


def base_exists(base_db: Any, changes: Sequence[Change]) -> list[bool]:
    """Whether the base shard (an open raw-mode database, or None for an empty shard) holds each key."""
    if base_db is None or not changes:
        return [False] * len(changes)
    found = base_db.get([c.key for c in changes])
    return [v is not None for v in found]


def write_delta_layer(folder: str, changes: Sequence[Change], *, base_db: Any, base_rows: int) -> BuiltLayer:
    """One SST of puts and tombstones in ``folder``, and its key index when the values are worth
    skipping (``DELTA_KEY_INDEX_MIN_VALUE_BYTES``); counts against ``base_db``."""
    if not changes:
        raise ValueError("a delta layer needs at least one change")
    counts = count_changes(changes, base_exists(base_db, changes))
    os.makedirs(folder, exist_ok=True)
    writer = sst_writer(os.path.join(folder, LAYER_FILE))
    indexed = sum(len(c.value) for c in changes if c.value is not None) >= DELTA_KEY_INDEX_MIN_VALUE_BYTES
    keys = key_index_writer(folder) if indexed else None
    for change in changes:
        if change.value is None:
            del writer[change.key]
            if keys is not None:
                del keys[change.key]
        else:
            writer[change.key] = change.value
            if keys is not None:
                keys[change.key] = b""
    writer.finish()
    return BuiltLayer(folder=folder, files=(shard_file(folder, LAYER_FILE),), min_key=changes[0].key,
                      max_key=changes[-1].key, counts=counts, row_count=base_rows + counts.row_delta,
                      key_index=finish_key_index(keys, folder) if keys is not None else None)


def merged_items(base_items: Iterable[tuple[bytes, bytes]], changes: Sequence[Change]) -> Iterator[tuple[bytes, bytes]]:
    """The shard after ``changes``: base rows and changes merged in key order, tombstoned keys dropped."""
    pending = iter(changes)
    nxt = next(pending, None)
    for key, value in base_items:
        while nxt is not None and nxt.key < key:
            if nxt.value is not None:
                yield nxt.key, nxt.value
            nxt = next(pending, None)
        if nxt is not None and nxt.key == key:
            if nxt.value is not None:
                yield key, nxt.value
            nxt = next(pending, None)
            continue
        yield key, value
    while nxt is not None:
        if nxt.value is not None:
            yield nxt.key, nxt.value
        nxt = next(pending, None)


def write_compacted_layer(folder: str, changes: Sequence[Change], *, base_db: Any,
                          run_rows: int = COMPACT_RUN_ROWS) -> BuiltLayer | None:
    """The whole shard (base + changes) as full SST(s) in ``folder``, and its key index; None if it ends up empty."""
    counts = count_changes(changes, base_exists(base_db, changes))
    base_items = base_db.items() if base_db is not None else ()
    os.makedirs(folder, exist_ok=True)
    files: list[ShardFile] = []
    keys: Any = None
    writer, name, in_run, rows = None, "", 0, 0
    first: bytes | None = None
    last: bytes | None = None
    for key, value in merged_items(base_items, changes):
        if writer is None:
            name = f"run-{len(files):05d}.sst"
            writer, in_run = sst_writer(os.path.join(folder, name)), 0
        writer[key] = value
        if keys is None:
            keys = key_index_writer(folder)
        keys[key] = b""
        first = key if first is None else first
        last = key
        in_run += 1
        rows += 1
        if in_run >= run_rows:
            writer.finish()
            files.append(shard_file(folder, name))
            writer = None
    if writer is not None:
        writer.finish()
        files.append(shard_file(folder, name))
    if keys is None:
        return None
    return BuiltLayer(folder=folder, files=tuple(files), min_key=first, max_key=last, counts=counts, row_count=rows,
                      key_index=finish_key_index(keys, folder))


@dataclass(frozen=True)
class LayerResult:
    """What one task attempt reports for one shard of a delta or compaction (``db_url`` None: nothing written)."""

    db_id: int
    attempt: int
    task_attempt_id: int | None
    db_url: str | None
    row_count: int = 0
    files: tuple[ShardFile, ...] = ()
    counts: LayerCounts = field(default_factory=LayerCounts)
    min_key: str | None = None  # hex of the encoded key
    max_key: str | None = None
    key_index: ShardFile | None = None

    def sort_key(self) -> tuple[int, int, str]:
        return (self.attempt, self.task_attempt_id if self.task_attempt_id is not None else -1, self.db_url or "")

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerResult:
        return _LAYER_RESULT_CODEC.from_dict(d)


# A task's result crosses from the executor to the driver as JSON; a malformed one names its field.
_LAYER_RESULT_CODEC = ser.Codec(LayerResult, "layer task result", ShardWriteError)


def select_layer_winners(results: Iterable[LayerResult], num_dbs: int) -> dict[int, LayerResult]:
    """Per shard the attempt with the smallest (attempt, task attempt id, db_url), as for full writes."""
    from airflow_provider_shardyfusion.core.errors import ShardCoverageError

    winners: dict[int, LayerResult] = {}
    for result in results:
        if not 0 <= result.db_id < num_dbs:
            raise ShardCoverageError(f"a task reported shard {result.db_id}, outside [0, {num_dbs})")
        best = winners.get(result.db_id)
        if best is None or result.sort_key() < best.sort_key():
            winners[result.db_id] = result
    return winners


def chain_shards(base: Manifest, run_id: str, winners: dict[int, LayerResult], *, compact: bool) -> tuple[ShardEntry, ...]:
    """The shard entries of a run written on ``base``: each shard's layers, exact rows, key range.

    A delta appends its layer to the shards it changed and lists the base's layers for the others
    (a manifest is self-contained); a compaction has one full layer per non-empty shard.
    """
    from dataclasses import replace

    from airflow_provider_shardyfusion.core.model.manifest import ShardEntry, ShardLayer

    out: list[ShardEntry] = []
    for db_id in range(base.num_dbs):
        before, new = base.shard(db_id), winners.get(db_id)
        if compact:
            if new is not None and new.db_url is not None:
                out.append(ShardEntry(db_id=db_id, db_url=new.db_url, attempt=new.attempt,
                                      task_attempt_id=new.task_attempt_id, row_count=new.row_count,
                                      byte_size=sum(f.size for f in new.files), min_key=new.min_key or "",
                                      max_key=new.max_key or "", files=new.files, key_index=new.key_index))
            continue
        layers = before.all_layers() if before is not None else ()
        if new is None or new.db_url is None:
            if before is not None:
                out.append(replace(before, layers=layers))
            continue
        layer = ShardLayer.of(run_id, new.db_url, "delta", new.files, new.key_index, new.counts)
        layers = (*layers, layer)
        # The key range bounds what any layer touched (deletions may leave it wider than the data).
        lows = [k for k in (before.min_key if before else None, new.min_key) if k]
        highs = [k for k in (before.max_key if before else None, new.max_key) if k]
        out.append(ShardEntry(db_id=db_id, db_url=new.db_url, attempt=new.attempt, task_attempt_id=new.task_attempt_id,
                              row_count=new.row_count, byte_size=sum(x.byte_size for x in layers),
                              min_key=min(lows, key=bytes.fromhex) if lows else "",
                              max_key=max(highs, key=bytes.fromhex) if highs else "", files=new.files,
                              key_index=new.key_index, layers=layers))
    return tuple(out)


def chain_stats(base: Manifest, shards: tuple[ShardEntry, ...], winners: dict[int, LayerResult]) -> dict[str, Any]:
    """Totals of a chain run: exact rows and bytes, and what its layers did."""
    written = [w for w in winners.values() if w.db_url is not None]
    totals = {k: sum(w.counts.to_dict()[k] for w in written) for k in LayerCounts().to_dict()}
    return {"rows": sum(s.row_count for s in shards), "bytes": sum(s.byte_size for s in shards),
            "num_dbs": base.num_dbs, "empty_shards": base.num_dbs - len(shards), "shards_written": len(written),
            "layer_bytes": sum(f.size for w in written for f in w.files), "base_run_id": base.run_id,
            "base_rows": base.row_count, **totals}


class TaskFiles:
    """One local database of a Spark task in ``folder``, filled with its base shards' files, each
    downloaded and verified against the base manifest (size, checksum) before it is ingested."""

    def __init__(self, store: Any, base: Manifest, folder: str):
        self.store, self.base, self.folder = store, base, folder
        self._db: Any = None
        self._files = 0
        self.bytes_read = 0  # what the task downloaded (logged; the benchmark reports it)

    def _task_db(self) -> Any:
        from rocksdict import Rdict

        from airflow_provider_shardyfusion.core.model.rocksdb_options import ingest_only_options

        if self._db is None:  # files of many shards (or layers) overlap in key range
            self._db = Rdict(os.path.join(self.folder, "db"), ingest_only_options())
        return self._db

    def _ingest(self, target: Any, db_id: int, layer: ShardLayer, files: Iterable[ShardFile]) -> None:
        """Download, verify and ingest ``files`` of ``layer`` into ``target`` (the task database or one
        of its column families), in order: a newer put or tombstone wins as in a reader."""
        from rocksdict import IngestExternalFileOptions

        how = IngestExternalFileOptions()
        how.set_move_files(True)
        for f in files:
            local = os.path.join(self.folder, f"in-{self._files:06d}.sst")
            self._files += 1
            key = f"{self.store.key_of(layer.db_url)}/{f.name}"
            source = f"{layer.db_url}/{f.name} (shard {db_id} of base run {self.base.run_id!r})"
            checksum.download_verified(self.store, key, local, f.size, f.checksum, source=source,
                                       in_memory_max=FETCH_IN_MEMORY_MAX_BYTES)
            target.ingest_external_file([local], how)
            self.bytes_read += f.size

    def _restart_db(self) -> None:
        """Drop the task database and its files; the next ``_task_db`` starts an empty one."""
        self.close()
        shutil.rmtree(os.path.join(self.folder, "db"), ignore_errors=True)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class TaskBase(TaskFiles):
    """The keys of the base shards one task's delta reads, ingested into ONE local database in ``folder``.

    A key routes to exactly one shard, so one database answers each shard's ``base_exists``
    exactly, and a task creates one database instead of one per shard: at 1000s of small shards,
    creating, filling and closing a RocksDB per shard (through a reader and its cache) cost more
    than the layers themselves. Each layer is read as its key index (its keys, not its values)
    where it has one, else (written before key indexes) as its data: both hold the same keys and
    tombstones, so a shard mixing the two answers exactly too, and a base written before key
    indexes costs what it did. Each file is verified against the base manifest (size, checksum)
    before it is ingested; a shard's layers go in oldest first, so a newer put or tombstone wins as in a
    reader. For existence checks only: iterating it would mix the task's shards (and the values
    of key indexes are empty). Every ``KEY_INDEX_SHARDS_PER_DB`` shards it starts afresh: the
    files of its shards all overlap in key range, so a look-up visits each one ingested, and a
    task of many shards would pay for all of them on every key.
    """

    def __init__(self, store: Any, base: Manifest, folder: str):
        super().__init__(store, base, folder)
        self._shards_in_db = 0

    def shard_db(self, db_id: int) -> Any:
        """The database holding base shard ``db_id`` (None when the base has no such shard); the one
        returned before it is closed once it holds ``KEY_INDEX_SHARDS_PER_DB`` shards."""
        shard = self.base.shard(db_id)
        if shard is None:
            return None
        if self._shards_in_db >= KEY_INDEX_SHARDS_PER_DB:
            self._restart_db()
            self._shards_in_db = 0
        self._shards_in_db += 1
        db = self._task_db()
        for layer in shard.all_layers():
            self._ingest(db, db_id, layer, (layer.key_index,) if layer.key_index is not None else layer.files)
        return db
