"""Arrow-column forms of the key/value rules of SPEC §5, used by the Spark job on whole batches."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_shardyfusion.core.errors import ConfigError, InputDataError, show_value
from airflow_provider_shardyfusion.core.model.encoding import KeyKind, encode_json_value

__all__ = [
    "ENGINE_JSON", "ENGINE_VALUE_COLUMN", "ENGINE_VALUE_ERROR_COLUMN",
    "UTF8_RULE_JSON", "UTF8_RULE_KEY", "UTF8_RULE_ROUTING", "check_utf8", "check_utf8_columns", "check_value_column_type",
    "delete_flags", "encode_values", "first_null_row", "key_kind_of_type", "utf8_error_message",
]

# The rule each kind of column breaks when its text is not UTF-8 (named in the error).
UTF8_RULE_KEY = (
    "a string key column must hold UTF-8 text; keep arbitrary bytes in a binary column "
    "(key_encoding 'raw') instead of casting them to string"
)
UTF8_RULE_ROUTING = "string columns read by CEL routing must hold UTF-8 text"
UTF8_RULE_JSON = (
    "value_format 'json' writes string columns as JSON text, which must be UTF-8; cast a column "
    "holding arbitrary bytes to binary (stored as base64) or repair the data"
)
_HEX_LIMIT = 32
# A plan's value format when the engine encoded the JSON values already (spark_jobs.value_encoder):
# the batch then holds them in ENGINE_VALUE_COLUMN and, when a row can break a rule of JSON values,
# the index of the broken rule in ENGINE_VALUE_ERROR_COLUMN (null for a good row).
ENGINE_JSON = "json-engine"
ENGINE_VALUE_COLUMN = "__shardyfusion_value"
ENGINE_VALUE_ERROR_COLUMN = "__shardyfusion_value_error"


def key_kind_of_type(arrow_type: pa.DataType, *, column: str) -> KeyKind:
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


def _holds_text(arrow_type: pa.DataType) -> bool:
    """Strings, or nested types that may contain strings (validated as a whole)."""
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_nested(arrow_type) or pa.types.is_dictionary(arrow_type))


def check_utf8(array: pa.Array | pa.ChunkedArray, *, column: str, rule: str) -> None:
    """One ``InputDataError`` for the first value of ``array`` that is not valid UTF-8.

    Spark keeps a string's bytes as they are (e.g. after casting binary data to string) and Arrow
    does not check them either, so without this the first Python look at the value fails with a
    bare ``UnicodeDecodeError`` naming no column.
    """
    if not _holds_text(array.type):
        return
    try:
        array.validate(full=True)  # one C++ pass; the slow search below runs only on bad input
        return
    except pa.ArrowInvalid:
        pass
    for i in range(len(array)):
        try:
            array[i].as_py()
        except UnicodeDecodeError as exc:
            raise InputDataError(utf8_error_message(column, bytes(exc.object), exc, rule)) from None


def utf8_error_message(column: str, raw: bytes, exc: UnicodeDecodeError, rule: str) -> str:
    shown = raw[:_HEX_LIMIT].hex() + (f"... ({len(raw)} bytes)" if len(raw) > _HEX_LIMIT else "")
    return (
        f"column {column!r}: value {show_value(raw)} is not valid UTF-8 text (hex {shown}; {exc.reason} at byte "
        f"{exc.start}; rule: {rule})"
    )


def check_utf8_columns(batch: pa.RecordBatch, columns: tuple[str, ...] | list[str], *, rule: str) -> None:
    for name in columns:
        check_utf8(batch.column(name), column=name, rule=rule)


def encode_values(batch: pa.RecordBatch, fmt: str, columns: tuple[str, ...], *,
                  checks: tuple[tuple[str, str], ...] = (), key_column: str | None = None) -> pa.Array:
    """One binary value per row: the column's bytes ('binary'), a compact sorted JSON object ('json',
    the Python reference encoder), or the engine's encoding of it (``ENGINE_JSON``: ``checks`` names
    the column and rule of each error code, ``key_column`` the key an error names)."""
    if fmt == ENGINE_JSON:
        return _engine_values(batch, columns, checks, key_column)
    if fmt == "binary":
        col = batch.column(columns[0])
        check_value_column_type(col.type, column=columns[0])
        # Nulls become empty values: the reader cannot tell them apart, which the README documents.
        return pc.fill_null(col.cast(pa.binary()), b"")
    if fmt == "json":
        check_utf8_columns(batch, columns, rule=UTF8_RULE_JSON)
        rows: list[dict[str, Any]] = batch.select(list(columns)).to_pylist()
        return pa.array([encode_json_value(r) for r in rows], type=pa.binary())
    raise ConfigError(f"value_format {fmt!r} is not supported")


def _engine_values(batch: pa.RecordBatch, columns: tuple[str, ...], checks: tuple[tuple[str, str], ...],
                   key_column: str | None) -> pa.Array:
    if len(columns) > 1:
        errors = batch.column(columns[1])
        if errors.null_count < len(errors):
            at = int(pc.index(pc.is_valid(errors), True).as_py())
            column, rule = checks[errors[at].as_py()]
            key = batch.column(key_column)[at].as_py() if key_column else None
            raise InputDataError(f"column {column!r}: the value of key {show_value(key)} cannot be stored as JSON "
                                 f"(rule: {rule})")
    return batch.column(columns[0])


def first_null_row(array: pa.Array) -> int | None:
    if array.null_count == 0:
        return None
    return int(pc.index(pc.is_null(array), True).as_py())



def delete_flags(batch: pa.RecordBatch, column: str, *, key_column: str) -> list[bool]:
    """The ``delete_column`` of a delta batch; a null flag is a bad row (an upsert would store empty bytes)."""
    flags = batch.column(column)
    at = first_null_row(flags)
    if at is not None:
        key = batch.column(key_column)[at].as_py()
        raise InputDataError(f"column {column!r}: null delete flag for key {show_value(key)} "
                             "(rule: delete_column must be true (delete) or false (upsert), never null)")
    return flags.to_pylist()
