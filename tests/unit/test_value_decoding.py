"""Typed value reads (SPEC §18): bytes of both JSON encoders decode to what pyarrow's ``to_pylist()``
gives for the same row (maps as dicts), ``json`` and ``raw`` modes, and undecodable values."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, ReaderError
from airflow_provider_shardyfusion.core.model.encoding import encode_json_value
from airflow_provider_shardyfusion.core.model.value_schema import ValueField, ValueSchema, ValueType, from_arrow
from airflow_provider_shardyfusion.core.read.value_decoding import (
    VALUE_DECODINGS,
    located_error,
    validate_value_decoding,
    value_decoder,
)
from tests.typed_values import AT, COLUMNS, ROW, SCHEMA, assert_same, encode_v2, encode_v3, expected_rows

NULLS = dict.fromkeys(COLUMNS)
NULL_PARTS = {**NULLS, "tags": [], "scores": [], "point": {"x": None, "day": None, "at": None},
              "nested": [{"k": None, "m": None}]}
TABLE = pa.Table.from_pylist([ROW, NULLS, NULL_PARTS], schema=SCHEMA)

# What the Python encoder of earlier versions stored for ROW (encode_json_value over to_pylist()).
V1_ROW = (
    b'{"amount":"1234.50","at":"2024-01-02T03:04:05.123456+00:00","b":true,"bin":"AP9hYg==",'
    b'"by_id":[[7,"2024-01-02T00:00:00+00:00"]],"d":2.5,"day":"2024-01-02","f":0.10000000149011612,'
    b'"i16":-1600,"i32":2147483647,"i64":-9223372036854775808,"i8":-8,"local":"2024-01-02T03:04:05",'
    b'"nested":[{"k":"a","m":[[1,["1.250",null]]]},null],'
    b'"point":{"at":"2024-01-02T03:04:05.123456+00:00","day":"2024-01-03","x":1.5},'
    b'"s":"h\xc3\xa9llo \\"q\\"","scores":[["x",1.5],["y",null]],"tags":["a",null],"tiny":"1E-10"}'
)
# What the engine encoder (VALUE_ENCODING_ENGINE) stores for ROW.
V2_ROW = (
    b'{"amount":"1234.50","at":"2024-01-02T03:04:05.123456Z","b":true,"bin":"AP9hYg==",'
    b'"by_id":{"7":"2024-01-02T00:00:00.000000Z"},"d":2.5,"day":"2024-01-02","f":0.10000000149011612,'
    b'"i16":-1600,"i32":2147483647,"i64":-9223372036854775808,"i8":-8,"local":"2024-01-02T03:04:05.000000",'
    b'"nested":[{"k":"a","m":{"1":["1.250",null]}},null],'
    b'"point":{"at":"2024-01-02T03:04:05.123456Z","day":"2024-01-03","x":1.5},'
    b'"s":"h\xc3\xa9llo \\"q\\"","scores":{"x":1.5,"y":null},"tags":["a",null],"tiny":"1E-10"}'
)
# What the engine encoder (VALUE_ENCODING_ENGINE) stores for ROW: timestamps as epoch microseconds.
V3_ROW = (
    b'{"amount":"1234.50","at":1704164645123456,"b":true,"bin":"AP9hYg==",'
    b'"by_id":{"7":1704153600000000},"d":2.5,"day":"2024-01-02","f":0.10000000149011612,'
    b'"i16":-1600,"i32":2147483647,"i64":-9223372036854775808,"i8":-8,"local":1704164645000000,'
    b'"nested":[{"k":"a","m":{"1":["1.250",null]}},null],'
    b'"point":{"at":1704164645123456,"day":"2024-01-03","x":1.5},'
    b'"s":"h\xc3\xa9llo \\"q\\"","scores":{"x":1.5,"y":null},"tags":["a",null],"tiny":"1E-10"}'
)
V2_NULLS = b"{" + b",".join(b'"%s":null' % c.encode() for c in sorted(COLUMNS)) + b"}"
V2_NULL_PARTS = (
    b'{"amount":null,"at":null,"b":null,"bin":null,"by_id":null,"d":null,"day":null,"f":null,"i16":null,'
    b'"i32":null,"i64":null,"i8":null,"local":null,"nested":[{"k":null,"m":null}],'
    b'"point":{"at":null,"day":null,"x":null},"s":null,"scores":{},"tags":[],"tiny":null}'
)


@pytest.fixture(scope="module")
def schema() -> ValueSchema:
    return from_arrow(SCHEMA, COLUMNS)


def test_hand_written_v1_bytes_are_what_the_python_encoder_stored():
    assert encode_json_value(TABLE.to_pylist()[0]) == V1_ROW


def test_the_engine_reference_encoders_write_the_hand_written_bytes(schema):
    rows = TABLE.to_pylist()
    assert [encode_v2(r, schema) for r in rows] == [V2_ROW, V2_NULLS, V2_NULL_PARTS]
    # Version 3 differs only in its timestamps: the nulls are the same bytes.
    assert [encode_v3(r, schema) for r in rows] == [V3_ROW, V2_NULLS, V2_NULL_PARTS]


@pytest.mark.parametrize("stored", [V1_ROW, V2_ROW, V3_ROW], ids=["v1", "v2", "v3"])
def test_every_kind_decodes_as_pyarrow_gives_it(schema, stored):
    assert_same(value_decoder("json", schema, "typed")(stored), expected_rows(TABLE, schema)[0])


@pytest.mark.parametrize("row", [1, 2], ids=["nulls", "null-parts"])
def test_nulls_of_both_encoders(schema, row):
    want = expected_rows(TABLE, schema)[row]
    decode = value_decoder("json", schema, "typed")
    assert_same(decode(encode_json_value(TABLE.to_pylist()[row])), want)
    assert_same(decode(V2_NULLS if row == 1 else V2_NULL_PARTS), want)


def test_v1_timestamps_of_another_zone_read_in_utc():
    zoned = pa.schema([("at", pa.timestamp("us", tz="America/Los_Angeles")),
                       ("m", pa.map_(pa.string(), pa.timestamp("us", tz="Europe/Paris")))])
    table = pa.Table.from_pylist([{"at": AT, "m": [("k", AT)]}], schema=zoned)
    stored = encode_json_value(table.to_pylist()[0])
    assert b'"2024-01-01T19:04:05.123456-08:00"' in stored
    schema = from_arrow(zoned, ["at", "m"])
    assert_same(value_decoder("json", schema, "typed")(stored), {"at": AT, "m": {"k": AT}})


@pytest.mark.parametrize("stored", [b'{"n":1}', b'{"n":1,"x":null}'], ids=["absent", "null"])
def test_a_column_added_later_reads_none(stored):
    schema = ValueSchema((ValueField("n", ValueType("int64")), ValueField("x", ValueType("timestamp"))))
    assert value_decoder("json", schema, "typed")(stored) == {"n": 1, "x": None}


def test_a_struct_field_left_out_reads_none():
    point = ValueType("struct", fields=(ValueField("a", ValueType("int32")), ValueField("b", ValueType("date"))))
    schema = ValueSchema((ValueField("p", point),))
    assert value_decoder("json", schema, "typed")(b'{"p":{"a":1}}') == {"p": {"a": 1, "b": None}}


def test_a_chain_of_every_encoder_decodes_alike(schema):
    decode = value_decoder("json", schema, "typed")
    assert decode(V1_ROW) == decode(V2_ROW) == decode(V3_ROW)


@pytest.mark.parametrize(("micros", "want"), [
    (0, "1970-01-01T00:00:00"), (-1, "1969-12-31T23:59:59.999999"),
    (-62135596800000000, "0001-01-01T00:00:00"), (253402300799999999, "9999-12-31T23:59:59.999999"),
])
def test_epoch_microseconds_read_exactly_at_the_edges(micros, want):
    """Integer arithmetic, no float: the first and last microsecond Python and Spark both hold."""
    schema = ValueSchema((ValueField("at", ValueType("timestamp")), ValueField("local", ValueType("timestamp_ntz"))))
    row = value_decoder("json", schema, "typed")(b'{"at":%d,"local":%d}' % (micros, micros))
    assert row["local"].isoformat() == want and row["local"].tzinfo is None
    assert row["at"].isoformat() == want + "+00:00"


def test_json_raw_and_binary_modes(schema):
    assert value_decoder("json", schema, "json")(V2_ROW) == json.loads(V2_ROW)
    assert value_decoder("json", None, "typed")(V1_ROW) == json.loads(V1_ROW)  # a manifest before SPEC §18
    assert value_decoder("json", schema, "raw") is None
    for mode in VALUE_DECODINGS:
        assert value_decoder("binary", None, mode) is None


def test_compiled_once_per_schema(schema):
    again = from_arrow(SCHEMA, COLUMNS)
    assert again is not schema
    assert value_decoder("json", again, "typed") is value_decoder("json", schema, "typed")


def test_a_bad_mode_names_the_choices():
    with pytest.raises(ConfigError, match=r"value_decoding 'typd'.*\['typed', 'json', 'raw'\]"):
        validate_value_decoding("typd")
    with pytest.raises(ConfigError, match="value_decoding"):
        value_decoder("json", None, "text")


@pytest.mark.parametrize(("stored", "match"), [
    (b'{"amount":"x"}', r"column 'amount' \(decimal\(38,2\)\): Invalid decimal"),
    (b'{"at":"2024-01-02T03:04:05"}', r"column 'at' \(timestamp\): .*timezone"),
    (b'{"scores":[["x"]]}', r"column 'scores' "),
    (b'{"point":{"x":"no"}}', r"column 'point' .*: .*\$\.point\.x"),
    (b'{"i8":', r"not JSON \(Input data was truncated"),
    (b'[1]', r"not a JSON object"),
])
def test_undecodable_values_name_the_column(schema, stored, match):
    with pytest.raises(ReaderError, match=match):
        value_decoder("json", schema, "typed")(stored)


def test_undecodable_json_and_the_reader_context():
    with pytest.raises(ReaderError, match="not JSON") as caught:
        value_decoder("json", None, "json")(b"\xff{")
    located = located_error(caught.value, run_id="r1", db_id=3, key=42)
    assert isinstance(located, ReaderError)
    assert str(located).startswith("run 'r1': the value of key 42 in shard 3 does not decode: it is not JSON")
