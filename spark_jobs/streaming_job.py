"""Entry point: ``spark-submit [--py-files bundle.zip] streaming_job.py --config-b64 <base64 JSON>``.

A Structured Streaming query (SPEC §14): ``readStream`` over a file source (``source_path``,
``source_format``, ``source_schema`` or the schema of the files present) or any source by format
and options, written with ``foreachBatch(foreach_batch_writer(...))``: one published snapshot per
micro-batch, the batch id as the idempotency key. ``trigger`` ``available_now`` processes what is
new since the last run and stops; ``processing_time`` runs until stopped.

The JSON is ``core.stream_job.encode_job_config``: the WriteConfig and the stream settings. The
batches handled are reported in ``runs/_streams/<stream_id>/<report_id>.json`` under the root
(``core.stream_job``), rewritten after every micro-batch and when the query ended, and printed as
one ``SHARDYFUSION_STREAM_RESULT {json}`` line on stderr for humans.

Stopping: SIGTERM, or the operator's stop object (``stop_key``), stops the query after the
micro-batch in progress (a batch interrupted anyway is rewritten by the next run: exactly once).

Exit codes: 0 the query ended (available_now: everything new was written; or it was stopped);
1 the query failed; 2 the config was rejected before the query started.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import sys
import threading

try:
    import spark_jobs  # noqa: F401  (from the --py-files bundle)
except ImportError:  # run from a source checkout without a bundle
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULT_MARKER = "SHARDYFUSION_STREAM_RESULT"
STOP_POLL_S = 2.0
log = logging.getLogger("shardyfusion.streaming_job")


class Reporter:
    """Runs the writer for each micro-batch and keeps the report object under the root current."""

    def __init__(self, writer, store, key: str, stream_id: str):
        self.writer, self.store, self.key, self.stream_id = writer, store, key, stream_id
        self.busy = threading.Lock()  # held while a micro-batch is written: a stop waits for it

    def __call__(self, batch_df, batch_id: int) -> None:
        with self.busy:
            try:
                self.writer(batch_df, batch_id)
            finally:
                self.write(finished=False)

    def result(self, *, finished: bool, error: str | None = None) -> dict:
        return {"stream_id": self.stream_id, "finished": finished, "error": error,
                "batches": [o.to_dict() for o in self.writer.outcomes]}

    def write(self, *, finished: bool, error: str | None = None) -> dict:
        result = self.result(finished=finished, error=error)
        try:
            self.store.put(self.key, json.dumps(result, sort_keys=True).encode())
        except Exception as exc:  # the snapshots are what matters; the report is for the operator
            log.warning("could not write the stream report %s: %s", self.key, exc)
        return result


class Stopper:
    """Stops the query after the micro-batch in progress: on SIGTERM or when the stop object appears."""

    def __init__(self, reporter: Reporter, store, stop_key: str):
        self.reporter, self.store, self.stop_key = reporter, store, stop_key
        self.query = None
        self.requested = threading.Event()

    def request(self, why: str) -> None:
        if not self.requested.is_set():
            log.warning("stopping the streaming query after the micro-batch in progress: %s", why)
            self.requested.set()
            threading.Thread(target=self._stop, name="shardyfusion-stop-query", daemon=True).start()

    def _stop(self) -> None:
        with self.reporter.busy:  # never in the middle of a batch's write
            if self.query is not None:
                self.query.stop()

    def watch(self) -> None:
        def poll() -> None:
            while not self.requested.wait(STOP_POLL_S):
                try:
                    if self.store.exists(self.stop_key):
                        self.request(f"stop requested ({self.stop_key})")
                except Exception as exc:
                    log.debug("stop object not readable: %s", exc)

        threading.Thread(target=poll, name="shardyfusion-stop-watch", daemon=True).start()
        signal.signal(signal.SIGTERM, lambda signum, frame: self.request("SIGTERM"))


def build_reader(spark, stream):
    reader = spark.readStream.format(stream.source_format).options(**stream.source_options)
    if stream.source_schema:
        reader = reader.schema(stream.source_schema)
    elif stream.is_file_source:
        # A file source needs a schema up front: the schema of the files present.
        reader = reader.schema(spark.read.format(stream.source_format).options(**stream.source_options)
                               .load(stream.source_path).schema)
    return reader.load(stream.source_path) if stream.is_file_source else reader.load()


def start_query(spark, stream, fn):
    writer = build_reader(spark, stream).writeStream
    writer = writer.foreachBatch(fn).option("checkpointLocation", stream.checkpoint_location)
    writer = writer.queryName(f"shardyfusion-{stream.stream_id}")
    if stream.trigger == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=stream.processing_time)
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streaming_job")
    parser.add_argument("--config-b64", required=True, help="urlsafe base64 of the streaming job JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from airflow_provider_shardyfusion.core.errors import ShardyfusionError
    from airflow_provider_shardyfusion.core.stream_job import decode_job_config

    try:
        config, stream = decode_job_config(base64.urlsafe_b64decode(args.config_b64.encode()).decode())
        from airflow_provider_shardyfusion.streaming import check_stream_options, foreach_batch_writer

        check_stream_options(stream.source_options)
        writer = foreach_batch_writer(config, stream_id=stream.stream_id)
    except (ShardyfusionError, ValueError) as exc:
        print(f"shardyfusion streaming job failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return run(config, stream, writer)


def run(config, stream, writer) -> int:
    from airflow_provider_shardyfusion.core.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.stream_job import report_key, stop_key
    from spark_jobs.orphan_guard import exit_when_orphaned
    from spark_jobs.sharded_write_job import _classic_session

    store = SnapshotRoot.open(config.output_uri, config.storage_options).store
    reporter = Reporter(writer, store, report_key(stream.stream_id, stream.report_id), stream.stream_id)
    stopper = Stopper(reporter, store, stop_key(stream.stream_id, stream.report_id))
    exit_when_orphaned()
    try:
        spark = _classic_session(f"stream-{stream.stream_id}")
    except Exception as exc:
        print(f"shardyfusion streaming job failed: {type(exc).__name__}: could not open the Spark session: {exc}",
              file=sys.stderr)
        return 2
    error = None
    try:
        stopper.watch()
        stopper.query = query = start_query(spark, stream, reporter)
        if stopper.requested.is_set():  # stopped while the query was starting
            with reporter.busy:
                query.stop()
        query.awaitTermination()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        result = reporter.write(finished=True, error=error)
        print(f"{RESULT_MARKER} {json.dumps(result, sort_keys=True)}", file=sys.stderr)
        spark.stop()
    if error is not None:
        print(f"shardyfusion streaming job failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
