"""Step 5: an ``int32`` shard id per row, computed on Arrow batches (no pandas).

Routing runs as a scalar Arrow iterator UDF over the routing columns only (the key, or the CEL
columns): the payload never crosses to Python for routing, which is faster than a
``mapInArrow`` pass over whole rows (docs/benchmarks.md). The closure holds only plain data (column names, num_dbs,
the CEL source); the CEL program is compiled once per task on the executor because compiled
programs cannot be pickled.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..core.model.encoding import KeyKind
from ..core.model.manifest import ShardingInfo
from .faults import NO_FAULTS, Faults

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "SHARD_ID_COL",
    "RoutingPlan",
    "by_task",
    "make_route_fn",
    "make_token_fn",
    "shard_id_column",
    "shard_ids_for_batch",
    "with_shard_id",
]

SHARD_ID_COL = "__shardyfusion_db_id"


@dataclass(frozen=True)
class RoutingPlan:
    """Everything a task needs to route, as plain picklable data.

    ``sharding`` is the snapshot's resolved sharding, written to its manifest as is, so the writer,
    ``verify_routing`` and every reader route by the same model.
    """

    sharding: ShardingInfo
    num_dbs: int
    key_kind: KeyKind

    def cel_router(self) -> Any:
        from ..core.model.routing import CelRouter

        return CelRouter(self.sharding.cel_spec(self.num_dbs))


def shard_ids_for_batch(plan: RoutingPlan, batch: pa.RecordBatch, router: Any = None,
                        faults: Faults = NO_FAULTS) -> np.ndarray:
    from ..core.errors import ShardAssignmentError
    from ..core.model import routing
    from ..core.model.encoding import null_key_error
    from ..core.write.arrow_codec import UTF8_RULE_KEY, UTF8_RULE_ROUTING, check_utf8, first_null_row

    key_column = plan.sharding.key_column
    if plan.sharding.strategy == "hash":
        keys = batch.column(key_column)
        if first_null_row(keys) is not None:
            raise null_key_error(key_column)
        if plan.key_kind == "string":
            check_utf8(keys, column=key_column, rule=UTF8_RULE_KEY)
        # Hashed integer keys are routed on the JVM (with_shard_id); this path serves strings and bytes.
        n = plan.num_dbs
        ids = np.fromiter((routing.route_key(k, n) for k in keys.to_pylist()), dtype=np.int32, count=len(keys))
    else:
        names = plan.sharding.routing_columns()
        for name in names:
            check_utf8(batch.column(name), column=name, rule=UTF8_RULE_KEY if name == key_column else UTF8_RULE_ROUTING)
        rows = batch.select(names).to_pylist()
        ids = np.fromiter((router.route(r) for r in rows), dtype=np.int32, count=len(rows))
    if faults.route_shift:
        ids = ((ids + faults.route_shift) % plan.num_dbs).astype(np.int32)
    if len(ids) and (ids.min() < 0 or ids.max() >= plan.num_dbs):
        bad = int(ids[(ids < 0) | (ids >= plan.num_dbs)][0])
        raise ShardAssignmentError(f"routing produced shard id {bad}, outside [0, {plan.num_dbs})")
    return ids


def make_route_fn(plan: RoutingPlan, faults: Faults = NO_FAULTS):
    """Iterator over column arrays (one array, or a tuple of them) → iterator of int32 ids."""
    names = plan.sharding.routing_columns()

    def route_arrays(batches: Iterator[Any]) -> Iterator[pa.Array]:
        router = plan.cel_router() if plan.sharding.strategy == "cel" else None
        for arrays in batches:
            arrays = list(arrays) if isinstance(arrays, (tuple, list)) else [arrays]
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
            yield pa.array(shard_ids_for_batch(plan, batch, router, faults), type=pa.int32())

    return route_arrays


def with_shard_id(df, plan: RoutingPlan, faults: Faults = NO_FAULTS):
    """``df`` plus the shard id column: on the JVM for hashed integer keys, else the Arrow UDF.

    Not on the JVM through Spark Connect: there a plan is analyzed only when it runs, under the
    session's ANSI mode, so the wrapping multiplications of xxh3 would raise on overflow.
    """
    from .session_info import is_connect

    if plan.sharding.strategy == "hash" and plan.key_kind == "int" and not is_connect(df.sparkSession):
        return _with_jvm_int_shard_id(df, plan.sharding.key_column, plan.num_dbs, shift=faults.route_shift)
    return df.withColumn(SHARD_ID_COL, shard_id_column(plan, faults))


def by_task(routed, num_tasks: int, num_dbs: int, sort_cols: list[str]):
    """``routed`` (with the shard id column) in ``num_tasks`` partitions, partition t holding the
    contiguous shard ids ``shard_task.shards_of_task(t)``, sorted by ``sort_cols`` (the shard id
    first, so a partition's shards arrive one after another)."""
    from pyspark.sql import functions as F

    part_col = "__shardyfusion_task"
    return (routed.withColumn(part_col, F.expr(f"CAST((CAST(`{SHARD_ID_COL}` AS BIGINT) * {num_tasks}) DIV {num_dbs} AS INT)"))
            .repartitionById(num_tasks, part_col).drop(part_col).sortWithinPartitions(*sort_cols))


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


# XXH3's constants as the signed longs Spark holds: secret bytes 8..16 ^ 16..24, and PRIME_MX2.
_JVM_BITFLIP = _signed(0x1CAD21F72C81017C ^ 0xDB979083E96DD4DE)
_JVM_PRIME_MX2 = _signed(0x9FB21C651E98DF25)


def _with_jvm_int_shard_id(df, key_column: str, num_dbs: int, *, shift: int = 0):
    """``route_key`` of integer keys as Spark expressions, so they never cross to Python for routing
    (the Arrow round trip of the key column cost more than the hash: docs/benchmarks.md).

    For an 8-byte input XXH3 (seed 0) is one keyed mix: the signed little-endian bytes read as two
    32-bit halves swapped (a 32-bit rotation), xored with bytes 8..24 of the default secret, then the
    "rrmxmx" finalizer; the shard is that unsigned 64-bit hash mod num_dbs.

    xxh3 needs 64-bit multiplication that wraps; Spark's ANSI mode (the default) raises on overflow
    instead, so the columns are built with it off: the evaluation mode is fixed when an expression
    is analyzed, and the session's setting is restored at once. Each step is its own column so the
    plan holds every intermediate once.
    """
    from pyspark.sql import functions as F

    from ..core.model.encoding import null_key_error
    from .conf_overrides import spark_conf_overrides
    from .errors import error_line

    names = [f"__shardyfusion_h{i}" for i in range(4)]

    def rotl(c, r: int):
        return F.shiftleft(c, r).bitwiseOR(F.shiftrightunsigned(c, 64 - r))

    def unsigned_mod(c, n: int):
        # (2 * (u >>> 1) + (u & 1)) mod n, without ever forming the unsigned value.
        half = F.pmod(F.shiftrightunsigned(c, 1), F.lit(n))
        return F.pmod(half * 2 + c.bitwiseAND(F.lit(1)), F.lit(n))

    key = F.col(key_column)
    with spark_conf_overrides(df.sparkSession, {"spark.sql.ansi.enabled": "false"}):
        h0, h1, h2, h3 = (F.col(n) for n in names)
        out = (df.withColumn(names[0], rotl(key.cast("bigint"), 32).bitwiseXOR(F.lit(_JVM_BITFLIP)))
               .withColumn(names[1], h0.bitwiseXOR(rotl(h0, 49).bitwiseXOR(rotl(h0, 24))) * F.lit(_JVM_PRIME_MX2))
               .withColumn(names[2], h1.bitwiseXOR(F.shiftrightunsigned(h1, 35) + F.lit(8)) * F.lit(_JVM_PRIME_MX2))
               .withColumn(names[3], h2.bitwiseXOR(F.shiftrightunsigned(h2, 28)))
               .withColumn(SHARD_ID_COL, F.when(key.isNull(), F.raise_error(F.lit(error_line(null_key_error(key_column)))))
                           .otherwise(F.pmod(unsigned_mod(h3, num_dbs) + shift, F.lit(num_dbs)).cast("int")))
               .drop(*names))
    return out


def shard_id_column(plan: RoutingPlan, faults: Faults = NO_FAULTS):
    """The Spark column holding each row's shard id."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.util import PythonEvalType

    with warnings.catch_warnings():
        # One function serves one or several routing columns, so the UDF type is given, not
        # inferred from type hints (which PySpark would prefer).
        warnings.simplefilter("ignore", UserWarning)
        udf = F.arrow_udf(make_route_fn(plan, faults), T.IntegerType(), PythonEvalType.SQL_SCALAR_ARROW_ITER_UDF)
    return udf(*[F.col(c) for c in plan.sharding.routing_columns()])


def make_token_fn(plan: RoutingPlan, token_type: str):
    """Inferred categorical routing: distinct CEL tokens per partition (one extra pass)."""

    def tokens(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from ..core.write.arrow_codec import UTF8_RULE_ROUTING, check_utf8_columns

        router = plan.cel_router()
        names = plan.sharding.routing_columns()
        seen: set[Any] = set()
        for batch in batches:
            check_utf8_columns(batch, names, rule=UTF8_RULE_ROUTING)
            for row in batch.select(names).to_pylist():
                seen.add(router.evaluate(row))
        import json

        yield pa.RecordBatch.from_pydict({"token": [json.dumps(t) for t in seen]}, schema=pa.schema([("token", pa.string())]))

    return tokens
