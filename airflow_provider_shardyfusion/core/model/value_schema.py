"""The type of a snapshot's JSON values (SPEC §18): a small tree every run records in its manifest.

Built from the Spark schema of the value columns on the driver (``from_spark_json``: the JSON form
Spark gives, so this module needs no PySpark) or from an Arrow schema (``from_arrow``: the tests'
reference). A reader compiles a typed decoder from it; a delta or a micro-batch is checked against
its base's with ``schema_changes``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from airflow_provider_shardyfusion.core.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "VALUE_ENCODING_ENGINE", "VALUE_ENCODING_ENGINE_TEXT_TIMESTAMPS", "VALUE_ENCODING_PYTHON", "SchemaChange",
    "ValueField", "ValueSchema", "ValueType",
    "check_on_base", "describe_changes", "from_arrow", "from_spark_json", "schema_changes",
]

# Bytes of JSON values by the Python encoder of earlier versions (timestamps as isoformat, maps as
# lists of pairs); by the engine's first version (timestamps as RFC 3339 UTC text with microseconds,
# maps as objects); and by the engine's current one, whose timestamps are integers of microseconds
# since the epoch (Avro's timestamp-micros): formatting them as text was about half the engine's
# encoding CPU (docs/benchmarks.md). Readers decode all three.
VALUE_ENCODING_PYTHON = 1
VALUE_ENCODING_ENGINE_TEXT_TIMESTAMPS = 2
VALUE_ENCODING_ENGINE = 3

TypeKind = Literal[
    "int8", "int16", "int32", "int64", "float", "double", "bool", "string", "binary", "date",
    "timestamp", "timestamp_ntz", "decimal", "list", "map", "struct",
]
# Map keys become JSON member names: only types whose text reads back as the same key.
MAP_KEY_KINDS: frozenset[str] = frozenset({"string", "int8", "int16", "int32", "int64"})


# msgspec Structs, not dataclasses like the manifest around them: the tree is recursive, and the
# manifest codec's presence check walks dataclass fields. Stored by ``msgspec.to_builtins``.
class ValueType(msgspec.Struct, frozen=True, omit_defaults=True):
    """One node: a leaf kind, ``decimal`` with precision and scale, or ``list`` / ``map`` / ``struct``
    with their parts (``*_nullable``: whether an element or a map value may be null). Parts a kind
    does not have are None and left out of the stored form."""

    kind: TypeKind
    precision: int | None = None
    scale: int | None = None
    element: ValueType | None = None
    element_nullable: bool | None = None
    key: ValueType | None = None
    value: ValueType | None = None
    value_nullable: bool | None = None
    fields: tuple[ValueField, ...] | None = None

    def text(self) -> str:
        """``decimal(38,2)``, ``list<string>``, ``map<string,int64>``, ``struct<a:int64,b:string>``."""
        if self.kind == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.kind == "list":
            assert self.element is not None
            return f"list<{self.element.text()}>"
        if self.kind == "map":
            assert self.key is not None
            assert self.value is not None
            return f"map<{self.key.text()},{self.value.text()}>"
        if self.kind == "struct":
            return "struct<" + ",".join(f"{f.name}:{f.type.text()}" for f in self.fields or ()) + ">"
        return self.kind


class ValueField(msgspec.Struct, frozen=True):
    """A value column (or a struct's field): its name, type and whether it may be null."""

    name: str
    type: ValueType
    nullable: bool = True


class ValueSchema(msgspec.Struct, frozen=True):
    """The value columns of a snapshot, in the order the writer was given them."""

    columns: tuple[ValueField, ...]

    def column(self, name: str) -> ValueField | None:
        return next((c for c in self.columns if c.name == name), None)


class SchemaChange(msgspec.Struct, frozen=True):
    """One column that differs between two schemas: ``kind`` is ``added``, ``removed`` or ``changed``
    (type or nullability); ``old`` / ``new`` are type texts (``None`` where the column is absent)."""

    column: str
    kind: Literal["added", "removed", "changed"]
    old: str | None
    new: str | None
    nullable: bool = True

    @property
    def is_nullable_addition(self) -> bool:
        return self.kind == "added" and self.nullable

    def describe(self) -> str:
        if self.kind == "added":
            return f"column {self.column!r} added ({self.new}{'' if self.nullable else ', not nullable'})"
        if self.kind == "removed":
            return f"column {self.column!r} removed (was {self.old})"
        return f"column {self.column!r} changed from {self.old} to {self.new}"


def _shown(t: ValueType, nullable: bool) -> str:
    return t.text() + ("" if nullable else " not null")


def schema_changes(old: ValueSchema, new: ValueSchema) -> list[SchemaChange]:
    """Every column added, removed or changed from ``old`` to ``new`` (in ``new``'s order, removals last)."""
    changes = []
    for col in new.columns:
        before = old.column(col.name)
        if before is None:
            changes.append(SchemaChange(col.name, "added", None, col.type.text(), col.nullable))
        elif before.type != col.type or before.nullable != col.nullable:
            changes.append(SchemaChange(col.name, "changed", _shown(before.type, before.nullable),
                                        _shown(col.type, col.nullable), col.nullable))
    names = {c.name for c in new.columns}
    changes.extend(SchemaChange(c.name, "removed", c.type.text(), None, c.nullable)
                   for c in old.columns if c.name not in names)
    return changes


def describe_changes(changes: Sequence[SchemaChange]) -> str:
    return "; ".join(c.describe() for c in changes)


def check_on_base(base: ValueSchema | None, base_columns: Sequence[str], new: ValueSchema, *, where: str) -> None:
    """A change written on a base (a delta, a micro-batch) may only add nullable columns: anything else
    is one ``ConfigError`` naming each column with its old and new type (``where`` says which write).

    A base written before schemas were recorded has only its column names: then only an added
    column's nullability can be checked.
    """
    if base is None:
        # Unknown old types: take the new ones, so that only additions and removals show.
        old = ValueSchema(tuple(known if (known := new.column(name)) else ValueField(name, ValueType("string"))
                                for name in base_columns))
        changes = [c for c in schema_changes(old, new) if c.kind != "changed"]
    else:
        changes = schema_changes(base, new)
    refused = [c for c in changes if not c.is_nullable_addition]
    if refused:
        raise ConfigError(
            f"{where}: the value schema differs from the base's: {describe_changes(refused)} (a change on a base may "
            "only add nullable columns; write a full snapshot to change, drop or require a column)"
        )


# -- from Spark's JSON form of a schema (``StructType.jsonValue()``) ---------------------------------

_SPARK_LEAVES = {
    "byte": "int8", "short": "int16", "integer": "int32", "long": "int64", "float": "float", "double": "double",
    "boolean": "bool", "string": "string", "binary": "binary", "date": "date", "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_SPARK_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")
# char(n) / varchar(n) read as strings in Spark.
_SPARK_TEXT = re.compile(r"(var)?char\(\d+\)")


def _unsupported(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"value column {where!r} has type {what}, which value_format 'json' cannot store; supported: integers, "
        "float, double, boolean, string, binary, date, timestamp, timestamp_ntz, decimal, and arrays, maps "
        "(string or integer keys) and structs of them"
    )


def _spark_leaf(node: str, where: str) -> ValueType:
    if node in _SPARK_LEAVES:
        return ValueType(_SPARK_LEAVES[node])  # type: ignore[arg-type]
    m = _SPARK_DECIMAL.fullmatch(node)
    if m:
        return ValueType("decimal", precision=int(m.group(1)), scale=int(m.group(2)))
    if node == "decimal":
        return ValueType("decimal", precision=10, scale=0)
    if _SPARK_TEXT.fullmatch(node):
        return ValueType("string")
    raise _unsupported(where, node)


def _from_spark(node: Any, where: str) -> ValueType:
    if isinstance(node, str):
        return _spark_leaf(node, where)
    kind = node.get("type") if isinstance(node, Mapping) else repr(node)
    if kind == "array":
        return ValueType("list", element=_from_spark(node["elementType"], f"{where}[]"),
                         element_nullable=bool(node.get("containsNull", True)))
    if kind == "map":
        key = _from_spark(node["keyType"], f"{where} key")
        if key.kind not in MAP_KEY_KINDS:
            raise _unsupported(where, f"map with {key.text()} keys")
        return ValueType("map", key=key, value=_from_spark(node["valueType"], f"{where} value"),
                         value_nullable=bool(node.get("valueContainsNull", True)))
    if kind == "struct":
        return ValueType("struct", fields=tuple(
            ValueField(f["name"], _from_spark(f["type"], f"{where}.{f['name']}"), bool(f.get("nullable", True)))
            for f in node["fields"]))
    raise _unsupported(where, str(kind))


def from_spark_json(schema: Mapping[str, Any], columns: Sequence[str]) -> ValueSchema:
    """The value schema of ``columns`` in a Spark ``StructType.jsonValue()``; an unsupported type is a
    ``ConfigError`` naming the column (raised on the driver, before any data is read)."""
    fields = {f["name"]: f for f in schema["fields"]}
    out = []
    for name in columns:
        field = fields.get(name)
        if field is None:
            raise ConfigError(f"value column {name!r} is not in the input (columns: {sorted(fields)})")
        out.append(ValueField(name, _from_spark(field["type"], name), bool(field.get("nullable", True))))
    return ValueSchema(tuple(out))


# -- from an Arrow schema (the tests' reference, and tables read in Python) --------------------------

def _from_arrow(t: pa.DataType, where: str) -> ValueType:
    import pyarrow as pa

    ints = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}
    if pa.types.is_signed_integer(t):
        return ValueType(ints[t.bit_width])  # type: ignore[arg-type]
    simple = [(pa.types.is_float32, "float"), (pa.types.is_float64, "double"), (pa.types.is_boolean, "bool"),
              (pa.types.is_string, "string"), (pa.types.is_large_string, "string"), (pa.types.is_binary, "binary"),
              (pa.types.is_large_binary, "binary"), (pa.types.is_date32, "date")]
    for test, kind in simple:
        if test(t):
            return ValueType(kind)  # type: ignore[arg-type]
    if pa.types.is_timestamp(t):
        return ValueType("timestamp" if t.tz else "timestamp_ntz")
    if pa.types.is_decimal(t):
        return ValueType("decimal", precision=t.precision, scale=t.scale)
    if pa.types.is_map(t):
        key = _from_arrow(t.key_type, f"{where} key")
        if key.kind not in MAP_KEY_KINDS:
            raise _unsupported(where, f"map with {key.text()} keys")
        return ValueType("map", key=key, value=_from_arrow(t.item_type, f"{where} value"),
                         value_nullable=t.item_field.nullable)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ValueType("list", element=_from_arrow(t.value_type, f"{where}[]"), element_nullable=t.value_field.nullable)
    if pa.types.is_struct(t):
        return ValueType("struct", fields=tuple(
            ValueField(f.name, _from_arrow(f.type, f"{where}.{f.name}"), f.nullable) for f in t))
    raise _unsupported(where, str(t))


def from_arrow(schema: pa.Schema, columns: Sequence[str]) -> ValueSchema:
    return ValueSchema(tuple(
        ValueField(name, _from_arrow(schema.field(name).type, name), schema.field(name).nullable) for name in columns))

