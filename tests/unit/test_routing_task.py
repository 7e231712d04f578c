"""The routing step of the Spark job on plain Arrow batches (no Spark needed): ids equal core routing."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import routing
from airflow_provider_shardyfusion.core.errors import InputDataError, ShardAssignmentError
from airflow_provider_shardyfusion.core.manifest import ShardingInfo
from spark_jobs.routing_task import RoutingPlan, shard_ids_for_batch


def hash_plan(kind: str, num_dbs: int) -> RoutingPlan:
    return RoutingPlan(ShardingInfo(strategy="hash", key_column="k"), num_dbs, kind)


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.int32(), pa.uint64(), pa.int8()])
def test_integer_batches_route_like_core(arrow_type):
    rng = random.Random(7)
    info_max = {pa.int64(): 2**63 - 1, pa.int32(): 2**31 - 1, pa.uint64(): 2**63 - 1, pa.int8(): 127}[arrow_type]
    info_min = 0 if arrow_type == pa.uint64() else -info_max - 1
    keys = [info_min, info_max, 0] + [rng.randint(info_min, info_max) for _ in range(500)]
    ids = shard_ids_for_batch(hash_plan("int", 13), pa.record_batch({"k": pa.array(keys, arrow_type)}))
    assert ids.tolist() == [routing.route_key(k, 13) for k in keys]


def test_string_and_binary_batches_route_like_core():
    words = ["", "hello", "é", "user-42"]
    ids = shard_ids_for_batch(hash_plan("string", 16), pa.record_batch({"k": pa.array(words)}))
    expected = [2, 13, routing.route_key("é", 16), routing.route_key(b"user-42", 16)]
    assert ids.tolist() == [routing.route_key(w, 16) for w in words] == expected
    blobs = [b"", b"hello", b"\x00\xff"]
    ids = shard_ids_for_batch(hash_plan("binary", 16), pa.record_batch({"k": pa.array(blobs, pa.binary())}))
    assert ids.tolist() == [2, 13, routing.route_key(b"\x00\xff", 16)]


def test_null_key_is_refused_naming_the_column():
    with pytest.raises(InputDataError, match=r"column 'k': null key"):
        shard_ids_for_batch(hash_plan("int", 4), pa.record_batch({"k": pa.array([1, None], pa.int64())}))


def test_uint64_key_beyond_signed_range_is_refused_naming_it():
    batch = pa.record_batch({"k": pa.array([1, 2**63 + 5], pa.uint64())})
    with pytest.raises(InputDataError, match=r"column 'k': key 9223372036854775813 is outside the signed 64-bit range"):
        shard_ids_for_batch(hash_plan("int", 4), batch)


def test_cel_direct_id_out_of_range_is_refused():
    plan = RoutingPlan(ShardingInfo(strategy="cel", key_column="k", cel_expr="k * 2", cel_columns={"k": "int"},
                                     cel_mode="direct"), 4, "int")
    router = plan.cel_router()
    ok = shard_ids_for_batch(plan, pa.record_batch({"k": pa.array([0, 1], pa.int64())}), router)
    assert ok.tolist() == [0, 2]
    with pytest.raises(ShardAssignmentError, match=r"returned shard id 4 for \{'k': 2\}, outside \[0, 4\)"):
        shard_ids_for_batch(plan, pa.record_batch({"k": pa.array([1, 2], pa.int64())}), router)
