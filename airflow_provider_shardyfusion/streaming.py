"""Streaming ingestion (SPEC §14): one published snapshot per Structured Streaming micro-batch.

``foreach_batch_writer(config, stream_id=...)`` returns the function for
``DataStreamWriter.foreachBatch``. It runs on the Spark driver (no Airflow import). Each micro-batch
is written through the same job code as a batch write (``spark_jobs.driver.run_write``, on the
micro-batch DataFrame): the first batch on a root without ``_CURRENT`` as a full snapshot, every
later one as a delta (SPEC §13) on the live snapshot, and published; ``max_chain_depth`` compacts
automatically.

Exactly once: the batch id is the idempotency key, with a ``stream_id`` that stays the same across
restarts (Delta Lake's ``txnAppId`` / ``txnVersion``). Before writing, the function reads the
stream's run records under the root (``core.stream.batches.decide_batch``): a batch already
published, or below the last published one, is skipped; an attempt that failed (or whose writer
died) is written again as ``<stream_id>-b<batch_id:012d>-r<n>``, and so is one that succeeded but
was never published (a crash between its manifest and ``_CURRENT``): the job commits only the run
it writes, and publishing a staged run is the operators' and the CLI's. Spark commits a batch to
its checkpoint only after the function returned, so a crash anywhere replays the batch id with the
same data, and the decision makes the replay a no-op or a rewrite. One query writes a stream at
a time (as one query uses a checkpoint): a ``running`` attempt of the batch is taken as a dead
writer's and marked failed, which also fences it out of ever going live. Each run's manifest and
run record carry ``writer.stream_id`` and ``writer.batch_id``.

Ownership (``core.stream.owner``): the stream belongs to the checkpoint that numbers its batches
and to one writer's lease; another checkpoint is refused unless ``stream_reset=True``. A batch is
refused while ``_CURRENT`` names another run than the stream's last batch (``check_live_run``)
unless it is ``accept_live_run``. Just before a batch's run is committed the writer checks it still
holds the stream (and renews its lease): one that lost it meanwhile fails the batch unpublished.

The configuration's ``input`` is not read (each batch's DataFrame is the input); it may describe
the stream's source. ``delete_column`` needs ``write_mode="delta"`` in the config; the write mode of
each batch is chosen by the writer. In the first (full) batch rows flagged deleted are dropped.

Async progress tracking (``asyncProgressTrackingEnabled``) is refused: it commits offsets
asynchronously, so after a restart a batch id can be replayed with other data, or ids skipped, and
the batch id is no longer a key for "this data". Spark itself refuses the query option with a
foreachBatch sink at ``start()`` ("Sink ForeachBatchSink does not support async progress
tracking", checked on Spark 4.2 by the tests); from inside the function the query's options are
not visible (the micro-batch's session does not list its query), so the function checks only the
session conf ``spark.sql.streaming.asyncProgressTrackingEnabled``; ``check_stream_options``
refuses the option for a job that builds the query (call it before ``start()``).
"""

from __future__ import annotations

from .spark_jobs.foreach_batch import (
    ASYNC_PROGRESS_CONF,
    ASYNC_PROGRESS_OPTION,
    BatchOutcome,
    BatchWriter,
    batch_config,
    check_session,
    check_stream_options,
    foreach_batch_writer,
)

__all__ = [
    "ASYNC_PROGRESS_CONF",
    "ASYNC_PROGRESS_OPTION",
    "BatchOutcome",
    "BatchWriter",
    "batch_config",
    "check_session",
    "check_stream_options",
    "foreach_batch_writer",
]
