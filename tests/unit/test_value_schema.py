"""The value schema a manifest records (SPEC §18): built from Spark's and Arrow's forms alike, stored
and read back, and compared between a base and a change."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardingInfo
from airflow_provider_shardyfusion.core.model.value_schema import (
    VALUE_ENCODING_ENGINE,
    ValueSchema,
    describe_changes,
    from_arrow,
    from_spark_json,
    schema_changes,
)

# What StructType.jsonValue() gives for these columns (Spark 4.2), written out so no Spark is needed.
SPARK_SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": False, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "decimal(38,2)", "nullable": True, "metadata": {}},
    {"name": "at", "type": "timestamp", "nullable": True, "metadata": {}},
    {"name": "local_at", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
    {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True}, "nullable": True,
     "metadata": {}},
    {"name": "scores", "type": {"type": "map", "keyType": "string", "valueType": "double", "valueContainsNull": False},
     "nullable": True, "metadata": {}},
    {"name": "point", "type": {"type": "struct", "fields": [
        {"name": "x", "type": "float", "nullable": True, "metadata": {}},
        {"name": "day", "type": "date", "nullable": True, "metadata": {}}]}, "nullable": True, "metadata": {}},
    {"name": "raw", "type": "binary", "nullable": True, "metadata": {}},
    {"name": "small", "type": "short", "nullable": True, "metadata": {}},
    {"name": "ok", "type": "boolean", "nullable": False, "metadata": {}},
]}
VALUE_COLUMNS = [f["name"] for f in SPARK_SCHEMA["fields"] if f["name"] != "id"]
ARROW_SCHEMA = pa.schema([
    pa.field("name", pa.string()), pa.field("amount", pa.decimal128(38, 2)),
    pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("local_at", pa.timestamp("us")),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("scores", pa.map_(pa.string(), pa.field("value", pa.float64(), nullable=False))),
    pa.field("point", pa.struct([("x", pa.float32()), ("day", pa.date32())])),
    pa.field("raw", pa.binary()), pa.field("small", pa.int16()), pa.field("ok", pa.bool_(), nullable=False),
])


def manifest(**over) -> Manifest:
    """The manifest of an empty 4-shard snapshot, ``over`` replacing fields."""
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    base = dict(run_id=layout.new_run_id(), created_at=when, output_uri="file:///tmp/value-schema", num_dbs=4,
                sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
                shards=(), value_columns=("payload",))
    return Manifest(**{**base, **over})


def test_spark_and_arrow_forms_give_the_same_schema():
    spark = from_spark_json(SPARK_SCHEMA, VALUE_COLUMNS)
    assert spark == from_arrow(ARROW_SCHEMA, VALUE_COLUMNS)
    assert [(c.name, c.type.text(), c.nullable) for c in spark.columns] == [
        ("name", "string", True), ("amount", "decimal(38,2)", True), ("at", "timestamp", True),
        ("local_at", "timestamp_ntz", True), ("tags", "list<string>", True), ("scores", "map<string,double>", True),
        ("point", "struct<x:float,day:date>", True), ("raw", "binary", True), ("small", "int16", True),
        ("ok", "bool", False),
    ]


def test_the_manifest_stores_and_reads_back_the_schema_and_encoding():
    schema = from_spark_json(SPARK_SCHEMA, VALUE_COLUMNS)
    m = manifest(value_format="json", value_columns=tuple(VALUE_COLUMNS), value_schema=schema,
                 value_encoding_version=VALUE_ENCODING_ENGINE)
    back = Manifest.from_bytes(m.to_bytes())
    assert back.value_schema == schema
    assert back.value_encoding_version == VALUE_ENCODING_ENGINE
    assert b'"value_schema":{"columns":[{"name":"name"' in m.to_bytes()


def test_a_manifest_without_a_schema_keeps_the_bytes_earlier_versions_wrote():
    data = manifest().to_bytes()
    assert b"value_schema" not in data and b"value_encoding_version" not in data
    back = Manifest.from_bytes(data)
    assert back.value_schema is None and back.value_encoding_version is None


@pytest.mark.parametrize(("spark_type", "named"), [
    ("interval day to second", "interval day to second"),
    ({"type": "map", "keyType": "binary", "valueType": "string", "valueContainsNull": True}, "map with binary keys"),
    ({"type": "array", "elementType": "void", "containsNull": True}, "void"),
])
def test_a_type_json_cannot_store_is_refused_naming_the_column(spark_type, named):
    schema = {"type": "struct", "fields": [{"name": "v", "type": spark_type, "nullable": True, "metadata": {}}]}
    with pytest.raises(ConfigError, match=rf"value column 'v.*' has type {named}"):
        from_spark_json(schema, ["v"])


def test_changes_name_the_column_and_both_types():
    old = from_arrow(ARROW_SCHEMA, ["name", "amount", "small"])
    new = from_arrow(pa.schema([pa.field("name", pa.string()), pa.field("amount", pa.decimal128(20, 4)),
                                pa.field("extra", pa.int64())]), ["name", "amount", "extra"])
    changes = schema_changes(old, new)
    assert [(c.column, c.kind, c.old, c.new) for c in changes] == [
        ("amount", "changed", "decimal(38,2)", "decimal(20,4)"), ("extra", "added", None, "int64"),
        ("small", "removed", "int16", None)]
    assert describe_changes(changes) == ("column 'amount' changed from decimal(38,2) to decimal(20,4); "
                                         "column 'extra' added (int64); column 'small' removed (was int16)")
    assert [c.is_nullable_addition for c in changes] == [False, True, False]
    assert schema_changes(old, old) == []


def test_a_non_nullable_addition_is_not_a_nullable_addition():
    old = ValueSchema(from_arrow(ARROW_SCHEMA, ["name"]).columns)
    new = from_arrow(pa.schema([pa.field("name", pa.string()), pa.field("n", pa.int64(), nullable=False)]), ["name", "n"])
    (change,) = schema_changes(old, new)
    assert not change.is_nullable_addition
    assert change.describe() == "column 'n' added (int64, not nullable)"
