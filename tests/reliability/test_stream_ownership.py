"""Promises (SPEC §14): a stream belongs to one checkpoint, and only ever builds on its own last batch.

Real Structured Streaming queries (``availableNow``, one file per micro-batch) write through
``foreach_batch_writer`` into a ``file://`` root; every snapshot is read back with ``ShardedReader``
and compared with a model the test builds on its own.

- A second query on the same ``stream_id`` with another checkpoint (a copy of the DAG, or the
  checkpoint deleted) numbers its batches from 0 again: before, they were skipped as replays and
  their rows lost without a word. It is refused before it writes anything; ``stream_reset=True``
  is refused too while the owner's lease is live, then continues the stream after its last batch.
- After a rollback, or another writer's full write going live, the next batch would have been a
  delta on that snapshot: it is refused naming both runs; rolling forward, or naming the live run
  in ``accept_live_run``, lets the stream go on.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.stream.batches import batch_run_id
from airflow_provider_shardyfusion.streaming import foreach_batch_writer
from tests.stream_model import NUM_DBS, STREAM, Stream

pytestmark = pytest.mark.spark


def make_stream(spark, folder) -> Stream:
    folder.mkdir()
    return Stream(spark, folder)


def refused(stream: Stream, writer, *needles: str) -> int:
    """The query fails on the writer's ``StreamOwnershipError``, and the root is as it was."""
    before, live = sorted(stream.stream_records()), stream.snapshots().current().run_id
    error = stream.run_query(writer)
    assert error is not None and "StreamOwnershipError" in str(error), error
    for needle in needles:
        assert needle in str(error), (needle, str(error)[:2000])
    assert writer.outcomes == []
    assert sorted(stream.stream_records()) == before and stream.snapshots().current().run_id == live
    return 1


def keys_off_model(stream: Stream) -> tuple[int, int]:
    """How many keys of the model read back otherwise (or deleted keys present), of how many checked."""
    keys = sorted(stream.model) + sorted(stream.deleted)
    with ShardedReader(stream.root) as reader:
        got = reader.multi_get(keys)
    return sum(g != stream.model.get(k) for k, g in zip(keys, got, strict=True)), len(keys)


def test_another_checkpoint_is_refused_until_stream_reset(spark, tmp_path, figure):
    first = make_stream(spark, tmp_path / "a")
    first.add_file({k: f"a0-{k}" for k in range(120)})
    first.add_file({k: f"a1-{k}" for k in range(0, 60, 3)}, [1, 2])
    owner = foreach_batch_writer(first.config, stream_id=STREAM)
    assert first.run_query(owner) is None
    first.check_reader().close()

    # A second query: same stream_id and root, its own source and a new checkpoint.
    second = make_stream(spark, tmp_path / "b")
    second.root, second.config, second.model, second.deleted = first.root, first.config, first.model, first.deleted
    second.add_file({k: f"b0-{k}" for k in range(100, 140)}, [0, 3])
    refusals = refused(second, foreach_batch_writer(second.config, stream_id=STREAM),
                       "belongs to checkpoint", "stream_reset=True", "stream batch 2")
    # Said explicitly, but the owner's lease is live (its query may still run): refused too.
    refusals += refused(second, foreach_batch_writer(second.config, stream_id=STREAM, stream_reset=True),
                        "holds the stream until")

    owner.release()  # what the streaming job does when its query ended
    reset = foreach_batch_writer(second.config, stream_id=STREAM, stream_reset=True)
    assert second.run_query(reset) is None
    assert [(o.batch_id, o.action) for o in reset.outcomes] == [(2, "written")]
    second.check_reader().close()

    # The new checkpoint owns the stream now: a restart of it (a fresh writer) is not refused.
    second.add_file({7: "b1-7"}, [100])
    restart = foreach_batch_writer(second.config, stream_id=STREAM)
    assert second.run_query(restart) is None
    assert [(o.batch_id, o.action) for o in restart.outcomes] == [(3, "written")]
    second.check_reader().close()
    second.check_each_batch_live_once(4)
    # The first checkpoint is the stranger now; its new file is not applied.
    applied = dict(first.model)
    first.add_file({5: "a2-5"})
    refusals += refused(first, foreach_batch_writer(first.config, stream_id=STREAM), "belongs to checkpoint")
    first.model.clear()
    first.model.update(applied)
    first.check_reader().close()
    off, checked = keys_off_model(first)
    figure(queries_refused=refusals, batches_live=len(second.stream_records()), keys_off_model=off,
           keys_checked=checked)


def test_a_stream_does_not_build_on_a_rollback_or_a_foreign_snapshot(spark, tmp_path, figure):
    stream = Stream(spark, tmp_path)
    for n in range(3):
        stream.add_file({k: f"v{n}-{k}" for k in range(n * 20, n * 20 + 80)}, [(n - 1) * 20 + 2] if n else [])
    assert stream.run_query(foreach_batch_writer(stream.config, stream_id=STREAM)) is None
    snapshots = stream.snapshots()
    b1, b2 = batch_run_id(STREAM, 1), batch_run_id(STREAM, 2)

    # A rollback to batch 1: batch 3 would have been a delta on it, without batch 2.
    publish_run(snapshots, run_id=b1, allow_older=True)
    stream.add_file({k: f"v3-{k}" for k in range(150, 170)}, [2])
    refusals = refused(stream, foreach_batch_writer(stream.config, stream_id=STREAM),
                       f"_CURRENT names run {b1!r}", f"last batch 2 was published as run {b2!r}")
    # Rolled forward (the remedy the error names), the same batch goes on top of batch 2.
    publish_run(snapshots, run_id=b2)
    writer = foreach_batch_writer(stream.config, stream_id=STREAM)
    assert stream.run_query(writer) is None and [(o.batch_id, o.action) for o in writer.outcomes] == [(3, "written")]
    off_after_rollback, checked = keys_off_model(stream)

    # Another writer's full snapshot goes live on the root.
    foreign = {k: f"foreign-{k}" for k in range(500, 530)}
    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"id": pa.array(list(foreign), pa.int64()), "payload": list(foreign.values())}), path)
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    record = run_write(spark, build_write_config(output_uri=stream.root, input_path=str(path), key_column="id",
                                                 value_column="payload", num_dbs=NUM_DBS))
    foreign_run = record.run_id
    assert snapshots.current().run_id == foreign_run
    stream.deleted |= set(stream.model) - set(foreign)
    stream.model.clear()
    stream.model.update({k: v.encode() for k, v in foreign.items()})
    stream.add_file({510: "v4-510", 7: "v4-7"}, [511])
    refusals += refused(stream, foreach_batch_writer(stream.config, stream_id=STREAM),
                        f"_CURRENT names run {foreign_run!r}", f"run {batch_run_id(STREAM, 3)!r}",
                        f"accept_live_run={foreign_run!r}")
    # Named explicitly, the stream continues on the foreign snapshot.
    writer = foreach_batch_writer(stream.config, stream_id=STREAM, accept_live_run=foreign_run)
    assert stream.run_query(writer) is None and [(o.batch_id, o.action) for o in writer.outcomes] == [(4, "written")]
    stream.check_reader().close()
    off_after_foreign, more = keys_off_model(stream)
    figure(batches_refused=refusals, keys_off_model=off_after_rollback + off_after_foreign, keys_checked=checked + more)
