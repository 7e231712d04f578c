"""Values of every JSON value kind for typed-read tests (SPEC §18): an Arrow schema and a row of
each kind, the engine encoder's bytes of a row (``encode_v2``), what a typed read must return for
a table (``expected_rows``: ``to_pylist()``, maps as dicts) and a type-exact comparison."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.value_schema import ValueSchema, ValueType

UTC = dt.UTC
DECIMAL_LIST = pa.list_(pa.decimal128(10, 3))
NESTED = pa.struct([("k", pa.string()), ("m", pa.map_(pa.int64(), DECIMAL_LIST))])
SCHEMA = pa.schema([
    ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()), ("i64", pa.int64()), ("f", pa.float32()),
    ("d", pa.float64()), ("b", pa.bool_()), ("s", pa.string()), ("bin", pa.binary()), ("day", pa.date32()),
    ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")), ("amount", pa.decimal128(38, 2)),
    ("tiny", pa.decimal128(20, 10)), ("tags", pa.list_(pa.string())), ("scores", pa.map_(pa.string(), pa.float64())),
    ("by_id", pa.map_(pa.int32(), pa.timestamp("us", tz="UTC"))),
    ("point", pa.struct([("x", pa.float32()), ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC"))])),
    ("nested", pa.list_(NESTED)),
])
COLUMNS = SCHEMA.names
AT = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
ROW = {
    "i8": -8, "i16": -1600, "i32": 2147483647, "i64": -9223372036854775808, "f": 0.1, "d": 2.5, "b": True,
    "s": 'héllo "q"', "bin": b"\x00\xffab", "day": dt.date(2024, 1, 2), "at": AT,
    "local": dt.datetime(2024, 1, 2, 3, 4, 5), "amount": Decimal("1234.50"), "tiny": Decimal("1E-10"),
    "tags": ["a", None], "scores": [("x", 1.5), ("y", None)], "by_id": [(7, dt.datetime(2024, 1, 2, tzinfo=UTC))],
    "point": {"x": 1.5, "day": dt.date(2024, 1, 3), "at": AT},
    "nested": [{"k": "a", "m": [(1, [Decimal("1.250"), None])]}, None],
}


def maps_as_dicts(value: Any, t: ValueType) -> Any:
    """A ``to_pylist()`` value with every map (a list of pairs there) as the dict typed reads give."""
    if value is None:
        return None
    if t.kind == "map":
        assert t.value is not None
        return {k: maps_as_dicts(v, t.value) for k, v in value}
    if t.kind == "list":
        assert t.element is not None
        return [maps_as_dicts(v, t.element) for v in value]
    if t.kind == "struct":
        return {f.name: maps_as_dicts(value[f.name], f.type) for f in t.fields or ()}
    return value


def expected_rows(table: pa.Table, schema: ValueSchema) -> list[dict[str, Any]]:
    """What a typed read must return for each row of ``table``: its ``to_pylist()``, maps as dicts."""
    return [{c.name: maps_as_dicts(row[c.name], c.type) for c in schema.columns} for row in table.to_pylist()]


def assert_same(got: Any, want: Any, path: str = "$") -> None:
    """Equal, and of the same types throughout (``==`` alone takes 1 for 1.0 and any offset for UTC)."""
    assert type(got) is type(want) or (isinstance(want, dt.datetime) and type(got) is dt.datetime), (path, got, want)
    if isinstance(want, dict):
        assert list(got) == list(want) or set(got) == set(want), (path, got, want)
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, (path, got, want)
        if isinstance(want, dt.datetime):
            assert (got.utcoffset(), want.utcoffset()) in ((None, None), (dt.timedelta(0), dt.timedelta(0))), path
        if isinstance(want, Decimal):
            assert got.as_tuple() == want.as_tuple(), (path, got, want)  # exact: same digits and scale


_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)


def _engine_part(value: Any, t: ValueType, micros: bool) -> Any:
    """One value of ``t`` as the engine encoder stores it, for ``json.dumps``: timestamps as text
    (encoding version 2) or as integer microseconds since the epoch (``micros``, version 3)."""
    if value is None:
        return None
    kind = t.kind
    if kind == "timestamp":
        if micros:
            return (value - _EPOCH_NAIVE.replace(tzinfo=UTC)) // _MICRO
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if kind == "timestamp_ntz":
        return (value - _EPOCH_NAIVE) // _MICRO if micros else value.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if kind in ("date", "decimal", "binary"):
        return {"date": dt.date.isoformat, "decimal": str, "binary": lambda b: base64.b64encode(b).decode()}[kind](value)
    if kind == "map":
        assert t.value is not None
        return {str(k): _engine_part(v, t.value, micros) for k, v in value}
    if kind == "list":
        assert t.element is not None
        return [_engine_part(v, t.element, micros) for v in value]
    if kind == "struct":
        return {f.name: _engine_part(value[f.name], f.type, micros) for f in t.fields or ()}
    return value


def _encode_engine(row: dict[str, Any], schema: ValueSchema, micros: bool) -> bytes:
    obj = {c.name: _engine_part(row[c.name], c.type, micros) for c in schema.columns if c.name in row}
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False).encode()


def encode_v2(row: dict[str, Any], schema: ValueSchema) -> bytes:
    """A ``to_pylist()`` row as the engine encoder's first version (VALUE_ENCODING_ENGINE_TEXT_TIMESTAMPS)
    stored it: timestamps as text."""
    return _encode_engine(row, schema, micros=False)


def encode_v3(row: dict[str, Any], schema: ValueSchema) -> bytes:
    """A ``to_pylist()`` row as the engine encoder (VALUE_ENCODING_ENGINE) stores it: the bytes the
    reader tests write for engine layers."""
    return _encode_engine(row, schema, micros=True)
