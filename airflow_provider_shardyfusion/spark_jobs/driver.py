"""The write flow of SPEC §6, run on the Spark driver. Each step logs with the run id."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import platform
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .. import __version__ as provider_version
from ..core import layout
from ..core.errors import (
    ConfigError,
    InputDataError,
    ShardAssignmentError,
    show_value,
)
from ..core.model import encoding, routing, value_schema
from ..core.model.manifest import (
    CHAIN_DOCUMENT_FORMAT_VERSION,
    CHAIN_FORMAT_VERSION,
    Manifest,
    ShardingInfo,
)
from ..core.model.run_record import RunRecord, RunRecordLifecycle
from ..core.retry import NO_RETRY, call_with_retry
from ..core.storage import open_store
from ..core.write.commit import delete_losing_attempts, publish
from ..core.write.job_contract import RunStats, TaskTry, WriterIdentity
from ..core.write.metrics import report_write
from ..core.write.winner import WinnerSelection, select_winners
from . import errors as job_errors
from . import session_info, spark_types
from .conf_overrides import spark_conf_overrides
from .faults import NO_FAULTS, Faults
from .routing_task import SHARD_ID_COL, RoutingPlan, by_task, make_token_fn, with_shard_id
from .shard_task import RESULT_DDL, TaskResult, WritePlan, make_write_fn, shards_of_task, unsample_value, write_one_shard
from .value_encoder import EngineValues, encode_json_in_engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..core.model.config import WriteConfig

__all__ = [
    "DELTA_TASKS_PER_CORE", "TASKS_PER_CORE", "read_input", "run_write", "writer_info",
]

log = logging.getLogger("shardyfusion.job")


class _Step:
    """Log a step's start and duration, and keep the duration for the manifest stats."""

    def __init__(self, run_id: str, durations: dict[str, float], name: str):
        self.run_id, self.durations, self.name = run_id, durations, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        log.info("run %s: %s ...", self.run_id, self.name)

    def __exit__(self, *exc: Any) -> None:
        took = time.perf_counter() - self.t0
        self.durations[self.name] = round(self.durations.get(self.name, 0.0) + took, 3)
        if exc[0] is None:
            log.info("run %s: %s done in %.2fs", self.run_id, self.name, took)


def read_input(spark, config: WriteConfig):
    spec = config.input
    try:
        if spec.table:
            return spark.table(spec.table)
        if spec.sql:
            return spark.sql(spec.sql)
        return spark.read.format(spec.format).options(**spec.options).load(spec.path)
    except Exception as exc:  # Spark's analysis / parse errors: name the argument that caused them
        if spec.table:
            what = f"input_table {spec.table!r}"
        elif spec.sql:
            what = f"input_sql {show_value(spec.sql)}"
        else:
            what = f"input_path {spec.path!r} (input_format {spec.format!r})"
        detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError(f"{what} cannot be read: {detail}") from exc


def writer_info(spark, config: WriteConfig) -> WriterIdentity:
    return WriterIdentity(
        provider="airflow-provider-shardyfusion", provider_version=provider_version, spark_version=spark.version,
        python_version=platform.python_version(), spark_app_id=session_info.app_id(spark),
        spark_ui_url=session_info.ui_url(spark), publish=config.options.publish is True,
        airflow=TaskTry.from_dict(config.airflow_context) if config.airflow_context else None,
    )


def run_write(spark, config: WriteConfig, *, faults: Faults = NO_FAULTS, df: Any = None,
              stream_batch: tuple[str, int] | None = None, fence: Callable[[], None] | None = None) -> RunRecord:
    """Run the whole write; return the succeeded run record. Raises provider errors.

    ``faults``: test-only (``spark_jobs.faults``), resolved by the job's entry script.
    ``df``: a DataFrame written instead of reading ``config.input`` (a streaming micro-batch).
    ``stream_batch``: ``(stream_id, batch_id)`` of a micro-batch, named in the ``writer`` of the run record
    and the manifest. ``fence``: called just before the run is committed; raising there fails the run,
    unpublished (a streaming writer checks it still holds its stream: ``core.write.commit.publish``).
    """
    config.validate()
    store = open_store(config.output_uri, config.storage_options)
    run_id = config.run_id
    durations: dict[str, float] = {}
    writer = writer_info(spark, config)
    if stream_batch is not None:
        writer = replace(writer, stream_id=stream_batch[0], batch_id=stream_batch[1])
    lifecycle = RunRecordLifecycle(
        store, run_id, lease_seconds=config.options.lease_seconds, heartbeat_seconds=config.options.heartbeat_seconds,
        num_dbs=config.sharding.num_dbs, config_fingerprint=config.fingerprint(),
        writer=writer.to_dict(),
        clock=faults.clock(),
    )
    log.info("run %s: writing %s (config %s)", run_id, config.output_uri, config.fingerprint())
    persisted: list[Any] = []  # the input, if persisted: unpersisted however the write ends
    with spark_conf_overrides(spark, config.spark_conf_overrides), lifecycle:
        try:
            lifecycle.check_clock()
            if config.delta.chained:
                manifest = _write_chain(spark, config, store, lifecycle, durations, faults, df)
            else:
                manifest = _write_full(spark, config, lifecycle, durations, faults, persisted, df)
            if stream_batch is not None:
                manifest = replace(manifest, writer=writer.to_dict())
            stats = dict(manifest.stats, durations_s=dict(durations))
            faults.hold_point("hold_before_publish", run_id)
            with _Step(run_id, durations, "publish"):
                record = publish(store, manifest, lifecycle, stats=stats, live=config.options.publish, fence=fence,
                                 before_pointer_move=lambda: faults.hold_point("hold_before_pointer", run_id))
        except BaseException as exc:
            job_errors.raise_translated(exc)
        finally:
            for cached in persisted:
                cached.unpersist(blocking=False)
    with _Step(run_id, durations, "delete_losers"):
        deleted, failures = delete_losing_attempts(store, run_id, [s.db_url for s in manifest.shards])
        log.info("run %s: deleted %d objects of non-winning attempts (%d failures)", run_id, deleted, len(failures))
    # What was written (an automatic compaction says compact), as the manifest records it.
    report_write(record.stats, durations, write_mode=manifest.write_mode)
    return record


def _write_full(spark, config: WriteConfig, lifecycle: RunRecordLifecycle, durations: dict[str, float],
                faults: Faults, persisted: list[Any], source: Any = None) -> Manifest:
    """A full write: read, route, write every shard, verify, select winners; the manifest to publish."""
    run_id = config.run_id
    with _Step(run_id, durations, "read_input"):
        df = read_input(spark, config) if source is None else source
        key_kind = spark_types.key_kind(df.schema, config.key_column)
        key_encoding = (encoding.validate_key_encoding(config.key_encoding) if config.key_encoding
                        else encoding.default_key_encoding(key_kind))
        if encoding.key_kind_of_encoding(key_encoding) != key_kind:
            raise ConfigError(
                f"key_encoding {key_encoding!r} does not fit key_column {config.key_column!r} of kind {key_kind}"
            )
        for col in config.value.value_columns():
            spark_types.field_of(df.schema, col, what="value column")
        encode, values = _engine_values(df, config, keep=[config.key_column, *_cel_column_names(config)])
        # Encoded after the shuffle: the exchange and the shard sort move the typed columns, smaller
        # than their JSON text; only the columns the write reads are kept (and cached, if asked).
        df = encode.needed(df)
    needs_prepass = config.sharding.max_keys_per_shard is not None or config.sharding.infer_routing_values
    if config.options.cache_input or needs_prepass:
        cached = _persist(df, run_id)
        if cached is not None:
            persisted.append(cached)
            df = cached
    rows = None
    if _count_is_useful(config):
        with _Step(run_id, durations, "count_rows"):
            rows = df.count()
    with _Step(run_id, durations, "plan_routing"):
        plan = _routing_plan(df, config, key_kind, rows)
    lifecycle.update(num_dbs=plan.num_dbs)
    spark_sorts = _spark_sorts_shards(config, plan, rows)
    write_plan = _write_plan(config, key_encoding, plan, spark_sorts, values)
    if plan.num_dbs == 1:
        results = _write_single_db(df, config, plan, write_plan, faults, durations, encode)
    else:
        with _Step(run_id, durations, "arrow_batches"):
            batches = _arrow_batch_conf(df, config, encode, rows)
        with _Step(run_id, durations, "route_shuffle_write"), spark_conf_overrides(spark, batches):
            results = _write_sharded(df, plan, write_plan, faults, encode)
    with _Step(run_id, durations, "verify_routing"):
        _verify_routing(config, plan, results)
    selection = select_winners((r.shard for r in results), plan.num_dbs)
    # The shards' own lines are logged by the executors (not in the task log of a cluster run).
    winners = selection.winners.values()
    log.info("run %s: shards written %d/%d (%d rows, %d bytes; %d empty)", run_id, len(selection.winners),
             plan.num_dbs, sum(w.row_count for w in winners), sum(w.byte_size for w in winners),
             len(selection.empty_db_ids))
    manifest = _manifest(spark, config, plan, key_encoding, selection, lifecycle, durations, results,
                         shard_sort="spark" if write_plan.presorted else "writer")
    return replace(manifest, value_schema=values.schema, value_encoding_version=values.encoding_version)


def _cel_column_names(config: WriteConfig) -> list[str]:
    return list(config.sharding.cel_columns or ()) if config.sharding.cel_expr else []


@dataclass(frozen=True)
class _Encoding:
    """How a frame of the input becomes the frame the tasks read (``value_encoder``): applied where
    the plan is cheapest, which for a full write is after the shuffle."""

    columns: tuple[str, ...]
    keep: tuple[str, ...]
    deleted_when: str | None = None
    json: bool = False

    def needed(self, df):
        """``df`` cut to the columns the write reads (JSON values only: binary ones are read by name)."""
        return df.select(*[_col(c) for c in dict.fromkeys((*self.keep, *self.columns))]) if self.json else df

    def __call__(self, df, also: tuple[str, ...] = ()):
        if not self.json:
            return df
        return encode_json_in_engine(df, self.columns, keep=[*self.keep, *also], deleted_when=self.deleted_when)[0]


def _col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _engine_values(df, config: WriteConfig, *, keep: list[str], deleted_when: str | None = None,
                   value_format: str | None = None) -> tuple[_Encoding, EngineValues]:
    """JSON values encoded by Spark (SPEC §18): what turns ``df`` into the frame the tasks read, and
    how they read it. Binary values pass through as they are, with no schema (their bytes are the value)."""
    fmt = value_format or encoding.validate_value_format(config.value.format)
    columns = config.value.value_columns()
    if fmt != "json":
        return _Encoding(columns, tuple(keep)), EngineValues(fmt, columns, ())
    schema = value_schema.from_spark_json(df.schema.jsonValue(), columns)
    _, values = encode_json_in_engine(df, columns, keep=keep, deleted_when=deleted_when)
    return (_Encoding(columns, tuple(keep), deleted_when, json=True),
            replace(values, schema=schema, encoding_version=value_schema.VALUE_ENCODING_ENGINE))


def _write_chain(spark, config: WriteConfig, store: Any, lifecycle: RunRecordLifecycle, durations: dict[str, float],
                 faults: Faults, source: Any = None) -> Manifest:
    """A delta or compaction on a base run (SPEC §13): one layer per changed shard; the manifest to publish."""
    from ..core.model.snapshot import SnapshotRoot
    from ..core.write.delta import chain_shards, chain_stats, select_layer_winners
    from .chain_write import ChainPlan, check_against_base, resolve_base, write_layers

    run_id, mode = config.run_id, config.delta.write_mode
    with _Step(run_id, durations, "resolve_base"):
        base_ref, resolved_base = resolve_base(SnapshotRoot(store), config)
        base = resolved_base.manifest
        config = check_against_base(config, base)
        compact = mode == "compact" or base.chain_depth >= config.delta.max_chain_depth
        log.info("run %s: %s on base run %s (chain depth %d, %d rows, %d shards)%s", run_id, mode, base.run_id,
                 base.chain_depth, base.row_count, base.num_dbs,
                 f"; written compacted (max_chain_depth {config.delta.max_chain_depth} reached)"
                 if compact and mode == "delta" else "")
        lifecycle.update(num_dbs=base.num_dbs, stats={"base_run_id": base.run_id, "write_mode": mode})
    df = None
    key_kind = encoding.key_kind_of_encoding(base.key_encoding)
    if mode == "delta":
        with _Step(run_id, durations, "read_input"):
            df = read_input(spark, config) if source is None else source
            if spark_types.key_kind(df.schema, config.key_column) != key_kind:
                raise ConfigError(f"key_column {config.key_column!r} is not of the base's key kind {key_kind} "
                                  f"(key_encoding {base.key_encoding!r})")
            for col in config.value.value_columns():
                spark_types.field_of(df.schema, col, what="value column")
            if config.delta.delete_column is not None:
                spark_types.require_boolean(df.schema, config.delta.delete_column, what="delete_column")
            delete = [config.delta.delete_column] if config.delta.delete_column else []
            encode, values = _engine_values(df, config, keep=[config.key_column, *delete],
                                            deleted_when=config.delta.delete_column, value_format=base.value_format)
            df = encode(df)
            if values.schema is not None:
                value_schema.check_on_base(base.value_schema, base.value_columns, values.schema,
                                           where=f"write_mode 'delta' on base run {base.run_id!r}")
    else:  # a compaction merges the stored bytes as they are
        values = EngineValues(base.value_format, (), (), base.value_schema, base.value_encoding_version)
    plan = ChainPlan(
        output_uri=config.output_uri, storage_options=config.storage_options.to_dict(), run_id=run_id,
        base_manifest_ref=base_ref, key_column=config.key_column, key_encoding=base.key_encoding,
        value_format=values.value_format, value_columns=values.value_columns, value_checks=values.checks,
        delete_column=config.delta.delete_column, allow_duplicate_keys=config.options.allow_duplicate_keys,
        compact=compact, has_input=df is not None,
        num_tasks=_num_tasks(spark, base.num_dbs, TASKS_PER_CORE if compact else DELTA_TASKS_PER_CORE),
        num_dbs=base.num_dbs,
    )
    routing_plan = RoutingPlan(base.sharding, base.num_dbs, key_kind)
    with _Step(run_id, durations, "route_shuffle_write_layers"):
        results = write_layers(spark, df, routing_plan, plan, base.num_dbs, faults)
    winners = select_layer_winners(results, base.num_dbs)
    shards = chain_shards(base, run_id, winners, compact=compact)
    stats = dict(chain_stats(base, shards, winners), durations_s=dict(durations), write_mode=mode,
                 attempts_seen=len(results))
    log.info("run %s: %s", run_id, {k: stats[k] for k in ("rows", "inserted", "updated", "deleted", "deleted_absent",
                                                          "shards_written", "layer_bytes")})
    return Manifest(
        run_id=run_id, created_at=layout.utc_now(), output_uri=config.output_uri, num_dbs=base.num_dbs,
        sharding=base.sharding, key_encoding=base.key_encoding, value_format=base.value_format,
        value_columns=config.value.value_columns() if df is not None else base.value_columns,
        value_schema=values.schema or base.value_schema,
        value_encoding_version=values.encoding_version or base.value_encoding_version,
        storage_engine=dict(base.storage_engine), shards=shards, stats=stats,
        writer=writer_info(spark, config).to_dict(), run_started_at=lifecycle.record.started_at, base_run_id=base.run_id,
        chain_depth=0 if compact else base.chain_depth + 1, write_mode="compact" if compact else "delta",
        # A delta stores only its change, naming its base's manifest (SPEC §17); a compaction is whole.
        format_version=CHAIN_FORMAT_VERSION if compact else CHAIN_DOCUMENT_FORMAT_VERSION,
        base_manifest_ref=None if compact else base_ref,
        base_manifest_checksum=None if compact else resolved_base.checksum,
    ).validate()


def _persist(df, run_id: str):
    from pyspark import StorageLevel

    try:
        cached = df.persist(StorageLevel.MEMORY_AND_DISK)
        log.info("run %s: input persisted (MEMORY_AND_DISK)", run_id)
        return cached
    except Exception as exc:  # caching is an optimization: go on uncached
        log.warning("run %s: could not persist the input (%s); continuing uncached", run_id, exc)
        return None


ARROW_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
# Rows of the input whose sizes decide whether the byte bound of an Arrow batch can be lifted,
# and how far below Spark's byte bound a batch of the largest of them must stay.
ARROW_SAMPLE_ROWS = 2000
ARROW_BATCH_MARGIN = 4
# Below this many rows the per-row cost is too small to pay for the sample's Spark job.
ARROW_SAMPLE_MIN_ROWS = 1_000_000


def _arrow_batch_conf(df, config: WriteConfig, encode: _Encoding, rows: int | None) -> dict[str, str]:
    """The Arrow batch bounds of the writing stage, where the defaults cost more than they protect.

    Spark ends a batch to the Python writer at ``maxRecordsPerBatch`` rows or ``maxBytesPerBatch``
    bytes, and checks the bytes after every row it adds, walking the batch's vectors: about a
    tenth of the JVM's time in a JSON write of small values (docs/benchmarks.md). Where a sample of
    the rows the writer receives says that ``maxRecordsPerBatch`` of its largest row stay well
    within the byte bound, the bound is lifted for this write and the row count alone ends a
    batch. Settings the user gave in ``spark_conf_overrides`` are kept as given.
    """
    if ARROW_MAX_BYTES in config.spark_conf_overrides or ARROW_MAX_RECORDS in config.spark_conf_overrides:
        return {}
    if rows is None or rows < ARROW_SAMPLE_MIN_ROWS:  # unknown: a micro-batch, say, is often small
        return {}
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    spark = df.sparkSession
    max_bytes = _conf_bytes(spark.conf.get(ARROW_MAX_BYTES))
    max_records = int(spark.conf.get(ARROW_MAX_RECORDS))
    sent = encode(df)
    sizes = [F.coalesce(F.octet_length(_col(f.name)), F.lit(0))
             if isinstance(f.dataType, (T.StringType, T.BinaryType)) else F.lit(16) for f in sent.schema.fields]
    # A limit collected (not aggregated): Spark reads the first partition, and more only if short.
    taken = sent.select(functools.reduce(lambda a, b: a + b, sizes).alias("n")).limit(ARROW_SAMPLE_ROWS).collect()
    largest = max((r[0] for r in taken), default=None)
    if largest is None or max_records <= 0 or largest * max_records * ARROW_BATCH_MARGIN > max_bytes:
        log.info("run %s: Arrow batches bounded by Spark's defaults (largest sampled row %s bytes)",
                 config.run_id, largest)
        return {}
    log.info("run %s: Arrow batches of %d rows, byte bound lifted (largest sampled row %d bytes)",
             config.run_id, max_records, largest)
    return {ARROW_MAX_BYTES: str(2**31 - 1)}


def _conf_bytes(text: str) -> int:
    """A Spark byte size as Spark prints it (``67108864b``, ``64m``) in bytes."""
    units = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}
    t = text.strip().lower()
    digits = t.rstrip("kmgb")
    return int(digits) * units.get(t[len(digits):] or "b", 1)


def _count_is_useful(config: WriteConfig) -> bool:
    """Count rows up front only where it is needed or (nearly) free.

    ``max_keys_per_shard`` needs the count (on the persisted input). A parquet / ORC path counts
    from file footers without reading column data, and the count lets shards small enough be
    sorted by the writer in memory instead of by a Spark sort (see ``_spark_sorts_shards``).
    """
    if config.sharding.max_keys_per_shard is not None:
        return True
    return (config.options.sort_within_partitions and config.sharding.strategy == "hash"
            and (config.sharding.num_dbs or 0) > 1 and bool(config.input.path)
            and config.input.format.lower() in ("parquet", "orc"))


def _spark_sorts_shards(config: WriteConfig, plan: RoutingPlan, rows: int | None) -> bool:
    """With ``sort_within_partitions``, who sorts each shard partition by key.

    Spark's external sort works for any shard size and hands the writer non-overlapping runs. When
    every shard fits in one sort run, the writer's single in-memory numpy/Arrow sort per shard is
    cheaper (docs/benchmarks.md) and memory stays bounded by
    ``sort_run_rows`` all the same. Hash routing spreads rows binomially, so the largest shard stays
    within six standard deviations of the mean; skewed CEL routing and unknown sizes keep the
    Spark sort.
    """
    if not config.options.sort_within_partitions or plan.num_dbs == 1:
        return False
    mean = rows / plan.num_dbs if rows is not None else None
    in_memory = (plan.sharding.strategy == "hash" and mean is not None
                 and mean + 6 * math.sqrt(mean) <= config.options.sort_run_rows)
    log.info("run %s: shards sorted by %s (%s rows, %d shards, sort_run_rows %d)", config.run_id,
             "the writer in memory" if in_memory else "Spark", "unknown" if rows is None else rows, plan.num_dbs,
             config.options.sort_run_rows)
    return not in_memory


def _routing_plan(df, config: WriteConfig, key_kind: encoding.KeyKind, rows: int | None) -> RoutingPlan:
    sharding = config.sharding
    if sharding.strategy == "hash":
        num_dbs = sharding.num_dbs
        if num_dbs is None:
            assert sharding.max_keys_per_shard is not None  # ShardingSpec.validate: one of the two is set
            count = rows if rows is not None else df.count()
            num_dbs = routing.validate_num_dbs(
                max(1, math.ceil(count / sharding.max_keys_per_shard)),
                what=f"num_dbs = ceil({count} rows / max_keys_per_shard {sharding.max_keys_per_shard}) =",
            )
            log.info("run %s: %d rows, max_keys_per_shard %d -> num_dbs %d", config.run_id, count,
                     sharding.max_keys_per_shard, num_dbs)
        return RoutingPlan(ShardingInfo(strategy="hash", key_column=config.key_column), num_dbs, key_kind)
    columns = sharding.resolved_cel_columns(config.key_column)
    typed = {c: t or spark_types.cel_type(df.schema, c) for c, t in columns.items()}
    for c in typed:
        spark_types.field_of(df.schema, c, what="cel_columns entry")
    routing.compile_cel(sharding.cel_expr or "", typed)  # fail fast on the driver
    resolved = ShardingInfo(strategy="cel", key_column=config.key_column, cel_expr=sharding.cel_expr, cel_columns=typed,
                            cel_mode=sharding.cel_mode, routing_values=sharding.routing_values)
    if sharding.infer_routing_values:
        probe = RoutingPlan(replace(resolved, cel_mode="categorical"), 1, key_kind)
        token_rows = df.mapInArrow(make_token_fn(probe, ""), "token string").distinct().collect()
        tokens = [json.loads(r.token) for r in token_rows]
        if not tokens:
            raise InputDataError("infer_routing_values: the input has no rows, so there is nothing to infer "
                                 "routing values from (pass routing_values explicitly)")
        # Validate before sorting: mixed str/int tokens get the rule's message, not a TypeError.
        values = tuple(sorted(routing.validate_routing_values(tokens)))
        routing.validate_num_dbs(len(values), what="the number of inferred routing values")
        log.info("run %s: inferred %d routing values", config.run_id, len(values))
        resolved = replace(resolved, routing_values=values)
    cel_num_dbs = len(resolved.routing_values) if resolved.routing_values is not None else sharding.num_dbs
    assert cel_num_dbs is not None  # ShardingSpec.validate: direct CEL needs num_dbs
    return RoutingPlan(resolved, cel_num_dbs, key_kind)


def _write_plan(config: WriteConfig, key_encoding: encoding.KeyEncoding, plan: RoutingPlan,
                spark_sorts: bool, values: EngineValues) -> WritePlan:
    opts = config.options
    sample_cols = (config.key_column, *tuple(c for c in plan.sharding.routing_columns() if c != config.key_column))
    return WritePlan(
        output_uri=config.output_uri, storage_options=config.storage_options.to_dict(), run_id=config.run_id,
        key_column=config.key_column, key_encoding=key_encoding, value_format=values.value_format,
        value_columns=values.value_columns, value_checks=values.checks, batch_size=opts.batch_size,
        sort_run_rows=opts.sort_run_rows,
        allow_duplicate_keys=opts.allow_duplicate_keys, max_writes_per_second=opts.max_writes_per_second,
        max_write_bytes_per_second=opts.max_write_bytes_per_second,
        sample_per_shard=max(1, math.ceil(opts.sample_size / plan.num_dbs)) if opts.verify_routing else 0,
        sample_columns=sample_cols, num_dbs=plan.num_dbs,
        # Spark's order on non-negative ints, strings and binary equals the encoded-key byte order.
        presorted=spark_sorts or plan.num_dbs == 1,
    )


# Beyond this many tasks per core, one task writes several shards (SPEC §10): each task costs a
# launch, a Python round trip and a result, a fixed cost that 1000s of small shards paid one by one.
TASKS_PER_CORE = 8
# A delta's tasks: its work is the change, little per shard, so the fixed cost of each Python task
# and the pause between two waves of tasks dominated it at 1000s of shards: one task per core
# (bench_delta, 1 against 2 tasks per core: docs/benchmarks.md).
DELTA_TASKS_PER_CORE = 1


def _num_tasks(spark, num_dbs: int, per_core: int = TASKS_PER_CORE) -> int:
    """One task per shard while num_dbs fits ``per_core`` waves of the cluster's cores."""
    return min(num_dbs, session_info.default_parallelism(spark) * per_core)


def _write_sharded(df, plan: RoutingPlan, write_plan: WritePlan, faults: Faults, encode: _Encoding) -> list[TaskResult]:

    num_tasks = _num_tasks(df.sparkSession, plan.num_dbs)
    routed = with_shard_id(df, plan, faults)
    if num_tasks < plan.num_dbs:
        # Partition t holds the contiguous ids shards_of_task(t); sorted by id the shards of a
        # partition arrive one after another (and in key order when Spark sorts the shards).
        write_plan = replace(write_plan, num_tasks=num_tasks, shard_id_column=SHARD_ID_COL)
        sort_cols = [SHARD_ID_COL] + ([write_plan.key_column] if write_plan.presorted else [])
        partitioned = by_task(routed, num_tasks, plan.num_dbs, sort_cols)
        log.info("run %s: %d shards written by %d tasks (%d cores x %d)", write_plan.run_id, plan.num_dbs, num_tasks,
                 session_info.default_parallelism(df.sparkSession), TASKS_PER_CORE)
        writing = encode(partitioned, also=(SHARD_ID_COL,)).mapInArrow(make_write_fn(write_plan, faults), RESULT_DDL)
    else:
        # Partition index == shard id: one task per shard, never a hash partitioner on the id.
        partitioned = routed.repartitionById(plan.num_dbs, SHARD_ID_COL)
        if write_plan.presorted:
            # Spark's external sort bounds memory and hands the writer non-overlapping sorted runs.
            partitioned = partitioned.sortWithinPartitions(write_plan.key_column)
        # The id is the partition index now: not shipped to Python, a column less for every row.
        writing = encode(partitioned.drop(SHARD_ID_COL)).mapInArrow(make_write_fn(write_plan, faults), RESULT_DDL)
    try:
        rows = writing.collect()
    except Exception as exc:  # a dead Python worker's error names the shards its task was writing
        job_errors.raise_translated(exc, shards_of_task=lambda t: shards_of_task(t, plan.num_dbs, num_tasks))
    return [TaskResult.from_dict(json.loads(r.result)) for r in rows]


def _write_single_db(df, config: WriteConfig, plan: RoutingPlan, write_plan: WritePlan, faults: Faults,
                     durations: dict[str, float], encode: _Encoding) -> list[TaskResult]:
    """num_dbs == 1: global sort, stream Arrow batches to the driver in order, write there."""
    from ..core.storage.rate_limit import WriteLimiter

    df = encode(df)

    if plan.sharding.strategy == "cel":
        # One shard, but CEL tokens / ids must still be valid. A filter on the id keeps Spark from
        # pruning the routing UDF away, as it would for a column that is only dropped.
        df = with_shard_id(df, plan, faults).where(f"`{SHARD_ID_COL}` >= 0").drop(SHARD_ID_COL)
    # The range-partitioned sort's partitions, streamed in index order, are the global order. No
    # coalesce: its partition coalescer groups parents by locality, not by index, and interleaved
    # them (caught by the writer's order check). AQE already merges small sorted partitions, and
    # only contiguous ones.
    ordered = df.orderBy(config.key_column)
    limiter = WriteLimiter(config.options.max_writes_per_second, config.options.max_write_bytes_per_second)
    attempts = itertools.count()

    def write_attempt() -> list[TaskResult]:
        attempt = next(attempts)  # each retry writes into a fresh attempt=NN
        try:
            with _Step(config.run_id, durations, "single_db_write"):
                faults.before_single_db_attempt(attempt)
                return [write_one_shard(write_plan, _stream_batches(ordered), db_id=0, attempt=attempt,
                                        task_attempt_id=None, limiter=limiter)]
        except Exception as exc:
            job_errors.raise_translated(exc)

    retry = config.options.shard_retry
    return call_with_retry(write_attempt, policy=retry.policy() if retry else NO_RETRY,
                           describe=f"run {config.run_id}: single-db write")


def _stream_batches(df):
    """Arrow batches of ``df`` in partition order, one partition prefetched, without pandas."""
    def to_ipc(batches):
        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            yield pa.RecordBatch.from_pydict({"ipc": [sink.getvalue().to_pybytes()]},
                                             schema=pa.schema([("ipc", pa.binary())]))

    for row in df.mapInArrow(to_ipc, "ipc binary").toLocalIterator(prefetchPartitions=True):
        yield from pa.ipc.open_stream(row.ipc)


def _verify_routing(config: WriteConfig, plan: RoutingPlan, results: list[TaskResult]) -> None:
    """Recompute the shard of sampled stored keys with the reader's routing (step 6)."""
    if not config.options.verify_routing:
        log.info("run %s: verify_routing disabled", config.run_id)
        return
    columns = plan.sharding.routing_columns()
    cel = plan.sharding.strategy == "cel"
    if cel and len(columns) > 1:
        log.info("run %s: verify_routing skipped: CEL routing over %d columns", config.run_id, len(columns))
        return
    router = plan.cel_router() if cel else None
    checked = 0
    for item in results:
        db_id = item.shard.db_id
        for row in item.sample:
            values = {k: unsample_value(v) for k, v in row.items()}
            key = values[config.key_column]
            expected = router.route(values) if router else routing.route_key(key, plan.num_dbs)
            if expected != db_id:
                raise ShardAssignmentError(
                    f"verify_routing: key {show_value(key)} was written to shard {db_id} but the reader routes "
                    f"it to shard {expected}; nothing was published"
                )
            checked += 1
    log.info("run %s: verify_routing checked %d sampled keys", config.run_id, checked)


def _manifest(spark, config: WriteConfig, plan: RoutingPlan, key_encoding: encoding.KeyEncoding, selection: WinnerSelection,
              lifecycle: RunRecordLifecycle, durations: dict[str, float], results: list[TaskResult], *,
              shard_sort: str) -> Manifest:
    task_totals: dict[str, float] = {}
    for item in results:
        for k, v in (item.shard.timings or {}).items():
            task_totals[k] = round(task_totals.get(k, 0.0) + v, 3)
    entries = selection.entries()
    stats = RunStats(
        rows=sum(e.row_count for e in entries), bytes=sum(e.byte_size for e in entries), num_dbs=plan.num_dbs,
        empty_shards=len(selection.empty_db_ids), shards_written=len(entries), attempts_seen=selection.attempts_seen,
        durations_s=dict(durations), other={"task_time_totals_s": task_totals, "shard_sort": shard_sort},
    ).to_dict()
    from ..core.write.shard_builder import WRITER_SHARD_LAYOUT

    try:
        import rocksdict

        library_version = getattr(rocksdict, "__version__", None)
    except ImportError:  # pragma: no cover
        library_version = None
    return Manifest(
        run_id=config.run_id, created_at=layout.utc_now(), output_uri=config.output_uri, num_dbs=plan.num_dbs,
        sharding=plan.sharding,
        key_encoding=key_encoding, value_format=encoding.validate_value_format(config.value.format),
        value_columns=config.value.value_columns(),
        storage_engine={"name": "rocksdb", "library": "rocksdict", "library_version": library_version, "raw_mode": True,
                        "shard_layout": WRITER_SHARD_LAYOUT},
        shards=entries, stats=stats, writer=writer_info(spark, config).to_dict(), run_started_at=lifecycle.record.started_at,
    ).validate()
