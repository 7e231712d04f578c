"""JSON values encoded by the engine (SPEC §18): Spark's own expressions over the value columns.

The Python worker then receives one binary value column, as for ``value_format="binary"``, instead of
every value column to encode row by row (which cost several Parquet writes of the same columns;
docs/benchmarks.md).

The bytes follow SPEC §5: a compact JSON object, members sorted by name at every level (struct
fields and map keys too), nulls written as ``null``. Types JSON has no form for are written as the
reader's typed decoder reads them back (encoding version 3): timestamps, with or without time zone,
as integers of microseconds since the epoch (as Avro's timestamp-micros; formatting them as text
was a large part of the encoding's CPU, docs/benchmarks.md), decimals as their plain text in a
string (exact), binary as base64, a float as the double it widens to exactly.

What JSON cannot hold is flagged on the engine side, per row, as the index of the broken rule
(``VALUE_ERROR_COLUMN``, null when the row is fine): NaN and ±Infinity, and text that is not UTF-8
(``to_json`` would replace such bytes silently). The writer turns the first flag it meets into one
``InputDataError`` naming the column, the key and the rule (``core.write.arrow_codec``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.model.value_schema import ValueSchema
from ..core.write.arrow_codec import ENGINE_JSON, ENGINE_VALUE_COLUMN, ENGINE_VALUE_ERROR_COLUMN

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["EngineValues", "encode_json_in_engine"]

RULE_FINITE = "value_format 'json' cannot store NaN or ±Infinity (they are not JSON numbers); replace or drop them"
RULE_UTF8 = (
    "value_format 'json' writes string columns as JSON text, which must be UTF-8; cast a column "
    "holding arbitrary bytes to binary (stored as base64) or repair the data"
)
_TO_JSON_OPTIONS = {
    "ignoreNullFields": "false",  # a null is written, as the Python encoder did: the member is there
    "dateFormat": "yyyy-MM-dd",
    "timeZone": "UTC",  # the session's zone would make the bytes depend on the cluster's settings
}
_NTZ_EPOCH = "1970-01-01 00:00:00"


@dataclass(frozen=True)
class EngineValues:
    """How the writer finds the encoded values: the plan's value format and columns, and the rule
    (column, rule text) each error code of ``ENGINE_VALUE_ERROR_COLUMN`` stands for."""

    value_format: str
    value_columns: tuple[str, ...]
    checks: tuple[tuple[str, str], ...]
    # What the manifest records of the values (SPEC §18); set by the driver.
    schema: ValueSchema | None = None
    encoding_version: int | None = None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _or(parts: list[Any]) -> Any:
    return functools.reduce(lambda a, b: a | b, parts) if parts else None


def _encoded(c: Any, t: Any) -> Any:
    """``c`` of Spark type ``t`` rewritten so ``to_json`` writes the bytes described above, or None
    when ``to_json`` already writes them from ``c`` as it is (``_rewritten`` says which)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        names = sorted(f.name for f in t.fields)
        by_name = {f.name: f.dataType for f in t.fields}
        parts = [(n, _encoded(c.getField(n), by_name[n])) for n in names]
        if names == [f.name for f in t.fields] and all(p is None for _, p in parts):
            return None
        rebuilt = F.struct(*[(c.getField(n) if p is None else p).alias(n) for n, p in parts])
        # A null struct stays null: struct() of its null fields would be an object of nulls.
        return F.when(c.isNull(), F.lit(None)).otherwise(rebuilt)
    if isinstance(t, T.ArrayType):
        return F.transform(c, lambda x: _encoded(x, t.elementType)) if _rewritten(t.elementType) else None
    if isinstance(t, T.MapType):
        m = F.transform_values(c, lambda _k, v: _encoded(v, t.valueType)) if _rewritten(t.valueType) else c
        # Members sorted by key, as the Python encoder's sort_keys did (maps keep insertion order).
        entries = F.array_sort(F.map_entries(m), lambda a, b: F.when(a["key"] < b["key"], -1)
                               .when(a["key"] > b["key"], 1).otherwise(0))
        return F.map_from_entries(entries)
    if isinstance(t, T.DecimalType):
        return c.cast("string")  # a JSON number would be read back as a float by most parsers
    if isinstance(t, T.FloatType):
        return c.cast("double")  # the value pyarrow gives for a float32, digit for digit
    if isinstance(t, T.TimestampType):
        return F.unix_micros(c)
    if isinstance(t, T.TimestampNTZType):
        # No time zone enters: the difference of two wall-clock times, exact to the microsecond.
        return F.timestamp_diff("MICROSECOND", F.lit(_NTZ_EPOCH).cast("timestamp_ntz"), c)
    return None


def _rewritten(t: Any) -> bool:
    """Whether ``_encoded`` changes a column of type ``t``."""
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        return [f.name for f in t.fields] != sorted(f.name for f in t.fields) or any(_rewritten(f.dataType) for f in t.fields)
    if isinstance(t, T.ArrayType):
        return _rewritten(t.elementType)
    return isinstance(t, (T.MapType, T.DecimalType, T.FloatType, T.TimestampType, T.TimestampNTZType))


def _is_leaf(t: Any, rule: str) -> bool:
    from pyspark.sql import types as T

    return isinstance(t, (T.FloatType, T.DoubleType) if rule == RULE_FINITE else T.StringType)


def _leaf_broken(c: Any, rule: str) -> Any:
    from pyspark.sql import functions as F

    if rule == RULE_FINITE:
        return F.isnan(c) | (c == float("inf")) | (c == float("-inf"))
    return ~F.is_valid_utf8(c)


def _breakable(t: Any, rule: str) -> bool:
    """Whether a column of type ``t`` holds, anywhere, a leaf that ``rule`` applies to."""
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        return any(_breakable(f.dataType, rule) for f in t.fields)
    if isinstance(t, T.ArrayType):
        return _breakable(t.elementType, rule)
    if isinstance(t, T.MapType):
        return _breakable(t.keyType, rule) or _breakable(t.valueType, rule)
    return _is_leaf(t, rule)


def _broken(c: Any, t: Any, rule: str) -> Any:
    """A boolean column: some leaf of ``c`` (of type ``t``, which ``_breakable``) breaks ``rule``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def any_of(array: Any, item_type: Any) -> Any:
        return F.exists(array, lambda x: F.coalesce(_broken(x, item_type, rule), F.lit(False)))

    if isinstance(t, T.StructType):
        return _or([_broken(c.getField(f.name), f.dataType, rule) for f in t.fields if _breakable(f.dataType, rule)])
    if isinstance(t, T.ArrayType):
        return any_of(c, t.elementType)
    if isinstance(t, T.MapType):
        return _or([any_of(part(c), item) for part, item in ((F.map_keys, t.keyType), (F.map_values, t.valueType))
                    if _breakable(item, rule)])
    return _leaf_broken(c, rule)


def encode_json_in_engine(df: Any, columns: Sequence[str], *, keep: Sequence[str],
                          deleted_when: str | None = None) -> tuple[Any, EngineValues]:
    """``df`` with ``keep`` (key, routing, delete and sample columns) plus the encoded value column
    (and the rule column when a rule can be broken), and how the writer reads them.

    ``deleted_when``: a boolean column marking deletions of a delta; their value columns are ignored,
    so they break no rule.
    """
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in df.schema.fields}
    members = [(_encoded(F.col(_quoted(n)), types[n]) if n in types else None, n) for n in sorted(columns)]
    value = F.to_json(F.struct(*[(F.col(_quoted(n)) if e is None else e).alias(n) for e, n in members]),
                      _TO_JSON_OPTIONS).cast("binary")
    checks: list[tuple[str, str]] = []
    flags = None
    for name in columns:
        for rule in (RULE_FINITE, RULE_UTF8):
            if _breakable(types[name], rule):
                bad = _broken(F.col(_quoted(name)), types[name], rule)
                code = F.lit(len(checks))
                flags = F.when(F.coalesce(bad, F.lit(False)), code) if flags is None else \
                    flags.when(F.coalesce(bad, F.lit(False)), code)
                checks.append((name, rule))
    out = [F.col(_quoted(n)) for n in dict.fromkeys(keep)]
    out.append(value.alias(ENGINE_VALUE_COLUMN))
    value_columns: tuple[str, ...] = (ENGINE_VALUE_COLUMN,)
    if flags is not None:
        if deleted_when is not None:
            flags = F.when(F.coalesce(F.col(_quoted(deleted_when)), F.lit(False)), F.lit(None)).otherwise(flags)
        out.append(flags.alias(ENGINE_VALUE_ERROR_COLUMN))
        value_columns += (ENGINE_VALUE_ERROR_COLUMN,)
    return df.select(*out), EngineValues(ENGINE_JSON, value_columns, tuple(checks))
