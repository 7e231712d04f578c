"""Several shards per task: partition → contiguous shard ids, and the sorted stream split per shard."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core.errors import ShardAssignmentError
from airflow_provider_shardyfusion.spark_jobs.shard_task import (
    WritePlan,
    shard_runs,
    shards_of_task,
    task_of_shard,
    write_task_shards,
)

ID = "__id"


@given(num_dbs=st.integers(1, 5_000), data=st.data())
def test_every_shard_belongs_to_exactly_the_task_whose_range_holds_it(num_dbs, data):
    num_tasks = data.draw(st.integers(1, num_dbs))
    ranges = [shards_of_task(t, num_dbs, num_tasks) for t in range(num_tasks)]
    assert [d for r in ranges for d in r] == list(range(num_dbs))  # contiguous, in order, no gap
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1  # balanced
    for d in data.draw(st.lists(st.integers(0, num_dbs - 1), max_size=20)):
        assert d in ranges[task_of_shard(d, num_dbs, num_tasks)]


def batch(ids, keys):
    return pa.record_batch({ID: pa.array(ids, pa.int32()), "id": pa.array(keys, pa.int64()),
                            "v": pa.array([b"v%d" % k for k in keys])})


def test_a_sorted_stream_splits_into_one_run_per_shard_across_batch_boundaries():
    stream = [batch([3, 3, 4], [1, 2, 3]), batch([4, 4], [4, 5]), batch([], []), batch([6, 9, 9], [6, 7, 8])]
    got = [(d, [k for b in group for k in b.column("id").to_pylist()]) for d, group in shard_runs(iter(stream), ID)]
    assert got == [(3, [1, 2]), (4, [3, 4, 5]), (6, [6]), (9, [7, 8])]


def plan(root: str) -> WritePlan:
    return WritePlan(output_uri=root, storage_options={}, run_id="run-m", key_column="id", key_encoding="u64be",
                     value_format="binary", value_columns=("v",), batch_size=100, sort_run_rows=1_000,
                     allow_duplicate_keys=False, max_writes_per_second=None, max_write_bytes_per_second=None,
                     sample_per_shard=1, sample_columns=("id",), num_dbs=10, num_tasks=3,
                     shard_id_column=ID)


def test_a_task_writes_each_of_its_shards_under_its_own_attempt_folder(file_root):
    # 10 shards over 3 tasks: task 1 holds shards 4, 5 and 6.
    outs = list(write_task_shards(plan(file_root), iter([batch([4, 4, 6], [1, 2, 3])]), task=1, attempt=2,
                                  task_attempt_id=77))
    assert [(o.shard.db_id, o.shard.row_count) for o in outs] == [(4, 2), (6, 1)]
    assert all("/attempt=02-task=77" in (o.shard.db_url or "") for o in outs)
    assert len({o.shard.db_url for o in outs}) == 2


@pytest.mark.parametrize("ids", [[4, 7], [5, 4]], ids=["outside-the-range", "out-of-order"])
def test_a_row_outside_the_task_range_or_order_fails(file_root, ids):
    with pytest.raises(ShardAssignmentError, match="partition 1 received a row of shard"):
        list(write_task_shards(plan(file_root), iter([batch(ids, [1, 2])]), task=1, attempt=0, task_attempt_id=1))
