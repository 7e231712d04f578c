"""How a reader turns stored value bytes into Python values (SPEC §18): ``typed``, ``json`` or ``raw``.

``typed`` gives, for a JSON snapshot whose manifest records a ``value_schema``, one ``dict`` per
value with the Python types ``pyarrow``'s ``Table.to_pylist()`` gives for that row (maps as
``dict``): ``datetime`` in UTC for ``timestamp``, naive ``datetime`` for ``timestamp_ntz``, ``date``,
exact ``Decimal``, ``bytes``, ``int``, ``float``, ``bool``, ``str``, lists, and dicts for maps and
structs. ``json`` is ``json.loads`` of the stored bytes (what readers always returned), ``raw`` the
stored bytes themselves.

The typed decoder is compiled once per schema with msgspec. A delta chain may hold layers written
by every JSON encoder (``VALUE_ENCODING_PYTHON``: timestamps as text with any UTC offset, maps as
lists of ``[key, value]`` pairs; ``VALUE_ENCODING_ENGINE_TEXT_TIMESTAMPS``: UTC timestamps as text,
maps as objects; ``VALUE_ENCODING_ENGINE``: timestamps as integer microseconds since the epoch), so
every decoder takes them all: a timestamp is text or an integer on the strict msgspec decode, and on
a ``ValidationError`` a tolerant path rewrites the older forms and converts. Pure Python: no
Airflow, PySpark or pyarrow here.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import json
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict, cast, get_args

import msgspec

from airflow_provider_shardyfusion.core.errors import ConfigError, ReaderError, show_value

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.model.value_schema import ValueField, ValueSchema, ValueType

__all__ = ["VALUE_DECODINGS", "ValueDecoding", "located_error", "validate_value_decoding", "value_decoder"]

ValueDecoding = Literal["typed", "json", "raw"]
VALUE_DECODINGS: tuple[ValueDecoding, ...] = get_args(ValueDecoding)

_UTC = _dt.UTC
_INT_KINDS = frozenset({"int8", "int16", "int32", "int64"})
_LEAF_TYPES: dict[str, Any] = {
    "int8": int, "int16": int, "int32": int, "int64": int, "float": float, "double": float, "bool": bool,
    "string": str, "binary": bytes, "date": _dt.date, "decimal": decimal.Decimal,
}
# A tz-aware datetime for ``timestamp`` (older layers carry any UTC offset: converted after decoding),
# a naive one for ``timestamp_ntz``; either may be stored as integer microseconds since the epoch.
_AWARE: Any = Annotated[_dt.datetime, msgspec.Meta(tz=True)] | int
_NAIVE: Any = Annotated[_dt.datetime, msgspec.Meta(tz=False)] | int
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_MICRO = _dt.timedelta(microseconds=1)
# msgspec's error paths: "... - at `$.column...`".
_ERROR_PATH = re.compile(r" - at `\$(.*)`$")


def validate_value_decoding(mode: object) -> ValueDecoding:
    """``mode`` if it is one of ``VALUE_DECODINGS``, else a ``ConfigError`` naming the choices."""
    if mode not in VALUE_DECODINGS:
        raise ConfigError(f"value_decoding {mode!r} is not supported; choose one of {list(VALUE_DECODINGS)}")
    return cast("ValueDecoding", mode)


def value_decoder(value_format: str, schema: ValueSchema | None, mode: str) -> Callable[[bytes], Any] | None:
    """The function a reader applies to each stored value, or None where the bytes are the value.

    ``raw`` and binary snapshots return the bytes (None: no call on the hot path). ``json``, and
    ``typed`` without a ``schema`` (manifests written before SPEC §18), is ``json.loads``. A value
    that does not decode raises ``ReaderError`` naming the column where known; the reader adds
    the key and the shard (``located_error``).
    """
    mode = validate_value_decoding(mode)
    if mode == "raw" or value_format == "binary":
        return None
    if mode == "typed" and schema is not None:
        return _typed_decoder(schema)
    return _json_loads


def located_error(exc: ReaderError, *, run_id: str, db_id: int, key: Any) -> ReaderError:
    """``exc`` from a decoder, restated with the run, the key and the shard its value was read from."""
    return ReaderError(f"run {run_id!r}: the value of key {show_value(key)} in shard {db_id} does not decode: {exc}")


def _json_loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise ReaderError(f"it is not JSON ({exc}; rule: value_format 'json'); stored bytes {show_value(bytes(data))}") from None


# -- the typed decoder ---------------------------------------------------------------------------


def _type_of(t: ValueType, names: list[str]) -> Any:
    """The msgspec type of a value of ``t``. Every part is nullable whatever the schema says: the
    writer enforced nullability, and a reader that refuses a null it holds helps nobody."""
    kind = t.kind
    if kind == "timestamp":
        return _AWARE
    if kind == "timestamp_ntz":
        return _NAIVE
    if kind in _LEAF_TYPES:
        return _LEAF_TYPES[kind]
    if kind == "list":
        assert t.element is not None
        return list[_type_of(t.element, names) | None]  # type: ignore[misc]
    if kind == "map":
        assert t.key is not None
        assert t.value is not None
        key = int if t.key.kind in _INT_KINDS else str
        return dict[key, _type_of(t.value, names) | None]  # type: ignore[misc,valid-type]
    if kind == "struct":
        return _typed_dict(t.fields or (), names, total=True)
    raise ConfigError(f"value_schema type {t.text()} is unknown to this reader; upgrade the reader")


def _typed_dict(fields: tuple[ValueField, ...], names: list[str], *, total: bool) -> Any:
    # Functional syntax: column names need not be identifiers. A fresh name each: msgspec caches by type.
    names.append(f"Value{len(names)}")
    members = {f.name: _type_of(f.type, names) | None for f in fields}
    return TypedDict(names[-1], members, total=total)  # type: ignore[operator]


def _fixer(t: ValueType) -> Callable[[Any], Any] | None:
    """What turns decoded timestamps of ``t`` (at any depth) into datetimes (UTC for ``timestamp``),
    or None if ``t`` holds none."""
    kind = t.kind
    if kind == "timestamp":
        return _to_utc
    if kind == "timestamp_ntz":
        return _to_naive
    if kind == "list":
        assert t.element is not None
        inner = _fixer(t.element)
        return None if inner is None else _each_element(inner)
    if kind == "map":
        assert t.value is not None
        inner = _fixer(t.value)
        return None if inner is None else _each_map_value(inner)
    if kind == "struct":
        return _fields_fixer(t.fields or ())
    return None


def _each_element(fix: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: v if v is None else [fix(x) for x in v]


def _each_map_value(fix: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: v if v is None else {k: fix(x) for k, x in v.items()}


def _fields_fixer(fields: tuple[ValueField, ...]) -> Callable[[Any], Any] | None:
    parts = [(f.name, fix) for f in fields if (fix := _fixer(f.type)) is not None]
    if not parts:
        return None

    def fix_fields(v: Any) -> Any:
        if v is not None:
            for name, fix in parts:
                v[name] = fix(v[name])
        return v

    return fix_fields


def _to_utc(v: _dt.datetime | int | None) -> _dt.datetime | None:
    if isinstance(v, int):
        return _EPOCH_UTC + v * _MICRO  # exact: no float on the way
    return v if v is None or v.tzinfo is _UTC else v.astimezone(_UTC)


def _to_naive(v: _dt.datetime | int | None) -> _dt.datetime | None:
    return _EPOCH_NAIVE + v * _MICRO if isinstance(v, int) else v


def _normalizer(t: ValueType) -> Callable[[Any], Any] | None:
    """What rewrites the older encoder's forms of ``t`` for ``msgspec.convert``: maps stored as lists
    of ``[key, value]`` pairs become dicts, struct fields left out read None. None: nothing to do."""
    kind = t.kind
    if kind == "list":
        assert t.element is not None
        inner = _normalizer(t.element)
        return None if inner is None else (lambda v: [inner(x) for x in v] if isinstance(v, list) else v)
    if kind == "map":
        assert t.value is not None
        value = _normalizer(t.value)

        def normalize_map(v: Any) -> Any:
            if isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):  # [key, value] pairs
                v = dict(v)
            elif value is None or not isinstance(v, dict):
                return v  # anything but an object or pairs is left for convert to refuse
            return v if value is None else {k: x if x is None else value(x) for k, x in v.items()}

        return normalize_map
    if kind == "struct":
        return _object_normalizer(t.fields or ())
    return None


def _object_normalizer(fields: tuple[ValueField, ...]) -> Callable[[Any], Any]:
    parts = [(f.name, _normalizer(f.type)) for f in fields]

    def normalize_object(v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        for name, normalize in parts:
            x = v.get(name)
            v[name] = x if normalize is None or x is None else normalize(x)
        return v

    return normalize_object


def _column_of(message: str, schema: ValueSchema) -> ValueField | None:
    """The value column a msgspec error path starts at (the longest name that fits), if any."""
    m = _ERROR_PATH.search(message)
    if m is None:
        return None
    path = m.group(1)
    fits = [c for c in schema.columns if path == f".{c.name}" or path.startswith((f".{c.name}.", f".{c.name}["))]
    return max(fits, key=lambda c: len(c.name)) if fits else None


def _undecodable(exc: Exception, data: bytes, schema: ValueSchema) -> ReaderError:
    message = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return ReaderError(f"it is not JSON ({message}; rule: value_format 'json'); stored bytes {show_value(bytes(data))}")
    column = _column_of(message, schema)
    where = f"column {column.name!r} ({column.type.text()}): " if column is not None else ""
    return ReaderError(f"{where}{message} (rule: the run's value_schema); stored bytes {show_value(bytes(data))}")


def _tolerant_decoder(schema: ValueSchema, row_type: Any) -> Callable[[bytes], dict[str, Any]]:
    """The slow path, for bytes the strict decode refuses: the older encoder's forms (maps as pairs,
    struct fields left out) rewritten, then converted; anything still wrong is a ``ReaderError``."""
    untyped = msgspec.json.Decoder().decode
    normalize = _object_normalizer(schema.columns)

    def tolerant(data: bytes) -> dict[str, Any]:
        try:
            obj = untyped(data)
        except msgspec.DecodeError as exc:
            raise _undecodable(exc, data, schema) from None
        if not isinstance(obj, dict):
            raise ReaderError(f"it is not a JSON object (rule: value_format 'json'); stored bytes {show_value(bytes(data))}")
        try:
            return cast("dict[str, Any]", msgspec.convert(normalize(obj), row_type, str_keys=True))
        except msgspec.ValidationError as exc:
            raise _undecodable(exc, data, schema) from None

    return tolerant


@functools.lru_cache(maxsize=64)
def _typed_decoder(schema: ValueSchema) -> Callable[[bytes], Any]:
    """Compile the typed decoder of ``schema`` (cached: a refresh to a run of the same schema reuses it)."""
    columns = tuple(c.name for c in schema.columns)
    n_columns = len(columns)
    # Top level total=False: a column a later delta added (nullable) is absent from older values.
    row_type = _typed_dict(schema.columns, [], total=False)
    strict = msgspec.json.Decoder(row_type).decode
    tolerant = _tolerant_decoder(schema, row_type)
    # Top-level timestamps are converted inline (the common case, and the hot path); others by a walk.
    top_ts = tuple(c.name for c in schema.columns if c.type.kind == "timestamp")
    deep = [(c.name, fix) for c in schema.columns if c.type.kind != "timestamp" and (fix := _fixer(c.type)) is not None]

    # Everything the hot path uses is bound as a default argument: a local read is cheaper than a
    # closure cell's, and this runs once per get (a measurable share of a call: docs/benchmarks.md).
    def decode(data: bytes, strict: Any = strict, tolerant: Any = tolerant, columns: Any = columns,
               n_columns: int = n_columns, top_ts: Any = top_ts, deep: Any = deep, utc: Any = _UTC,
               to_utc: Any = _to_utc, invalid: Any = msgspec.ValidationError,
               malformed: Any = msgspec.DecodeError) -> dict[str, Any]:
        try:
            row = strict(data)
        except invalid:
            row = tolerant(data)  # the older encoder's forms, or a real error (named by the tolerant path)
        except malformed as exc:
            raise _undecodable(exc, data, schema) from None
        if len(row) != n_columns:
            for name in columns:
                row.setdefault(name, None)
        for name in top_ts:
            v = row[name]
            if v is not None and (v.__class__ is int or v.tzinfo is not utc):
                row[name] = to_utc(v)
        if deep:
            for name, fix in deep:
                row[name] = fix(row[name])
        return row

    return decode
