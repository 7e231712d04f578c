"""Step 8: a Spark task writes its shard(s) and reports one small result per shard.

One task per shard (partition index == db_id) while ``num_dbs`` fits the cluster's parallelism.
Beyond it, partition ``t`` of ``num_tasks`` holds the contiguous shard ids ``shards_of_task(t)``;
Spark sorts the partition by shard id (and key), and the task writes its shards one after another.
Each shard keeps its own attempt folder, result and winner selection, exactly as with one shard per
task, so task retries and speculation stay safe per shard.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from ..core import serialization as ser
from ..core.errors import ShardWriteError
from ..core.model.encoding import KeyEncoding
from ..core.write.winner import ShardResult
from .faults import NO_FAULTS, Faults

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

__all__ = [
    "RESULT_DDL", "RESULT_SCHEMA", "TaskResult", "WritePlan", "id_runs", "in_task_order", "make_task_fn", "make_write_fn",
    "sample_value", "shard_runs", "shards_of_task", "task_of_shard", "unsample_value", "write_one_shard", "write_task_shards",
]

RESULT_SCHEMA = pa.schema([("result", pa.string())])
RESULT_DDL = "result string"
log = logging.getLogger("shardyfusion.task")
Run = TypeVar("Run")


@dataclass(frozen=True)
class WritePlan:
    """Plain data for the writer closure (no clients, no compiled objects)."""

    output_uri: str
    storage_options: dict[str, Any]
    run_id: str
    key_column: str
    key_encoding: KeyEncoding
    value_format: str
    value_columns: tuple[str, ...]
    batch_size: int
    sort_run_rows: int
    allow_duplicate_keys: bool
    max_writes_per_second: float | None
    max_write_bytes_per_second: float | None
    sample_per_shard: int
    sample_columns: tuple[str, ...]
    presorted: bool = False
    local_dir: str | None = None
    num_dbs: int = 0
    # Several shards per task when num_tasks < num_dbs; rows then carry their id in this column.
    num_tasks: int = 0
    shard_id_column: str | None = None
    # Shards that fit one sort run and this many bytes are built in a memory-backed folder.
    memory_build_max_bytes: int = 64 << 20
    # JSON values encoded by the engine: the column and rule of each error code (value_encoder).
    value_checks: tuple[tuple[str, str], ...] = ()

    @property
    def several_shards_per_task(self) -> bool:
        return self.shard_id_column is not None and 0 < self.num_tasks < self.num_dbs


@dataclass(frozen=True)
class TaskResult:
    """What a shard's task hands the driver (as JSON): the shard it wrote and, for ``verify_routing``,
    the keys it sampled (``sample_value`` form)."""

    shard: ShardResult
    sample: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskResult:
        return _TASK_RESULT_CODEC.from_dict(data)


# Executor to driver, same bundle on both sides; a malformed result names its field.
_TASK_RESULT_CODEC = ser.Codec(TaskResult, "shard task result", ShardWriteError)


def task_of_shard(db_id: int, num_dbs: int, num_tasks: int) -> int:
    """The partition writing ``db_id``: contiguous, balanced ranges of shard ids per partition."""
    return db_id * num_tasks // num_dbs


def shards_of_task(task: int, num_dbs: int, num_tasks: int) -> range:
    """Inverse of ``task_of_shard``: every d with d * num_tasks // num_dbs == task."""
    return range(-(-task * num_dbs // num_tasks), -(-(task + 1) * num_dbs // num_tasks))


def sample_value(v: Any) -> Any:
    return {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v


def unsample_value(v: Any) -> Any:
    return base64.b64decode(v["b64"]) if isinstance(v, dict) and "b64" in v else v


def write_one_shard(plan: WritePlan, batches: Iterator[pa.RecordBatch], *, db_id: int, attempt: int,  # noqa: C901 - the write hot path of one Spark task, step by step as SPEC §6.8 lists it
                    task_attempt_id: int | None, limiter: Any = None, store: Any = None) -> TaskResult:
    """Write the batches of one shard and return its result (the shard + routing sample)."""
    from ..core import layout, scratch
    from ..core.errors import (
        ShardWriteError,
        ShardyfusionError,
    )
    from ..core.model.manifest import stored_files
    from ..core.storage import open_store
    from ..core.storage.rate_limit import WriteLimiter
    from ..core.write.arrow_codec import (
        UTF8_RULE_KEY,
        check_utf8,
        encode_values,
    )
    from ..core.write.shard_builder import WRITER_SHARD_LAYOUT, ShardBuilder

    started = time.perf_counter()
    first = None
    for batch in batches:  # peek: an empty shard does no storage I/O at all
        if batch.num_rows:
            first = batch
            break
    if first is None:
        result = ShardResult(db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=None, row_count=0)
        return TaskResult(result)

    if store is None:
        store = open_store(plan.output_uri, plan.storage_options)
    akey = layout.attempt_key(plan.run_id, db_id, attempt, task_attempt_id)
    db_url = store.uri(akey)
    if limiter is None:
        limiter = WriteLimiter(plan.max_writes_per_second, plan.max_write_bytes_per_second)
    builder = ShardBuilder(
        # A unique path, created only if the shard is built on disk (small shards go to memory).
        os.path.join(plan.local_dir or tempfile.gettempdir(),
                     f"shardyfusion-db{db_id:05d}-a{attempt:02d}-{os.getpid()}-{secrets.token_hex(6)}"),
        plan.key_encoding, key_column=plan.key_column, sort_run_rows=plan.sort_run_rows,
        batch_size=plan.batch_size, allow_duplicate_keys=plan.allow_duplicate_keys, limiter=limiter,
        presorted=plan.presorted, memory_dir=scratch.memory_dir(), memory_max_bytes=plan.memory_build_max_bytes,
        shard_layout=WRITER_SHARD_LAYOUT,
    )
    sample: list[dict[str, Any]] = []
    try:
        def all_batches() -> Iterator[pa.RecordBatch]:
            yield first
            yield from batches

        for batch in all_batches():
            # The single-db path never ran the routing UDF, which checks string keys elsewhere.
            check_utf8(batch.column(plan.key_column), column=plan.key_column, rule=UTF8_RULE_KEY)
            if len(sample) < plan.sample_per_shard:
                take = batch.select(list(plan.sample_columns)).slice(0, plan.sample_per_shard - len(sample))
                sample.extend({k: sample_value(v) for k, v in row.items()} for row in take.to_pylist())
            builder.add(batch.column(plan.key_column), encode_values(batch, plan.value_format, plan.value_columns,
                                                                     checks=plan.value_checks, key_column=plan.key_column))
        built = builder.finish()
        assert built is not None
        t_up = time.perf_counter()
        for f in stored_files(built.files, built.key_index):
            store.upload_file(os.path.join(built.db_dir, f.name), f"{akey}/{f.name}")
        timings = dict(built.timings, upload_s=time.perf_counter() - t_up, task_s=time.perf_counter() - started)
        result = ShardResult(
            db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=db_url, row_count=built.row_count,
            byte_size=built.byte_size, min_key=built.min_key.hex(), max_key=built.max_key.hex(), files=built.files,
            key_index=built.key_index,
            timings=timings,
        )
        log.info("shard %d attempt %d: %d rows, %d bytes written to %s", db_id, attempt, built.row_count, built.byte_size, db_url)
        return TaskResult(result, tuple(sample))
    except ShardyfusionError as exc:
        # Keep the type users act on (e.g. InputDataError); say where it happened.
        raise type(exc)(f"{exc} [shard {db_id}, attempt {attempt}]") from exc
    except Exception as exc:
        raise ShardWriteError(
            f"writing shard {db_id} attempt {attempt} to {db_url} failed after {builder.rows_written} rows: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        builder.close()


def shard_runs(batches: Iterator[pa.RecordBatch], id_column: str) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """``(db_id, batches)`` for each run of equal shard ids, read lazily from one sorted stream."""

    def slices() -> Iterator[tuple[int, pa.RecordBatch]]:
        for batch in batches:
            if batch.num_rows:
                for db_id, start, stop in id_runs(batch, id_column):
                    yield db_id, batch.slice(start, stop - start)

    for db_id, group in itertools.groupby(slices(), key=lambda item: item[0]):
        yield db_id, (b for _, b in group)


def id_runs(batch: pa.RecordBatch, id_column: str) -> Iterator[tuple[int, int, int]]:
    """``(db_id, start, stop)`` for each run of equal shard ids of a non-empty ``batch``, in row order."""
    ids = batch.column(id_column).to_numpy(zero_copy_only=False)
    cuts = (np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist()
    for start, stop in zip([0, *cuts], [*cuts, len(ids)], strict=False):
        yield int(ids[start]), start, stop


def in_task_order(runs: Iterator[tuple[int, Run]], *, task: int, expected: range, num_dbs: int,
                  writes: str) -> Iterator[tuple[int, Run]]:
    """``runs`` of one task (each a shard id and its rows, in any form), checked to be its own shards in increasing id order."""
    from ..core.errors import ShardAssignmentError

    previous = -1
    for db_id, group in runs:
        if db_id not in expected or db_id <= previous:
            # Spark's sort by shard id makes each id one run; anything else means partitioning broke.
            raise ShardAssignmentError(
                f"partition {task} received a row of shard {db_id} after shard {previous}; it writes {writes} "
                f"{expected.start}..{expected.stop - 1} of {num_dbs} in id order"
            )
        previous = db_id
        yield db_id, group


def write_task_shards(plan: WritePlan, batches: Iterator[pa.RecordBatch], *, task: int, attempt: int,
                      task_attempt_id: int | None, faults: Faults = NO_FAULTS) -> Iterator[TaskResult]:
    """Write the shards of one partition, in id order, one after another; one result each."""
    from ..core.storage import open_store
    from ..core.storage.rate_limit import WriteLimiter

    assert plan.shard_id_column is not None
    expected = shards_of_task(task, plan.num_dbs, plan.num_tasks)
    # One bucket per task, as with one shard per task: its shards are written one at a time.
    limiter = WriteLimiter(plan.max_writes_per_second, plan.max_write_bytes_per_second)
    store = None
    for db_id, group in in_task_order(shard_runs(batches, plan.shard_id_column), task=task, expected=expected,
                                      num_dbs=plan.num_dbs, writes="shards"):
        if store is None:  # one client per task (an S3 client costs far more than a small shard)
            store = open_store(plan.output_uri, plan.storage_options)
        faults.before_shard_write(db_id, attempt)
        out = write_one_shard(plan, group, db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id,
                              limiter=limiter, store=store)
        faults.after_shard_write(db_id, attempt, plan.run_id)
        yield out


class _Result(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def make_task_fn(*, several_shards_per_task: bool, run_id: str, faults: Faults,
                 task_shards: Callable[[Iterator[pa.RecordBatch], int, int, int | None], Iterable[_Result]],
                 one_shard: Callable[[Iterator[pa.RecordBatch], int, int, int | None], _Result]):
    """The function the tasks of a full or chain write run (``mapInArrow``), one JSON row of
    ``RESULT_SCHEMA`` per shard written.

    A task writes the contiguous shards of its partition, ``task_shards(batches, task, attempt,
    task_attempt_id)``, or the one shard its partition index names, ``one_shard(batches, db_id,
    attempt, task_attempt_id)``, between the fault points a shard's write has.
    """
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None  # always set inside a Spark task
        part, attempt, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        if several_shards_per_task:
            outs = list(task_shards(batches, part, attempt, tid))
        else:
            faults.before_shard_write(part, attempt)
            outs = [one_shard(batches, part, attempt, tid)]
            faults.after_shard_write(part, attempt, run_id)
        yield pa.RecordBatch.from_pydict({"result": [json.dumps(out.to_dict()) for out in outs]}, schema=RESULT_SCHEMA)

    return write_partition


def make_write_fn(plan: WritePlan, faults: Faults = NO_FAULTS):
    """The task function of a full write."""
    return make_task_fn(
        several_shards_per_task=plan.several_shards_per_task, run_id=plan.run_id, faults=faults,
        task_shards=lambda batches, task, attempt, tid: write_task_shards(plan, batches, task=task, attempt=attempt,
                                                                          task_attempt_id=tid, faults=faults),
        one_shard=lambda batches, db_id, attempt, tid: write_one_shard(plan, batches, db_id=db_id, attempt=attempt,
                                                                       task_attempt_id=tid),
    )
