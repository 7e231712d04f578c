"""Spark schema facts the job needs, mapped onto core's vocabulary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import types as T

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..core.model.encoding import KeyKind
    from ..core.model.routing import CelType

__all__ = [
    "cel_type", "field_of", "key_kind", "require_boolean",
]

_INT_TYPES = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)
# Spark type → (key kind, CEL type); None where the type cannot serve in that role.
_MAPPING: tuple[tuple[tuple[type, ...], KeyKind | None, CelType], ...] = (
    (_INT_TYPES, "int", "int"),
    ((T.StringType,), "string", "string"),
    ((T.BinaryType,), "binary", "bytes"),
    ((T.DoubleType, T.FloatType), None, "double"),
    ((T.BooleanType,), None, "bool"),
)


def field_of(schema: T.StructType, column: str, *, what: str) -> T.StructField:
    for f in schema.fields:
        if f.name == column:
            return f
    raise ConfigError(f"{what} {column!r} is not a column of the input; columns are {schema.fieldNames()}")


def _lookup(dt: T.DataType) -> tuple[KeyKind | None, CelType | None]:
    for types, kind, cel in _MAPPING:
        if isinstance(dt, types):
            return kind, cel
    return None, None


def key_kind(schema: T.StructType, column: str) -> KeyKind:
    dt = field_of(schema, column, what="key_column").dataType
    kind, _ = _lookup(dt)
    if kind is None:
        raise ConfigError(f"key_column {column!r} has type {dt.simpleString()}; keys must be integers, strings or binary")
    return kind


def cel_type(schema: T.StructType, column: str) -> CelType:
    dt = field_of(schema, column, what="cel_columns entry").dataType
    _, typ = _lookup(dt)
    if typ is None:
        raise ConfigError(f"cel_columns entry {column!r} has type {dt.simpleString()}, which has no CEL type mapping")
    return typ


def require_boolean(schema: T.StructType, column: str, *, what: str) -> None:
    dt = field_of(schema, column, what=what).dataType
    if not isinstance(dt, T.BooleanType):
        raise ConfigError(f"{what} {column!r} must be a boolean column (true: the row deletes its key), not {dt.simpleString()}")
