"""Step 8: one Spark task writes one shard (partition index == db_id) and reports a small result."""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

RESULT_SCHEMA = pa.schema([("result", pa.string())])
RESULT_DDL = "result string"
log = logging.getLogger("shardyfusion.task")


@dataclass(frozen=True)
class WritePlan:
    """Plain data for the writer closure (no clients, no compiled objects)."""

    output_uri: str
    storage_options: dict[str, Any]
    run_id: str
    key_column: str
    key_encoding: str
    value_format: str
    value_columns: tuple[str, ...]
    batch_size: int
    sort_run_rows: int
    allow_duplicate_keys: bool
    max_writes_per_second: float | None
    max_write_bytes_per_second: float | None
    sample_per_shard: int
    sample_columns: tuple[str, ...]
    faults: dict[str, Any]
    presorted: bool = False
    local_dir: str | None = None


def sample_value(v: Any) -> Any:
    return {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v


def unsample_value(v: Any) -> Any:
    return base64.b64decode(v["b64"]) if isinstance(v, dict) and "b64" in v else v


def write_one_shard(plan: WritePlan, batches: Iterator[pa.RecordBatch], *, db_id: int, attempt: int,
                    task_attempt_id: int | None, limiter: Any = None) -> dict[str, Any]:
    """Write the batches of one shard and return its result (ShardResult dict + routing sample)."""
    from airflow_provider_shardyfusion.core import layout
    from airflow_provider_shardyfusion.core.arrow_codec import UTF8_RULE_KEY, check_utf8, encode_values
    from airflow_provider_shardyfusion.core.errors import ShardWriteError, ShardyfusionError
    from airflow_provider_shardyfusion.core.rate_limit import WriteLimiter
    from airflow_provider_shardyfusion.core.shard_builder import ShardBuilder
    from airflow_provider_shardyfusion.core.storage import open_store
    from airflow_provider_shardyfusion.core.winner import ShardResult

    started = time.perf_counter()
    first = None
    for batch in batches:  # peek: an empty shard does no storage I/O at all
        if batch.num_rows:
            first = batch
            break
    if first is None:
        result = ShardResult(db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=None, row_count=0)
        return {"result": result.to_dict(), "sample": []}

    store = open_store(plan.output_uri, plan.storage_options)
    akey = layout.attempt_key(plan.run_id, db_id, attempt, task_attempt_id)
    db_url = store.uri(akey)
    if limiter is None:
        limiter = WriteLimiter(plan.max_writes_per_second, plan.max_write_bytes_per_second)
    builder = ShardBuilder(
        tempfile.mkdtemp(prefix=f"shardyfusion-db{db_id:05d}-a{attempt:02d}-", dir=plan.local_dir),
        plan.key_encoding, key_column=plan.key_column, sort_run_rows=plan.sort_run_rows,
        batch_size=plan.batch_size, allow_duplicate_keys=plan.allow_duplicate_keys, limiter=limiter,
        presorted=plan.presorted,
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
            builder.add(batch.column(plan.key_column), encode_values(batch, plan.value_format, plan.value_columns))
        built = builder.finish()
        assert built is not None
        t_up = time.perf_counter()
        for f in built.files:
            store.upload_file(os.path.join(built.db_dir, f.name), f"{akey}/{f.name}")
        timings = dict(built.timings, upload_s=time.perf_counter() - t_up, task_s=time.perf_counter() - started)
        result = ShardResult(
            db_id=db_id, attempt=attempt, task_attempt_id=task_attempt_id, db_url=db_url, row_count=built.row_count,
            byte_size=built.byte_size, min_key=built.min_key.hex(), max_key=built.max_key.hex(), files=built.files,
            timings=timings,
        )
        log.info("shard %d attempt %d: %d rows, %d bytes written to %s", db_id, attempt, built.row_count, built.byte_size, db_url)
        return {"result": result.to_dict(), "sample": sample}
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


def make_write_fn(plan: WritePlan):
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from . import faults

        tc = TaskContext.get()
        db_id, attempt, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        faults.before_shard_write(plan.faults, db_id, attempt)
        out = write_one_shard(plan, batches, db_id=db_id, attempt=attempt, task_attempt_id=tid)
        faults.after_shard_write(plan.faults, db_id, attempt)
        yield pa.RecordBatch.from_pydict({"result": [json.dumps(out)]}, schema=RESULT_SCHEMA)

    return write_partition
