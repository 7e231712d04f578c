"""Hashed integer keys are routed on the JVM (spark_jobs.routing_task.with_shard_id): the Spark
expressions must give exactly core.model.routing.route_key for every key, whatever the integer type."""

from __future__ import annotations

import random

import pytest

from airflow_provider_shardyfusion.core.errors import InputDataError
from airflow_provider_shardyfusion.core.model.manifest import ShardingInfo
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.spark_jobs.errors import translate
from airflow_provider_shardyfusion.spark_jobs.faults import NO_FAULTS, Faults
from airflow_provider_shardyfusion.spark_jobs.routing_task import SHARD_ID_COL, RoutingPlan, with_shard_id

pytestmark = pytest.mark.spark
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("shardyfusion-jvm-routing")
               .config("spark.ui.enabled", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def plan(num_dbs: int) -> RoutingPlan:
    return RoutingPlan(ShardingInfo(strategy="hash", key_column="k"), num_dbs, "int")


def routed(spark, keys, ddl: str, num_dbs: int, faults: Faults = NO_FAULTS) -> dict:
    df = spark.createDataFrame([(k,) for k in keys], f"k {ddl}")
    return {r.k: r[SHARD_ID_COL] for r in with_shard_id(df, plan(num_dbs), faults).collect()}


def test_long_keys_route_exactly_like_core(spark):
    rnd = random.Random(7)
    keys = [0, 1, 2, 7, 42, -1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 2**32, -(2**32), 2**31 - 1]
    keys += [rnd.randint(INT64_MIN, INT64_MAX) for _ in range(5000)]
    for num_dbs in (1, 3, 4, 8, 16, 1000, 4096, 99_999):
        assert routed(spark, keys, "long", num_dbs) == {k: route_key(k, num_dbs) for k in keys}


@pytest.mark.parametrize(("ddl", "lo", "hi"), [("int", -(2**31), 2**31 - 1), ("short", -(2**15), 2**15 - 1),
                                               ("byte", -128, 127)])
def test_narrow_integer_types_route_like_their_value(spark, ddl, lo, hi):
    keys = sorted({lo, hi, 0, -1, 1, *random.Random(ddl).sample(range(lo, hi + 1), 200)})
    assert routed(spark, keys, ddl, 16) == {k: route_key(k, 16) for k in keys}


def test_the_sessions_ansi_setting_is_left_as_it_was(spark):
    spark.conf.set("spark.sql.ansi.enabled", "true")
    routed(spark, [INT64_MAX], "long", 4)
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    # ...and the wrapping arithmetic still holds when the plan runs under ANSI mode.
    assert routed(spark, [INT64_MAX, INT64_MIN], "long", 4) == {INT64_MAX: route_key(INT64_MAX, 4),
                                                                INT64_MIN: route_key(INT64_MIN, 4)}


def test_a_null_key_is_one_clear_input_error(spark):
    df = spark.createDataFrame([(1,), (None,)], "k long")
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's own exception type; translated below
        with_shard_id(df, plan(4)).collect()
    err = translate(info.value)
    assert isinstance(err, InputDataError)
    assert str(err) == "column 'k': null key (rule: keys must not be null)"


def test_the_wrong_router_fault_shifts_every_id(spark):
    keys = list(range(100))
    assert routed(spark, keys, "long", 4, Faults({"wrong_router": True})) == {k: (route_key(k, 4) + 1) % 4 for k in keys}
