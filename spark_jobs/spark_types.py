"""Spark schema facts the job needs, mapped onto core's vocabulary."""

from __future__ import annotations

from pyspark.sql import types as T

from airflow_provider_shardyfusion.core.errors import ConfigError

_INT_TYPES = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)


def field_of(schema: T.StructType, column: str, *, what: str) -> T.StructField:
    for f in schema.fields:
        if f.name == column:
            return f
    raise ConfigError(f"{what} {column!r} is not a column of the input; columns are {schema.fieldNames()}")


def key_kind(schema: T.StructType, column: str) -> str:
    dt = field_of(schema, column, what="key_column").dataType
    if isinstance(dt, _INT_TYPES):
        return "int"
    if isinstance(dt, T.StringType):
        return "string"
    if isinstance(dt, T.BinaryType):
        return "binary"
    raise ConfigError(f"key_column {column!r} has type {dt.simpleString()}; keys must be integers, strings or binary")


def cel_type(schema: T.StructType, column: str) -> str:
    dt = field_of(schema, column, what="cel_columns entry").dataType
    if isinstance(dt, _INT_TYPES):
        return "int"
    if isinstance(dt, T.StringType):
        return "string"
    if isinstance(dt, T.BinaryType):
        return "bytes"
    if isinstance(dt, (T.DoubleType, T.FloatType)):
        return "double"
    if isinstance(dt, T.BooleanType):
        return "bool"
    raise ConfigError(f"cel_columns entry {column!r} has type {dt.simpleString()}, which has no CEL type mapping")
