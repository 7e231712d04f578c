"""The routing step of the Spark job on plain Arrow batches (no Spark needed): ids equal core routing."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core.errors import InputDataError, ShardAssignmentError
from airflow_provider_shardyfusion.core.model import routing
from airflow_provider_shardyfusion.core.model.manifest import ShardingInfo
from airflow_provider_shardyfusion.spark_jobs.routing_task import RoutingPlan, shard_ids_for_batch


def hash_plan(kind: str, num_dbs: int) -> RoutingPlan:
    return RoutingPlan(ShardingInfo(strategy="hash", key_column="k"), num_dbs, kind)


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


def test_cel_direct_id_out_of_range_is_refused():
    plan = RoutingPlan(ShardingInfo(strategy="cel", key_column="k", cel_expr="k * 2", cel_columns={"k": "int"},
                                     cel_mode="direct"), 4, "int")
    router = plan.cel_router()
    ok = shard_ids_for_batch(plan, pa.record_batch({"k": pa.array([0, 1], pa.int64())}), router)
    assert ok.tolist() == [0, 2]
    with pytest.raises(ShardAssignmentError, match=r"returned shard id 4 for \{'k': 2\}, outside \[0, 4\)"):
        shard_ids_for_batch(plan, pa.record_batch({"k": pa.array([1, 2], pa.int64())}), router)
