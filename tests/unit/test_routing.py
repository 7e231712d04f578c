"""Routing contract (SPEC §4): cross-check vectors, properties, and CEL routing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core.errors import ConfigError, InputDataError, ShardAssignmentError
from airflow_provider_shardyfusion.core.model import routing
from airflow_provider_shardyfusion.core.model.routing import (
    CelRouter,
    CelSpec,
    canonical_bytes,
    compile_cel,
    route_key,
    shard_hash,
    validate_routing_values,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# key -> (db_id for num_dbs 4, 8, 16), straight from SPEC §4.
VECTORS = [
    (0, (1, 1, 9)),
    (1, (2, 6, 14)),
    (2, (3, 3, 3)),
    (7, (3, 7, 15)),
    (42, (0, 0, 8)),
    (-1, (3, 3, 3)),
    ("hello", (1, 5, 13)),
    (b"hello", (1, 5, 13)),
    ("", (2, 2, 2)),
    (2**63 - 1, (2, 6, 6)),
]


@pytest.mark.parametrize(("key", "expected"), VECTORS, ids=[repr(k) for k, _ in VECTORS])
def test_spec_cross_check_vectors(key, expected):
    assert tuple(route_key(key, n) for n in (4, 8, 16)) == expected


def test_spec_vector_keys_0_to_9_over_3_dbs():
    assert [route_key(k, 3) for k in range(10)] == [2, 2, 1, 1, 0, 2, 0, 2, 0, 0]


def test_canonical_bytes_forms():
    assert canonical_bytes(1) == b"\x01" + b"\x00" * 7  # signed little-endian
    assert canonical_bytes(-1) == b"\xff" * 8
    assert canonical_bytes(INT64_MIN) == b"\x00" * 7 + b"\x80"
    assert canonical_bytes("é") == "é".encode()
    assert canonical_bytes(bytearray(b"ab")) == b"ab"
    assert canonical_bytes(memoryview(b"ab")) == b"ab"


def test_route_key_is_hash_mod_num_dbs():
    for key in (0, 1, "x", b"y", INT64_MIN):
        assert route_key(key, 1000) == shard_hash(key) % 1000
        assert 0 <= shard_hash(key) < 2**64


@settings(max_examples=300, deadline=None)
@given(
    key=st.one_of(st.integers(INT64_MIN, INT64_MAX), st.text(), st.binary()),
    num_dbs=st.integers(1, 5000),
)
def test_ids_always_in_range(key, num_dbs):
    assert 0 <= route_key(key, num_dbs) < num_dbs


@settings(max_examples=200, deadline=None)
@given(text=st.text(), num_dbs=st.integers(1, 1000))
def test_str_and_its_utf8_bytes_route_alike(text, num_dbs):
    assert route_key(text, num_dbs) == route_key(text.encode("utf-8"), num_dbs)
    assert shard_hash(text) == shard_hash(text.encode("utf-8"))


@settings(max_examples=100, deadline=None)
@given(key=st.one_of(st.integers(max_value=INT64_MIN - 1), st.integers(min_value=INT64_MAX + 1)))
def test_ints_outside_signed_64_bit_rejected(key):
    with pytest.raises(InputDataError, match="signed 64-bit"):
        route_key(key, 4)


@pytest.mark.parametrize("key", [INT64_MIN, INT64_MAX])
def test_int64_bounds_accepted(key):
    assert 0 <= route_key(key, 7) < 7


@pytest.mark.parametrize("key", [True, False])
def test_bool_rejected(key):
    with pytest.raises(InputDataError, match="bool"):
        route_key(key, 4)


def test_lone_surrogate_str_rejected_clearly():
    with pytest.raises(InputDataError, match="Unicode"):
        route_key("a\ud800", 4)


@pytest.mark.parametrize("key", [None, 1.5, [1], {"a": 1}])
def test_other_types_rejected(key):
    with pytest.raises(InputDataError):
        canonical_bytes(key)


@pytest.mark.parametrize("bad", [0, -1, True, "4", 2.0, None])
def test_validate_num_dbs(bad):
    with pytest.raises(ConfigError, match="num_dbs"):
        routing.validate_num_dbs(bad)
    assert routing.validate_num_dbs(3) == 3


def test_validate_num_dbs_capped_by_five_digit_shard_folders():
    assert routing.validate_num_dbs(99_999) == 99_999
    with pytest.raises(ConfigError, match=r"num_dbs 100000 is above the maximum 99999.*five digits"):
        routing.validate_num_dbs(100_000)


# ---- CEL ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typ", "keys"),
    [("int", [*list(range(-5, 40)), INT64_MAX, INT64_MIN]), ("string", ["", "a", "hello", "é", "x" * 100]),
     ("bytes", [b"", b"hello", b"\x00\xff"]), ("uint", [0, 5, 2**63 - 1])],
)
def test_cel_direct_shard_hash_matches_route_key(typ, keys):
    router = CelRouter(CelSpec("shard_hash(k) % 4u", {"k": typ}, "direct", 4))
    assert [router.route({"k": k}) for k in keys] == [route_key(k, 4) for k in keys]


def test_cel_direct_identity_within_range():
    router = CelRouter(CelSpec("k - 3", {"k": "int"}, "direct", 4))
    assert [router.route({"k": k}) for k in (3, 4, 5, 6)] == [0, 1, 2, 3]


@pytest.mark.parametrize("k", [0, 2, 7, 100])  # k - 3: -3, -1 (negative); 4, 97 (>= num_dbs)
def test_cel_direct_out_of_range_or_negative(k):
    router = CelRouter(CelSpec("k - 3", {"k": "int"}, "direct", 4))
    with pytest.raises(ShardAssignmentError, match=r"outside \[0, 4\)") as info:
        router.route({"k": k})
    assert str(k - 3) in str(info.value)


def test_cel_direct_non_integer_result():
    router = CelRouter(CelSpec("k > 1", {"k": "int"}, "direct", 4))
    with pytest.raises(ShardAssignmentError, match="integer shard id"):
        router.route({"k": 5})


def test_cel_evaluation_error_is_shard_assignment_error():
    router = CelRouter(CelSpec("1 / k", {"k": "int"}, "direct", 4))
    with pytest.raises(ShardAssignmentError, match="failed"):
        router.route({"k": 0})


def test_cel_null_input_names_column():
    router = CelRouter(CelSpec("k % 4", {"k": "int"}, "direct", 4))
    with pytest.raises(InputDataError, match="'k'"):
        router.route({"k": None})


@pytest.mark.parametrize(
    ("typ", "value", "detail"),
    [("int", 2**64, "overflow"), ("uint", -1, "overflow"), ("int", "abc", "invalid literal"), ("bytes", 5, "")],
)
def test_cel_input_not_convertible_to_declared_type(typ, value, detail):
    router = CelRouter(CelSpec("0", {"k": typ}, "direct", 4))
    with pytest.raises(InputDataError) as info:
        router.route({"k": value})
    message = str(info.value)
    assert "column 'k'" in message and repr(value) in message and f"CEL type {typ}" in message
    assert detail in message and "rule:" in message


def test_cel_categorical_string_tokens():
    router = CelRouter(CelSpec("region", {"region": "string"}, "categorical", 3, ("eu", "us", "ap")))
    assert [router.route({"region": r}) for r in ("eu", "us", "ap", "us")] == [0, 1, 2, 1]


def test_cel_categorical_int_tokens():
    router = CelRouter(CelSpec("k / 10", {"k": "int"}, "categorical", 3, (7, 1, 2)))
    assert [router.route({"k": k}) for k in (70, 15, 29)] == [0, 1, 2]


def test_cel_categorical_unknown_token_names_it():
    router = CelRouter(CelSpec("region", {"region": "string"}, "categorical", 3, ("eu", "us", "ap")))
    with pytest.raises(ShardAssignmentError, match="routing_values") as info:
        router.route({"region": "mars-colony"})
    assert "'mars-colony'" in str(info.value)


def test_cel_categorical_token_of_wrong_type_is_unknown():
    router = CelRouter(CelSpec("k", {"k": "string"}, "categorical", 2, (1, 2)))
    with pytest.raises(ShardAssignmentError, match="'1'"):
        router.route({"k": "1"})


@pytest.mark.parametrize("expr", ["k +", "k == ", "(k", "shard_hash(k) %% 4u", ""])
def test_cel_compile_errors_are_config_errors(expr):
    with pytest.raises(ConfigError, match="cel_expr"):
        compile_cel(expr, {"k": "int"})


@pytest.mark.parametrize(("expr", "name"), [("j + 1", "j"), ("size(k) > 1 && zz", "zz"), ("shard_hash(other) % 2u", "other")])
def test_cel_undeclared_names_are_config_errors(expr, name):
    with pytest.raises(ConfigError, match=repr(name)):
        compile_cel(expr, {"k": "string"})


@pytest.mark.parametrize(
    "expr",
    [
        "[1, 2, 3].exists(x, x == k)",
        "[1, 2].all(x, x < k) && [3].exists_one(y, y == k)",
        "size([1, 2].map(x, x * k).filter(y, y > 2)) > 0",
        "[1].exists(x, [2].exists(y, x + y == k))",  # nested: both variables in scope inside
    ],
)
def test_cel_macro_loop_variables_are_not_columns(expr):
    assert compile_cel(expr, {"k": "int"}) is not None


@pytest.mark.parametrize(
    ("expr", "name"),
    [("[1].exists(x, x == zz)", "zz"), ("[1].exists(x, x == 1) && x > 0", "x"), ("[1].map(x, x)[0] + y", "y")],
)
def test_cel_macro_variable_only_binds_inside_its_macro(expr, name):
    with pytest.raises(ConfigError, match=repr(name)):
        compile_cel(expr, {"k": "int"})


def test_cel_macro_router_evaluates():
    router = CelRouter(CelSpec("[1, 2, 3].exists(x, x == k) ? 1 : 0", {"k": "int"}, "direct", 2))
    assert [router.route({"k": k}) for k in (0, 1, 3, 4)] == [0, 1, 1, 0]


def test_cel_declared_columns_compile():
    assert compile_cel("shard_hash(a) % 3u + uint(size(b))", {"a": "int", "b": "string"}) is not None


def test_cel_router_rebuilt_from_spec_agrees():
    spec = CelSpec("shard_hash(k) % 16u", {"k": "string"}, "direct", 16)
    first, second = CelRouter(spec), CelRouter(spec)
    keys = [f"user-{i}" for i in range(50)]
    assert [first.route({"k": k}) for k in keys] == [second.route({"k": k}) for k in keys]


def test_validate_cel_result_range():
    routing.validate_cel_result_range([0, 1, 3], 4)
    with pytest.raises(ShardAssignmentError, match="4"):
        routing.validate_cel_result_range([0, 4], 4)
    with pytest.raises(ShardAssignmentError, match="-1"):
        routing.validate_cel_result_range([-1], 4)


# ---- routing_values -------------------------------------------------------------------------


@pytest.mark.parametrize("values", [["a", "b", "c"], (3, 1, 2), [0]])
def test_validate_routing_values_accepts(values):
    assert validate_routing_values(values) == tuple(values)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (["a", "b", "a"], "unique"),
        ([1, 2, 2], "unique"),
        (["a", None], "null"),
        ([None], "null"),
        (["a", 1], "all strings or all integers"),
        ([True, False], "all strings or all integers"),
        ([1.0, 2.0], "all strings or all integers"),
        ([b"a"], "all strings or all integers"),
        ([], "non-empty"),
        (None, "non-empty"),
        ("abc", "non-empty list"),
    ],
)
def test_validate_routing_values_rejects(values, match):
    with pytest.raises(ConfigError, match=match):
        validate_routing_values(values)


@pytest.mark.parametrize(
    ("columns", "expected"),
    [({"a": "int", "b": None}, {"a": "int", "b": None}), (["a", "b"], {"a": None, "b": None})],
)
def test_normalize_cel_columns(columns, expected):
    assert routing.normalize_cel_columns(columns) == expected


@pytest.mark.parametrize("columns", [{"a": "float"}, {}, [], ["a", ""], "a", {"": "int"}])
def test_normalize_cel_columns_rejects(columns):
    with pytest.raises(ConfigError, match="cel_columns"):
        routing.normalize_cel_columns(columns)
