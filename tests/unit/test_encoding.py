"""Key encodings and value formats (SPEC §5)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core.errors import ConfigError, InputDataError, KeyEncodingError
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.model.encoding import (
    decode_key,
    decode_value,
    encode_binary_value,
    encode_json_value,
    encode_key,
)

U64_MAX, U32_MAX = 2**64 - 1, 2**32 - 1


@pytest.mark.parametrize(
    ("key", "enc", "stored"),
    [
        (0, "u64be", b"\x00" * 8),
        (1, "u64be", b"\x00" * 7 + b"\x01"),
        (U64_MAX, "u64be", b"\xff" * 8),
        (0x0102030405060708, "u64be", bytes(range(1, 9))),
        (0, "u32be", b"\x00" * 4),
        (0x01020304, "u32be", b"\x01\x02\x03\x04"),
        (U32_MAX, "u32be", b"\xff" * 4),
        ("", "utf8", b""),
        ("héllo", "utf8", "héllo".encode()),
        (b"", "raw", b""),
        (b"\x00\xffab", "raw", b"\x00\xffab"),
    ],
)
def test_encode_decode_known_bytes(key, enc, stored):
    assert encode_key(key, enc) == stored
    assert decode_key(stored, enc) == key


def test_raw_accepts_bytearray_and_memoryview():
    assert encode_key(bytearray(b"ab"), "raw") == b"ab"
    assert encode_key(memoryview(b"ab"), "raw") == b"ab"
    assert type(encode_key(bytearray(b"ab"), "raw")) is bytes


@settings(max_examples=200, deadline=None)
@given(st.integers(0, U64_MAX))
def test_u64be_round_trip(key):
    data = encode_key(key, "u64be")
    assert len(data) == 8 and decode_key(data, "u64be") == key


@settings(max_examples=200, deadline=None)
@given(st.integers(0, U32_MAX))
def test_u32be_round_trip(key):
    data = encode_key(key, "u32be")
    assert len(data) == 4 and decode_key(data, "u32be") == key


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_utf8_round_trip(key):
    assert decode_key(encode_key(key, "utf8"), "utf8") == key


@settings(max_examples=200, deadline=None)
@given(st.binary())
def test_raw_round_trip(key):
    assert decode_key(encode_key(key, "raw"), "raw") == key


@settings(max_examples=300, deadline=None)
@given(st.integers(0, U64_MAX), st.integers(0, U64_MAX))
def test_u64be_preserves_order(a, b):
    ea, eb = encode_key(a, "u64be"), encode_key(b, "u64be")
    assert (a < b) == (ea < eb) and (a == b) == (ea == eb)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, U32_MAX), st.integers(0, U32_MAX))
def test_u32be_preserves_order(a, b):
    ea, eb = encode_key(a, "u32be"), encode_key(b, "u32be")
    assert (a < b) == (ea < eb) and (a == b) == (ea == eb)


def test_sorted_encoded_keys_give_sorted_ints():
    keys = [5, 256, 1, 2**40, 255, 0, 65536, 2**63]
    assert [decode_key(e, "u64be") for e in sorted(encode_key(k, "u64be") for k in keys)] == sorted(keys)


@pytest.mark.parametrize(
    ("key", "enc", "error", "shown"),
    [
        (-1, "u64be", KeyEncodingError, "-1"),
        (U64_MAX + 1, "u64be", KeyEncodingError, str(U64_MAX + 1)),
        (-5, "u32be", KeyEncodingError, "-5"),
        (U32_MAX + 1, "u32be", KeyEncodingError, str(U32_MAX + 1)),
        ("12", "u64be", KeyEncodingError, "'12'"),
        (1.5, "u32be", KeyEncodingError, "1.5"),
        (True, "u64be", KeyEncodingError, "True"),
        (7, "utf8", KeyEncodingError, "7"),
        (b"ab", "utf8", KeyEncodingError, "b'ab'"),
        ("ab", "raw", KeyEncodingError, "'ab'"),
        (3, "raw", KeyEncodingError, "3"),
        ("\ud800", "utf8", KeyEncodingError, "'\\ud800'"),  # lone surrogate: not encodable as UTF-8
    ],
)
def test_bad_keys_name_column_and_value(key, enc, error, shown):
    with pytest.raises(error) as info:
        encode_key(key, enc, column="user_id")
    message = str(info.value)
    assert "'user_id'" in message
    assert shown in message
    assert isinstance(info.value, InputDataError)


@pytest.mark.parametrize("enc", encoding.KEY_ENCODINGS)
def test_null_key_rejected_naming_column(enc):
    with pytest.raises(InputDataError, match=r"'user_id'.*null"):
        encode_key(None, enc, column="user_id")


def test_long_offending_value_is_truncated():
    with pytest.raises(KeyEncodingError) as info:
        encode_key("x" * 10_000, "u64be", column="k")
    assert len(str(info.value)) < 400 and "..." in str(info.value)


def test_unknown_key_encoding():
    with pytest.raises(ConfigError, match="key_encoding 'zigzag'"):
        encode_key(1, "zigzag")
    with pytest.raises(ConfigError, match="key_encoding 'zigzag'"):
        decode_key(b"\x00", "zigzag")
    with pytest.raises(ConfigError, match="key_encoding"):
        encoding.validate_key_encoding(None)


@pytest.mark.parametrize(("kind", "enc"), [("int", "u64be"), ("string", "utf8"), ("binary", "raw")])
def test_default_key_encoding(kind, enc):
    assert encoding.default_key_encoding(kind) == enc
    assert encoding.key_kind_of_encoding(enc) == kind


def test_default_key_encoding_unknown_kind():
    with pytest.raises(ConfigError, match="'double'"):
        encoding.default_key_encoding("double")


# ---- values ---------------------------------------------------------------------------------


def test_binary_values():
    assert encode_binary_value(b"\x00\x01") == b"\x00\x01"
    assert encode_binary_value("é") == "é".encode()
    assert encode_binary_value(None) == b""
    assert decode_value(b"\x00\x01", "binary") == b"\x00\x01"


def test_binary_value_wrong_type_names_column():
    with pytest.raises(InputDataError, match=r"'payload'.*42"):
        encode_binary_value(42, column="payload")


def test_json_value_compact_and_sorted():
    row = {"b": 1, "a": "é", "c": [1, 2.5, None], "d": {"z": 1, "y": 2}, "e": True}
    data = encode_json_value(row)
    assert data == '{"a":"é","b":1,"c":[1,2.5,null],"d":{"y":2,"z":1},"e":true}'.encode()
    assert decode_value(data, "json") == row


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.text(),
                  st.floats(allow_nan=False, allow_infinity=False)),
        max_size=8,
    )
)
def test_json_value_round_trip(row):
    data = encode_json_value(row)
    assert decode_value(data, "json") == row
    assert data == json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_json_value_extended_types():
    row = {"when": dt.datetime(2024, 1, 2, 3, 4, 5), "day": dt.date(2024, 1, 2),
           "amount": decimal.Decimal("12.50"), "blob": b"\x00\xff"}
    assert json.loads(encode_json_value(row)) == {
        "when": "2024-01-02T03:04:05", "day": "2024-01-02", "amount": "12.50",
        "blob": base64.b64encode(b"\x00\xff").decode(),
    }


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), [1.0, float("nan")]])
def test_json_value_refuses_nan_naming_column(bad):
    with pytest.raises(InputDataError) as info:
        encode_json_value({"ok": 1, "score": bad})
    assert "'score'" in str(info.value)
    assert "'ok'" not in str(info.value)


def test_json_value_unserializable_names_column():
    with pytest.raises(InputDataError, match="'obj'"):
        encode_json_value({"obj": object()})


def test_unknown_value_format():
    with pytest.raises(ConfigError, match="value_format 'avro'"):
        decode_value(b"", "avro")
    with pytest.raises(ConfigError, match="value_format"):
        encoding.validate_value_format("text")
    assert encoding.validate_value_format("json") == "json"


def test_decode_key_of_the_wrong_width_is_a_clear_error():
    from airflow_provider_shardyfusion.core.errors import KeyEncodingError
    from airflow_provider_shardyfusion.core.model.encoding import decode_key

    with pytest.raises(KeyEncodingError, match="3 bytes; u64be keys are 8"):
        decode_key(b"abc", "u64be")


@pytest.mark.parametrize(
    ("text", "enc", "how", "key"),
    [
        ("42", "u64be", "auto", 42), ("-3", "u32be", "auto", -3), ("x1", "u64be", "auto", "x1"),
        ("1_0", "u64be", "auto", "1_0"), ("42", "utf8", "auto", "42"), ("ab", "raw", "auto", b"ab"),
        ("7", "utf8", "int", 7), ("42", "u64be", "str", "42"), ("é", "utf8", "bytes", "é".encode()),
        ("00ff", "raw", "hex", b"\x00\xff"),
    ],
)
def test_key_from_text_reads_text_as_the_snapshots_key_type(text, enc, how, key):
    got = encoding.key_from_text(text, enc, how)
    assert got == key and type(got) is type(key)


def test_key_from_text_names_text_that_is_not_the_forced_type():
    with pytest.raises(KeyEncodingError, match="'x' is not an integer"):
        encoding.key_from_text("x", "u64be", "int")
    with pytest.raises(KeyEncodingError, match="'zz' is not hex"):
        encoding.key_from_text("zz", "raw", "hex")
    with pytest.raises(ConfigError, match="key type 'octal' is not supported"):
        encoding.key_from_text("1", "u64be", "octal")


@pytest.mark.parametrize(("enc", "how", "rule"), [
    ("u64be", "auto", "u64be takes 0..18446744073709551615"), ("u32be", "int", "u32be takes 0..4294967295"),
    ("utf8", "int", "integer keys are u32be or u64be; u64be takes 0..18446744073709551615"),
])
@pytest.mark.parametrize("text", ["9" * 5000, "-" + "1" * 4400, "12345678901234567890123"])
def test_a_number_longer_than_any_key_is_refused_naming_its_first_digits_and_the_rule(text, enc, how, rule):
    """Before int() reads it: Python refuses a text of over 4300 digits with a ValueError naming no key."""
    digits = len(text.lstrip("-"))
    with pytest.raises(KeyEncodingError) as caught:
        encoding.key_from_text(text, enc, how)
    shown = repr(text) if len(text) <= 38 else repr(text)[:37] + "..."  # its first characters
    assert str(caught.value) == f"key {shown} ({digits} digits) is out of range (rule: {rule})"
    with pytest.raises(KeyEncodingError, match=rf"\({digits} digits\) is out of range"):
        encoding.keys_from_json([1, text], enc, how)
    if digits < 4300:  # what JSON decoding gives: a number of as many digits is refused as its text is
        with pytest.raises(KeyEncodingError, match=rf"\({digits} digits\) is out of range"):
            encoding.keys_from_json([1, int(text)], enc, how)


def test_leading_zeros_do_not_count_as_digits():
    assert encoding.key_from_text("0" * 5000 + "42", "u64be") == 42
    assert encoding.key_from_text("-" + "0" * 5000 + "7", "u32be", "int") == -7  # the range is encode_key's rule
    assert encoding.key_from_text(str(2**64 - 1), "u64be") == 2**64 - 1  # the largest key still reads


@pytest.mark.parametrize(
    ("keys", "enc", "how", "want"),
    [
        (["42", 7, "x"], "u64be", "auto", [42, 7, "x"]), ([2**64, "-1"], "u32be", "int", [2**64, -1]),
        ([7, "7"], "utf8", "auto", ["7", "7"]), ([7, "ab"], "raw", "auto", [b"7", b"ab"]),
        ([7, "7"], "u64be", "str", ["7", "7"]), ([15, "0f"], "raw", "hex", [b"\x15", b"\x0f"]),
    ],
)
def test_keys_from_json_are_what_their_text_would_be(keys, enc, how, want):
    got = encoding.keys_from_json(keys, enc, how)
    assert got == want and [type(k) for k in got] == [type(k) for k in want]
    assert got == [encoding.key_from_text(str(k), enc, how) for k in keys]  # an integer reads as its text does


def test_keys_from_json_names_the_key_that_does_not_parse():
    with pytest.raises(KeyEncodingError, match="'x' is not an integer"):
        encoding.keys_from_json([1, "x"], "u64be", "int")
    with pytest.raises(ConfigError, match="key type 'octal' is not supported"):
        encoding.keys_from_json(["1"], "u64be", "octal")  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "enc"), [(2**64 - 1, "u64be"), ("ü key", "utf8"), (b"\xff\x00", "raw"), (b"", "raw")])
def test_a_shown_key_reads_back_as_the_same_key(key, enc):
    shown = encoding.key_to_show(decode_key(encode_key(key, enc), enc))
    json.dumps(shown)  # JSON carries it
    if isinstance(shown, dict):
        assert shown == {"hex": key.hex()} and encoding.key_from_text(shown["hex"], enc, "hex") == key
    else:
        assert encoding.key_from_text(str(shown), enc) == key
