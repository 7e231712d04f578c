"""More shards than the cluster runs at once: one Spark task writes several shards (SPEC §10).

local[2] has 2 cores, so beyond 2 x TASKS_PER_CORE shards each task writes a contiguous range of
shard ids. Every shard is still its own database under its own attempt folder, read back exactly,
and a task retry replaces the shards of the failed attempt one by one.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.spark_jobs.driver import TASKS_PER_CORE
from airflow_provider_shardyfusion.spark_jobs.shard_task import shards_of_task, task_of_shard
from tests.spark_helpers import (
    assert_exact,
    assert_reader_agrees,
    int_table,
    read_snapshot,
    run,
    write_parquet,
)

pytestmark = pytest.mark.spark
NUM_TASKS = 2 * TASKS_PER_CORE


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # local[2,2]: a failed task is retried once (the retry test needs it).
    session = (
        SparkSession.builder.master("local[2,2]").appName("shardyfusion-many-shards")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _task_ids(manifest) -> set[int]:
    """Spark task attempt ids of the winning attempts: one per task, shared by its shards."""
    return {s.task_attempt_id for s in manifest.shards}


@pytest.mark.parametrize("sort_run_rows", [1_000_000, 150], ids=["writer-sorts", "spark-sorts"])
def test_several_shards_per_task_round_trip_exactly(spark, tmp_path, sort_run_rows):
    table, expected = int_table(12_000, seed=3)
    root = f"file://{tmp_path}/out"
    num_dbs = 61  # not a multiple of the task count: uneven ranges of shard ids
    run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload",
        num_dbs=num_dbs, sort_run_rows=sort_run_rows, batch_size=70)
    manifest, shards = read_snapshot(root)
    assert manifest.num_dbs == num_dbs and len(manifest.shards) == num_dbs
    assert manifest.stats["shard_sort"] == ("writer" if sort_run_rows > 10_000 else "spark")
    assert_exact(manifest, shards, expected, "u64be")
    assert_reader_agrees(root, expected, absent=[12_000, 2**40])
    # NUM_TASKS tasks wrote them: shards of one task share its task attempt id.
    assert len(_task_ids(manifest)) == NUM_TASKS
    for task in range(NUM_TASKS):
        ids = {manifest.shard(d).task_attempt_id for d in shards_of_task(task, num_dbs, NUM_TASKS)}
        assert len(ids) == 1, f"shards of task {task} come from several task attempts: {ids}"


@pytest.mark.s3
def test_a_failed_task_is_retried_and_its_earlier_shards_replaced(spark, tmp_path, any_root):
    table, expected = int_table(6_000, seed=9)
    root, opts = any_root
    num_dbs = 40
    # A shard that is not the first of its task's range fails in attempt 0, after the task uploaded
    # the shards before it.
    failing = next(d for d in range(num_dbs) if shards_of_task(task_of_shard(d, num_dbs, NUM_TASKS), num_dbs,
                                                                NUM_TASKS).start < d)
    task = task_of_shard(failing, num_dbs, NUM_TASKS)
    same_task = shards_of_task(task, num_dbs, NUM_TASKS)
    assert same_task.start < failing
    run(spark, faults={"fail_after_upload": {"db_id": failing, "attempt": 0}}, output_uri=root, storage_options=opts,
        key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload", num_dbs=num_dbs)
    manifest, shards = read_snapshot(root, opts)
    assert_exact(manifest, shards, expected, "u64be")
    for d in range(num_dbs):
        assert manifest.shard(d).attempt == (1 if d in same_task else 0), d
    assert_reader_agrees(root, expected, opts)
    store = open_store(root, opts)
    # The failed attempt's shards (uploaded before the failure, and the failing one) are deleted.
    for d in same_task:
        keys = [o.key for o in store.list(layout.shard_db_prefix(manifest.run_id, d))]
        assert keys and all("/attempt=01-task=" in k for k in keys), (d, keys)


def test_empty_shards_inside_a_task_range_are_left_out(spark, tmp_path):
    # 30 keys over 50 shards: most shards empty, tasks with no rows at all too.
    table = pa.table({"id": pa.array(range(30), pa.int64()), "payload": [f"v{i}" for i in range(30)]})
    expected = {i: f"v{i}".encode() for i in range(30)}
    root = f"file://{tmp_path}/sparse"
    record = run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table),
                 value_column="payload", num_dbs=50)
    manifest, shards = read_snapshot(root)
    assert record.stats["empty_shards"] == 50 - len(manifest.shards) > 0
    assert_exact(manifest, shards, expected, "u64be")
    assert_reader_agrees(root, expected, absent=[30, 31])
