"""Arrow-column forms of the key/value rules of SPEC §5, used by the Spark job on whole batches."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .encoding import encode_json_value
from .errors import ConfigError, InputDataError


def key_kind_of_type(arrow_type: pa.DataType, *, column: str) -> str:
    """'int' / 'string' / 'binary' for a key column type; anything else is a configuration error."""
    if pa.types.is_integer(arrow_type):
        return "int"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "binary"
    raise ConfigError(f"key_column {column!r} has type {arrow_type}; keys must be integers, strings or binary")


def check_value_column_type(arrow_type: pa.DataType, *, column: str) -> None:
    if not (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)):
        raise ConfigError(
            f"value_column {column!r} has type {arrow_type}; value_format 'binary' needs a binary or string column "
            "(use value_format='json' with value_columns for other types)"
        )


def encode_values(batch: pa.RecordBatch, fmt: str, columns: tuple[str, ...]) -> pa.Array:
    """One binary value per row: the column's bytes ('binary') or a compact sorted JSON object ('json')."""
    if fmt == "binary":
        col = batch.column(columns[0])
        check_value_column_type(col.type, column=columns[0])
        # Nulls become empty values: the reader cannot tell them apart, which the README documents.
        return pc.fill_null(col.cast(pa.binary()), b"")
    if fmt == "json":
        rows: list[dict[str, Any]] = batch.select(list(columns)).to_pylist()
        return pa.array([encode_json_value(r) for r in rows], type=pa.binary())
    raise ConfigError(f"value_format {fmt!r} is not supported")


def first_null_row(array: pa.Array) -> int | None:
    if array.null_count == 0:
        return None
    return int(pc.index(pc.is_null(array), True).as_py())


def raise_null_key(column: str, batch: pa.RecordBatch | None = None) -> None:
    raise InputDataError(f"column {column!r}: null key (rule: keys must not be null)")
