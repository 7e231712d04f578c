"""Streaming ingestion (SPEC §14): a real Structured Streaming query, one published snapshot per batch.

Files of upserts and deletions arrive in a source folder between runs of an ``availableNow`` query
that writes through ``foreach_batch_writer``. After every run the snapshot read through
``ShardedReader`` equals a model the test builds on its own by applying every file once, in order;
every batch id is live exactly once; restarts, replays, failed and unpublished attempts are each
resolved to exactly one published run per batch.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_shardyfusion.core.model.value_schema import VALUE_ENCODING_ENGINE
from airflow_provider_shardyfusion.core.stream.batches import batch_run_id, parse_batch_run_id
from airflow_provider_shardyfusion.spark_jobs.faults import Faults
from airflow_provider_shardyfusion.streaming import batch_config, foreach_batch_writer
from tests.stream_model import SCHEMA, STREAM, Stream


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("shardyfusion-streaming")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def batch_df(spark, path):
    return spark.read.schema(SCHEMA).parquet(path)


def test_a_stream_publishes_each_batch_exactly_once(spark, tmp_path):
    stream = Stream(spark, tmp_path)
    writer = foreach_batch_writer(stream.config, stream_id=STREAM)

    # Run 1: the first batch is a full snapshot (deleted rows dropped), the second a delta on it.
    stream.add_file({k: f"v0-{k}" for k in range(200)}, [500])
    stream.add_file({**{k: f"v1-{k}" for k in range(0, 40, 2)}, 300: "v1-300"}, [1, 3, 5, 999])
    assert stream.run_query(writer) is None
    assert [(o.batch_id, o.action) for o in writer.outcomes] == [(0, "written"), (1, "written")]
    first = stream.snapshots()
    assert first.read_manifest(first.find_manifest(batch_run_id(STREAM, 0))).write_mode == "full"
    refreshing = stream.check_reader()
    assert refreshing.manifest.writer["batch_id"] == 1 and refreshing.manifest.write_mode == "delta"
    stream.check_each_batch_live_once(2)

    # Run 2: two more files, two deltas; the third delta reaches max_chain_depth 3 and is compacted.
    stream.add_file({k: f"v2-{k}" for k in (1, 3, 250, 251)}, [0, 2, 300])
    stream.add_file({7: "v3-7"}, [250])
    stream.add_file({k: f"v4-{k}" for k in range(190, 210)}, [4])
    assert stream.run_query(writer) is None
    assert [(o.batch_id, o.action) for o in writer.outcomes[2:]] == [(2, "written"), (3, "written"), (4, "written")]
    stream.check_reader().close()
    seen = [refreshing.manifest.writer["batch_id"]]
    assert refreshing.refresh() is True
    seen.append(refreshing.manifest.writer["batch_id"])
    assert seen == sorted(seen) == [1, 4]
    snapshots = stream.snapshots()
    modes = [snapshots.read_manifest(snapshots.find_manifest(batch_run_id(STREAM, b))).write_mode for b in range(5)]
    assert modes == ["full", "delta", "delta", "delta", "compact"]
    stream.check_each_batch_live_once(5)

    # A restart with the same checkpoint and nothing new writes nothing.
    before = sorted(stream.stream_records())
    fresh = foreach_batch_writer(stream.config, stream_id=STREAM, checkpoint_location=stream.checkpoint)
    assert stream.run_query(fresh) is None
    assert fresh.outcomes == [] and sorted(stream.stream_records()) == before

    # A replayed batch id (the function called again with the same id) is skipped, even with other data.
    fresh(batch_df(spark, stream.files[4]), 4)
    fresh(batch_df(spark, stream.files[1]), 1)
    assert [(o.batch_id, o.action, o.run_id) for o in fresh.outcomes] == [
        (4, "skipped", batch_run_id(STREAM, 4)), (1, "skipped", batch_run_id(STREAM, 1))]
    assert sorted(stream.stream_records()) == before
    refreshing.close()
    stream.check_reader().close()


def test_a_stream_of_json_values_is_encoded_by_the_engine_and_read_typed(spark, tmp_path):
    """SPEC §18: micro-batches use the same encoder as full writes, and record the value schema."""
    stream = Stream(spark, tmp_path, value_format="json")
    writer = foreach_batch_writer(stream.config, stream_id=STREAM)
    stream.add_file({k: f"v0-{k} é" for k in range(100)}, [500])
    stream.add_file({k: f"v1-{k}" for k in range(0, 20, 2)}, [1, 3])
    assert stream.run_query(writer) is None
    reader = stream.check_reader()  # every value a {"payload": ...} dict, as the model has it
    assert reader.manifest.write_mode == "delta" and reader.manifest.value_encoding_version == VALUE_ENCODING_ENGINE
    assert [(c.name, c.type.text()) for c in reader.manifest.value_schema.columns] == [("payload", "string")]
    reader.close()
    stream.check_each_batch_live_once(2)


def test_a_micro_batch_whose_value_schema_differs_from_the_base_is_refused_before_its_rows_are_read(spark, tmp_path):
    """SPEC §18 schema rules, for a micro-batch: checked per batch, on the batch's schema alone."""
    from pyspark.sql import functions as F

    from airflow_provider_shardyfusion.core.errors import ConfigError

    stream = Stream(spark, tmp_path, value_format="json")
    # The writer called as foreachBatch calls it, without a query: batch 0 is the base.
    writer = foreach_batch_writer(stream.config, stream_id=STREAM, checkpoint_location=stream.checkpoint)
    (stream.source.parent / "checkpoint").mkdir()
    (stream.source.parent / "checkpoint" / "metadata").write_text('{"id": "query-1"}')
    writer(batch_df(spark, stream.add_file({k: f"v0-{k}" for k in range(20)})), 0)
    base = batch_run_id(STREAM, 0)

    # The next batch's payload is a bigint; any row of it read raises, so the refusal below proves none was.
    @F.udf("bigint")
    def unread(key):
        raise RuntimeError("a row of the refused batch was read")

    batch = spark.range(3).select(F.col("id"), unread("id").alias("payload"), F.lit(False).alias("deleted"))
    with pytest.raises(ConfigError) as refused:
        writer(batch, 1)
    said = str(refused.value)
    assert f"on base run {base!r}: the value schema differs from the base's: column 'payload' changed from string " \
           "to int64" in said, said
    assert "a row of the refused batch was read" not in said
    assert [(o.batch_id, o.action) for o in writer.outcomes] == [(0, "written")]
    assert stream.snapshots().current().run_id == base
    failed = stream.stream_records()[batch_run_id(STREAM, 1)]
    assert failed.status == "failed" and failed.published_at is None and failed.error.type == "ConfigError"
    stream.check_reader().close()  # still batch 0, exactly
    stream.check_each_batch_live_once(1)


def test_failed_and_unpublished_batches_are_completed_once(spark, tmp_path):
    stream = Stream(spark, tmp_path)
    stream.add_file({k: f"v0-{k}" for k in range(100)})
    assert stream.run_query(foreach_batch_writer(stream.config, stream_id=STREAM)) is None

    # Batch 1's write fails (a shard task fails): the query stops, the batch is not committed.
    stream.add_file({k: f"v1-{k}" for k in range(0, 100, 3)}, [1, 2])
    failing = foreach_batch_writer(stream.config, stream_id=STREAM,
                                   faults=Faults({"fail_shard_attempt": {"db_id": 0, "attempt": 0}}))
    assert stream.run_query(failing) is not None
    records = stream.stream_records()
    assert records[batch_run_id(STREAM, 1)].status == "failed"
    assert stream.snapshots().current().run_id == batch_run_id(STREAM, 0)

    # The restart replays batch 1 and writes it again as -r1.
    writer = foreach_batch_writer(stream.config, stream_id=STREAM)
    assert stream.run_query(writer) is None
    assert [(o.batch_id, o.action, o.run_id) for o in writer.outcomes] == [(1, "written", batch_run_id(STREAM, 1, 1))]
    stream.check_reader().close()
    stream.check_each_batch_live_once(2)

    # Batch 2 is written and recorded succeeded but never published (the driver died between the
    # manifest and _CURRENT): simulated by the same write with publish=False.
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    path = stream.add_file({k: f"v2-{k}" for k in range(50, 150)}, [0, 3])
    staged_id = batch_run_id(STREAM, 2)
    config = batch_config(stream.config, staged_id, "delta")
    config = replace(config, options=replace(config.options, publish=False))
    staged = run_write(spark, config, df=batch_df(spark, path),
                       stream_batch=(STREAM, 2))
    assert staged.status == "succeeded" and staged.published_at is None
    assert stream.snapshots().current().run_id == batch_run_id(STREAM, 1, 1)

    # The query writes batch 2 again: the job never publishes a run it did not write; the staged one stays.
    assert stream.run_query(writer) is None
    rewrite = batch_run_id(STREAM, 2, 1)
    assert [(o.batch_id, o.action, o.run_id) for o in writer.outcomes[1:]] == [(2, "written", rewrite)]
    assert sorted(r for r in stream.stream_records() if parse_batch_run_id(STREAM, r)[0] == 2) == [staged_id, rewrite]
    assert stream.snapshots().read_run(staged_id).published_at is None
    stream.check_reader().close()
    stream.check_each_batch_live_once(3)

    # An empty file is an empty micro-batch: a delta without layers, so its batch id is live too. An
    # attempt of it left 'running' by a dead driver is marked failed and the batch written as -r1.
    from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle

    dead = RunRecordLifecycle(stream.snapshots().store, batch_run_id(STREAM, 3)).start()
    dead._stop.set()  # the "driver" is gone: no more heartbeats
    stream.add_file({})
    assert stream.run_query(writer) is None
    assert [(o.batch_id, o.action, o.run_id) for o in writer.outcomes[2:]] == [
        (3, "written", batch_run_id(STREAM, 3, 1))]
    abandoned = stream.stream_records()[batch_run_id(STREAM, 3)]
    assert abandoned.status == "failed" and abandoned.error.type == "RunAbandoned"
    stream.check_reader().close()
    stream.check_each_batch_live_once(4)


def test_async_progress_tracking_is_refused(spark, tmp_path):
    from airflow_provider_shardyfusion.core.errors import ConfigError

    stream = Stream(spark, tmp_path)
    path = stream.add_file({1: "a"})
    writer = foreach_batch_writer(stream.config, stream_id=STREAM)
    # Spark refuses the query option with a foreachBatch sink at start(): no batch ever reaches the writer.
    with pytest.raises(Exception, match="does not support async progress tracking"):
        (spark.readStream.schema(SCHEMA).parquet(str(stream.source)).writeStream.foreachBatch(writer)
         .option("checkpointLocation", stream.checkpoint).option("asyncProgressTrackingEnabled", "true")
         .trigger(processingTime="1 second").start())
    # The writer refuses the session conf, before anything is written.
    spark.conf.set("spark.sql.streaming.asyncProgressTrackingEnabled", "true")
    try:
        with pytest.raises(ConfigError, match=r"asynchronously.*replay a batch id"):
            writer(batch_df(spark, path), 0)
    finally:
        spark.conf.unset("spark.sql.streaming.asyncProgressTrackingEnabled")
    assert writer.outcomes == [] and stream.stream_records() == {}
