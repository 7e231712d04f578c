"""Delta and compaction runs (SPEC §13), on the Spark driver and in its tasks.

The driver resolves the base run, takes its routing, encodings and shard count, routes the changed
rows with the base's sharding and partitions them by shard id (partition index == shard id, as for
full writes). A delta task reads the key indexes of its base shards into one local database
(``core.write.delta.TaskBase``) to learn which changed keys exist; a compaction task merges its
base shards one at a time in one local database (``core.write.compaction.TaskCompaction``). Each
writes one layer per shard: the change (delta) or the whole merged shard (compaction, every shard
of the task). Shards without changes get no layer in a delta and keep theirs.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core import layout, scratch
from ..core.errors import ConfigError
from ..core.model import encoding
from .faults import NO_FAULTS, Faults
from .shard_task import RESULT_DDL

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa

    from ..core.model.chain import ResolvedManifest
    from ..core.model.config import WriteConfig
    from ..core.model.manifest import Manifest
    from ..core.model.snapshot import SnapshotRoot
    from ..core.write.compaction import TaskCompaction
    from ..core.write.delta import BuiltLayer, Change, LayerResult, TaskBase

__all__ = [
    "ChainPlan",
    "check_against_base",
    "make_layer_fn",
    "resolve_base",
    "task_base",
    "write_layer",
    "write_layers",
]

log = logging.getLogger("shardyfusion.job")
LAYER_MEMORY_MAX_BYTES = 64 << 20  # as full writes' memory_build_max_bytes


@dataclass(frozen=True)
class ChainPlan:
    """Plain data for the layer-writing closure."""

    output_uri: str
    storage_options: dict[str, Any]
    run_id: str
    base_manifest_ref: str
    key_column: str
    key_encoding: encoding.KeyEncoding
    value_format: str
    value_columns: tuple[str, ...]
    delete_column: str | None
    allow_duplicate_keys: bool
    compact: bool
    has_input: bool
    # Tasks of the job and shards of the base: with fewer tasks than shards (driver._num_tasks: 8
    # per core for a compaction, as for full writes, 1 for a delta), task t writes the layers of
    # shards_of_task(t) one after another.
    num_tasks: int = 0
    num_dbs: int = 0
    # JSON values encoded by the engine: the column and rule of each error code (value_encoder).
    value_checks: tuple[tuple[str, str], ...] = ()

    @property
    def several_shards_per_task(self) -> bool:
        return 0 < self.num_tasks < self.num_dbs


def resolve_base(snapshots: SnapshotRoot, config: WriteConfig) -> tuple[str, ResolvedManifest]:
    """The base run's manifest URI and whole snapshot: ``base_run_id``, else the run ``_CURRENT`` names now.

    Checked before any input is read: a base cleanup deleted is named so, a run meant to go live
    (``publish=True``) on a base that is not live is refused, as its publish would be, and so is a
    base whose chain was altered since this process resolved it (``SnapshotRoot.check_chain``).
    """
    from ..core.errors import BaseNotLiveError
    from ..core.lifecycle.integrity import deletion_problems
    from ..core.model.snapshot import base_not_live

    mode = config.delta.write_mode
    pointer = snapshots.current()
    base_run_id = config.delta.base_run_id
    if base_run_id is not None:
        record = snapshots.read_run(base_run_id)
        gone = deletion_problems(record, f"base_run_id {base_run_id!r}") if record is not None else []
        if gone:
            raise ConfigError(f"write_mode {mode!r}: {gone[0]}; write on a run that still has its data")
        live = pointer.run_id if pointer is not None else None
        if config.options.publish and live != base_run_id:
            raise BaseNotLiveError(
                f"{base_not_live(config.run_id, base_run_id, live)}; with publish=True nothing was written. Write "
                "the change on the live snapshot (leave base_run_id unset), or stage it with publish=False"
            )
        ref = snapshots.resolve_manifest(run_id=base_run_id)
        return ref.uri, snapshots.read_manifest_chain(ref, check_bases=True)
    if pointer is None:
        raise ConfigError(
            f"write_mode {mode!r} needs a published snapshot to write on, but {snapshots.root} has none "
            "(_CURRENT is missing) and no base_run_id is given; a first write is write_mode 'full'"
        )
    return pointer.manifest_ref, snapshots.read_manifest_chain(pointer, check_bases=True)


def check_against_base(config: WriteConfig, base: Manifest) -> WriteConfig:  # noqa: C901 - one check per inherited setting, each naming both values
    """A chain inherits routing, encodings, shard count and value format: anything given must agree,
    naming both values. Returns the config with the base's value settings where none were given."""
    conflicts = []
    sharding = config.sharding
    if base.shard_layout != "sst":
        raise ConfigError(f"base run {base.run_id!r} ships its shards as database folders (shard_layout "
                          f"{base.shard_layout!r}); deltas need SST shards: write a full snapshot first")
    if config.key_column != base.sharding.key_column:
        conflicts.append(f"key_column {config.key_column!r} vs the base's {base.sharding.key_column!r}")
    if not sharding.unset:
        if sharding.strategy != base.sharding.strategy:
            conflicts.append(f"sharding {sharding.strategy!r} vs the base's {base.sharding.strategy!r}")
        if sharding.num_dbs is not None and sharding.num_dbs != base.num_dbs:
            conflicts.append(f"num_dbs {sharding.num_dbs} vs the base's {base.num_dbs}")
        if sharding.max_keys_per_shard is not None:
            conflicts.append("max_keys_per_shard (a chain keeps the base's num_dbs "
                             f"{base.num_dbs})")
        if sharding.cel_expr is not None and sharding.cel_expr != base.sharding.cel_expr:
            conflicts.append(f"cel_expr {sharding.cel_expr!r} vs the base's {base.sharding.cel_expr!r}")
    if config.key_encoding is not None and config.key_encoding != base.key_encoding:
        conflicts.append(f"key_encoding {config.key_encoding!r} vs the base's {base.key_encoding!r}")
    value = config.value
    if config.delta.write_mode == "delta":
        value, value_conflicts = config.value.on_base(base.value_format, base.value_columns)
        conflicts += value_conflicts
    if conflicts:
        raise ConfigError(f"write_mode {config.delta.write_mode!r} on base run {base.run_id!r}: " + "; ".join(conflicts)
                          + " (a chain keeps the base's sharding and encodings; leave them unset or write a full snapshot)")
    return replace(config, value=value)


def _decoded(plan: ChainPlan, batch: pa.RecordBatch) -> tuple[list[Any], list[bytes | None]]:
    """The keys and encoded values (None: deleted) of a batch's rows, checked as a change's rows are."""
    from ..core.write.arrow_codec import (
        UTF8_RULE_KEY,
        check_utf8,
        delete_flags,
        encode_values,
        first_null_row,
    )

    key_col = batch.column(plan.key_column)
    if first_null_row(key_col) is not None:
        raise encoding.null_key_error(plan.key_column)
    check_utf8(key_col, column=plan.key_column, rule=UTF8_RULE_KEY)
    encoded = encode_values(batch, plan.value_format, plan.value_columns, checks=plan.value_checks,
                            key_column=plan.key_column).to_pylist()
    if plan.delete_column is not None:
        flags = delete_flags(batch, plan.delete_column, key_column=plan.key_column)
        encoded = [None if flag else v for v, flag in zip(encoded, flags, strict=True)]
    return key_col.to_pylist(), encoded


def _changes_of(plan: ChainPlan, batches: Iterator[pa.RecordBatch]) -> list[Change]:
    keys: list[Any] = []
    values: list[bytes | None] = []
    for batch in batches:
        if batch.num_rows:
            more_keys, more_values = _decoded(plan, batch)
            keys += more_keys
            values += more_values
    return _sorted(plan, keys, values)


def _sorted(plan: ChainPlan, keys: list[Any], values: list[bytes | None]) -> list[Change]:
    from ..core.write.delta import sorted_changes

    return sorted_changes(keys, values, key_encoding=plan.key_encoding, key_column=plan.key_column,
                          allow_duplicate_keys=plan.allow_duplicate_keys)


def _changes_by_shard(plan: ChainPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, list[Change]]]:
    """``(db_id, changes)`` per run of equal shard ids of a task's stream (sorted by shard id).

    Each batch is checked and encoded once, whatever number of shards it holds: per shard, the
    Arrow calls cost more than a small delta's rows (1000s of shards a run)."""
    from .routing_task import SHARD_ID_COL
    from .shard_task import id_runs

    current, keys, values = -1, [], []  # type: tuple[int, list[Any], list[bytes | None]]
    for batch in batches:
        if not batch.num_rows:
            continue
        batch_keys, batch_values = _decoded(plan, batch)
        for db_id, start, stop in id_runs(batch, SHARD_ID_COL):
            if db_id != current:
                if keys:
                    yield current, _sorted(plan, keys, values)
                current, keys, values = db_id, [], []
            keys += batch_keys[start:stop]
            values += batch_values[start:stop]
    if keys:
        yield current, _sorted(plan, keys, values)


@contextlib.contextmanager
def task_base(plan: ChainPlan) -> Iterator[TaskBase | TaskCompaction]:
    """The one local database of the base shards this task reads: a delta's for its existence
    checks (``core.write.delta.TaskBase``), a compaction's to merge them one at a time
    (``core.write.compaction.TaskCompaction``)."""
    from ..core.model.snapshot import SnapshotRoot
    from ..core.storage import open_store
    from ..core.write.compaction import TaskCompaction
    from ..core.write.delta import TaskBase

    store = open_store(plan.output_uri, plan.storage_options)
    base = SnapshotRoot(store).read_manifest(plan.base_manifest_ref)  # decoded once per process
    shared: TaskBase | TaskCompaction
    if plan.compact:  # in memory when the largest shard fits as its layer would
        largest = max((s.byte_size for s in base.shards), default=0)
        folder = scratch.memory_workdir(largest, LAYER_MEMORY_MAX_BYTES, prefix="shardyfusion-compact-") \
            or tempfile.mkdtemp(prefix="shardyfusion-compact-")
        shared = TaskCompaction(store, base, folder)
    else:
        # A delta's base shards are read for existence only; in memory they cost no fsync.
        folder = scratch.memory_workdir(0, 1, prefix="shardyfusion-base-") or tempfile.mkdtemp(prefix="shardyfusion-base-")
        shared = TaskBase(store, base, folder)
    try:
        yield shared
    finally:
        shared.close()
        shutil.rmtree(folder, ignore_errors=True)


def write_layer(plan: ChainPlan, changes: list[Change], *, db_id: int, attempt: int, task_attempt_id: int | None,
                base: TaskBase | TaskCompaction, work: scratch.TaskScratch) -> LayerResult:
    """One shard's layer: read the base shard, write the change (or the merged shard), upload it.

    ``changes``: the shard's, sorted (``_changes_of``); ``base``: the base shards of this task
    (``task_base``); ``work``: the task's scratch folders (``_layer_scratch``)."""
    from ..core.errors import ShardWriteError, ShardyfusionError
    from ..core.model.manifest import stored_files
    from ..core.write.delta import LayerResult, write_compacted_layer, write_delta_layer

    if not changes and not plan.compact:
        return LayerResult(db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=None)
    store = base.store  # the task's: one client for all its shards
    akey = layout.attempt_key(plan.run_id, db_id, attempt, task_attempt_id)
    db_url = store.uri(akey)
    # A layer is built in memory where there is room: SstFileWriter.finish's fsync on a busy disk
    # cost more than the layer (thousands of shards). A delta's is its change; a compacted one at
    # most the base shard and the change.
    entry = base.base.shard(db_id)
    layer_bytes = sum(len(c.key) + len(c.value or b"") for c in changes) \
        + (entry.byte_size if plan.compact and entry is not None else 0)
    try:
        with work.folder(layer_bytes) as folder:
            built: BuiltLayer | None
            if not plan.compact:
                built = write_delta_layer(folder, changes, base_db=base.shard_db(db_id),
                                          base_rows=entry.row_count if entry is not None else 0)
            else:
                built = write_compacted_layer(folder, changes, base_db=base.shard_db(db_id))
            if built is None:  # compacted to nothing: an empty shard
                return LayerResult(db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=None)
            for f in stored_files(built.files, built.key_index):
                store.upload_file(os.path.join(built.folder, f.name), f"{akey}/{f.name}")
        log.info("shard %d attempt %d: %s layer of %d file(s), %d bytes, %s -> %d rows, written to %s", db_id, attempt,
                 "compacted" if plan.compact else "delta", len(built.files), built.byte_size, built.counts.to_dict(),
                 built.row_count, db_url)
        return LayerResult(db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=db_url,
                           row_count=built.row_count, files=built.files, key_index=built.key_index, counts=built.counts,
                           min_key=built.min_key.hex() if built.min_key is not None else None,
                           max_key=built.max_key.hex() if built.max_key is not None else None)
    except ShardyfusionError as exc:
        raise type(exc)(f"{exc} [shard {db_id}, attempt {attempt}]") from exc
    except Exception as exc:
        raise ShardWriteError(f"writing the layer of shard {db_id} attempt {attempt} to {db_url} failed: "
                              f"{type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _layer_scratch() -> Iterator[scratch.TaskScratch]:
    """The scratch folders a task builds its layers in: one in memory for all its shards where they fit."""
    work = scratch.TaskScratch(LAYER_MEMORY_MAX_BYTES, prefix="shardyfusion-layers-")
    try:
        yield work
    finally:
        work.close()


def _every_shard(runs: Iterator[tuple[int, list[Change]]], expected: range) -> Iterator[tuple[int, list[Change]]]:
    """``runs`` (in id order) with an empty one for each shard of ``expected`` they lack: a
    compaction writes every shard of its task, changed or not (an auto-compacted delta's rows
    reach only the shards they change)."""
    pending = next(runs, None)
    for db_id in expected:
        if pending is not None and pending[0] == db_id:
            yield pending
            pending = next(runs, None)
        else:
            yield db_id, []


def _task_layers(plan: ChainPlan, batches: Iterator[pa.RecordBatch], *, task: int, attempt: int,
                 task_attempt_id: int | None, faults: Faults) -> Iterator[LayerResult]:
    """The layers of one task's shards, in id order: a delta's from its rows (sorted by shard id),
    a compaction's for every shard of the task."""
    from .shard_task import in_task_order, shards_of_task

    expected = shards_of_task(task, plan.num_dbs, plan.num_tasks)
    if plan.has_input:
        runs: Iterator[tuple[int, list[Change]]] = _changes_by_shard(plan, batches)
    else:
        collections.deque(batches, maxlen=0)  # the placeholder row: read, so the worker is reused
        runs = iter(())
    runs = in_task_order(runs, task=task, expected=expected, num_dbs=plan.num_dbs, writes="the layers of shards")
    if plan.compact:
        runs = _every_shard(runs, expected)
    with task_base(plan) as base, _layer_scratch() as work:
        for db_id, changes in runs:
            faults.before_shard_write(db_id, attempt)
            out = write_layer(plan, changes, db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, base=base,
                              work=work)
            faults.after_shard_write(db_id, attempt, plan.run_id)
            yield out


def make_layer_fn(plan: ChainPlan, faults: Faults = NO_FAULTS):
    """The task function of a delta or compaction."""
    from .shard_task import make_task_fn

    def one_shard(batches: Iterator[pa.RecordBatch], db_id: int, attempt: int, tid: int | None) -> LayerResult:
        changes = _changes_of(plan, batches) if plan.has_input else []
        with task_base(plan) as base, _layer_scratch() as work:
            out = write_layer(plan, changes, db_id=db_id, attempt=attempt, task_attempt_id=tid, base=base, work=work)
        # PySpark reuses a Python worker only once it has read its task's whole input; a compaction
        # never reads its one placeholder row, which made every task start a new worker.
        collections.deque(batches, maxlen=0)
        return out

    return make_task_fn(
        several_shards_per_task=plan.several_shards_per_task, run_id=plan.run_id, faults=faults,
        task_shards=lambda batches, task, attempt, tid: _task_layers(plan, batches, task=task, attempt=attempt,
                                                                     task_attempt_id=tid, faults=faults),
        one_shard=one_shard,
    )


def write_layers(spark, df, routing_plan: Any, plan: ChainPlan, num_dbs: int,
                 faults: Faults = NO_FAULTS) -> list[LayerResult]:
    """Run the layer tasks (one per shard, or ``plan.num_tasks`` each writing a contiguous range of
    shards, as full writes do: a task per small shard cost more in scheduling than its layer) and
    collect their results."""
    from .routing_task import SHARD_ID_COL, by_task, with_shard_id

    tasks = plan.num_tasks if plan.several_shards_per_task else num_dbs
    if df is None:  # a compaction reads no input: one placeholder row per task, partition index == task
        partitioned = spark.range(0, tasks, 1, tasks)
    else:
        keep = [plan.key_column, *plan.value_columns, *([plan.delete_column] if plan.delete_column else [])]
        routed = with_shard_id(df, routing_plan, faults)
        if plan.several_shards_per_task:
            partitioned = by_task(routed, tasks, num_dbs, [SHARD_ID_COL]).select(*dict.fromkeys([*keep, SHARD_ID_COL]))
        else:
            partitioned = routed.repartitionById(num_dbs, SHARD_ID_COL).select(*dict.fromkeys(keep))
    rows = partitioned.mapInArrow(make_layer_fn(plan, faults), RESULT_DDL).collect()
    from ..core.write.delta import LayerResult

    return [LayerResult.from_dict(json.loads(r.result)) for r in rows]
