"""The per-shard writer of the Spark job on plain Arrow batches (no Spark): results and error wrapping."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import InputDataError, ShardWriteError
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.spark_jobs.shard_task import TaskResult, WritePlan, write_one_shard


def plan(root: str, **kw) -> WritePlan:
    base = dict(output_uri=root, storage_options={}, run_id="run-t", key_column="id", key_encoding="u64be",
                value_format="binary", value_columns=("v",), batch_size=100, sort_run_rows=250,
                allow_duplicate_keys=False, max_writes_per_second=None, max_write_bytes_per_second=None,
                sample_per_shard=3, sample_columns=("id",))
    base.update(kw)
    return WritePlan(**base)


def batches(start: int, stop: int, step: int = 100):
    for lo in range(start, stop, step):
        ids = list(range(lo, min(lo + step, stop)))
        yield pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array([b"x%d" % i for i in ids])})


def test_a_shard_is_uploaded_under_its_attempt_with_sizes_and_checksums(file_root):
    out = write_one_shard(plan(file_root), batches(0, 1_000), db_id=3, attempt=1, task_attempt_id=42)
    result = out.shard
    assert result.row_count == 1_000 and result.db_id == 3
    assert result.db_url == open_store(file_root).uri(layout.attempt_key("run-t", 3, 1, 42))
    stored = {o.key.rsplit("/", 1)[1]: o.size for o in open_store(file_root).list(layout.shard_db_prefix("run-t", 3))}
    # The data and, next to it, its key index (sort runs of 250 rows: the runs' keys merged into one).
    assert result.key_index is not None and result.key_index.name == "keys-00000.sst"
    assert stored == {f.name: f.size for f in (*result.files, result.key_index)}
    assert result.to_entry().key_index == result.key_index
    assert [row["id"] for row in out.sample] == [0, 1, 2]
    # What crosses from the task to the driver reads back the same.
    assert TaskResult.from_dict(json.loads(json.dumps(out.to_dict()))) == out


def test_an_empty_partition_does_no_storage_io(file_root):
    out = write_one_shard(plan(file_root), iter([pa.record_batch({"id": pa.array([], pa.int64()),
                                                                    "v": pa.array([], pa.binary())})]),
                          db_id=0, attempt=0, task_attempt_id=1)
    assert out.shard.row_count == 0 and out.shard.db_url is None and out.sample == ()
    assert not list(open_store(file_root).list(""))


def test_an_unexpected_failure_is_wrapped_with_shard_attempt_url_and_rows_written(file_root):
    def failing():
        yield from batches(0, 600)
        raise OSError("disk full")

    with pytest.raises(ShardWriteError) as info:
        write_one_shard(plan(file_root), failing(), db_id=5, attempt=2, task_attempt_id=9)
    message = str(info.value)
    url = open_store(file_root).uri(layout.attempt_key("run-t", 5, 2, 9))
    # Runs of 250 rows are flushed after batches of 100: 600 rows were in the database when it failed.
    assert message == f"writing shard 5 attempt 2 to {url} failed after 600 rows: OSError: disk full"
    assert not list(open_store(file_root).list(""))  # nothing uploaded for a failed attempt


def test_a_bad_row_keeps_its_type_and_says_where(file_root):
    def duplicate():
        yield from batches(0, 100)
        yield pa.record_batch({"id": pa.array([7], pa.int64()), "v": pa.array([b"again"])})

    with pytest.raises(InputDataError, match=r"duplicate key 7 .*\[shard 1, attempt 0\]"):
        write_one_shard(plan(file_root), duplicate(), db_id=1, attempt=0, task_attempt_id=3)
