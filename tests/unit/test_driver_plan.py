"""Who sorts each shard (sort_within_partitions): decided on the driver from the row count."""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.manifest import ShardingInfo
from airflow_provider_shardyfusion.spark_jobs.driver import _count_is_useful, _spark_sorts_shards
from airflow_provider_shardyfusion.spark_jobs.routing_task import RoutingPlan


def config(**kw):
    base = dict(output_uri="file:///tmp/x", key_column="id", value_column="v", input_path="/in", num_dbs=16)
    base.update(kw)
    return build_write_config(**base)


def hash_plan(num_dbs=16):
    return RoutingPlan(ShardingInfo(strategy="hash", key_column="id"), num_dbs, "int")


@pytest.mark.parametrize(("rows", "expected"), [
    (10_000_000, False),   # 625k rows per shard fit one 1M-row sort run: the writer sorts in memory
    (15_800_000, False),   # 987.5k + 6 sigma still fits
    (16_000_000, True),    # a shard could exceed one sort run: Spark's external sort
    (None, True),          # size unknown: Spark
])
def test_hash_shards_that_fit_one_sort_run_are_sorted_by_the_writer(rows, expected):
    assert _spark_sorts_shards(config(), hash_plan(), rows) is expected


def test_cel_single_db_and_disabled_sorting():
    cel = RoutingPlan(ShardingInfo(strategy="cel", key_column="id", cel_expr="shard_hash(id) % 16u", cel_columns={"id": "int"},
                                    cel_mode="direct"), 16, "int")
    assert _spark_sorts_shards(config(cel_expr="shard_hash(id) % 16u"), cel, 1_000) is True  # skew possible
    assert _spark_sorts_shards(config(num_dbs=1), hash_plan(1), 1_000) is False  # the global sort does it
    assert _spark_sorts_shards(config(sort_within_partitions=False), hash_plan(), None) is False


def test_rows_are_counted_only_where_cheap_or_needed():
    assert _count_is_useful(config()) is True                      # parquet footers
    assert _count_is_useful(config(input_format="orc")) is True
    assert _count_is_useful(config(input_format="csv")) is False   # would read the whole input
    assert _count_is_useful(config(input_path=None, input_sql="select 1 as id, 'a' as v")) is False
    assert _count_is_useful(config(input_format="csv", num_dbs=None, max_keys_per_shard=10)) is True
    assert _count_is_useful(config(sort_within_partitions=False)) is False
