"""The streaming job: ``spark-submit --py-files bundle.zip streaming_job.py --config-b64 <base64 JSON>``.

``streaming_job.py`` at the bundle's root is ``scripts/streaming_job.py``, which calls ``run_script``.

A Structured Streaming query (SPEC §14): ``readStream`` over a file source (``source_path``,
``source_format``, ``source_schema`` or the schema of the files present) or any source by format
and options, written with ``foreachBatch(foreach_batch_writer(...))``: one published snapshot per
micro-batch, the batch id as the idempotency key. ``trigger`` ``available_now`` processes what is
new since the last run and stops; ``processing_time`` runs until stopped.

The JSON is ``core.stream.job.encode_job_config``: the WriteConfig and the stream settings. The
batches handled are reported in ``runs/_streams/<stream_id>/<report_id>.json`` under the root
(``core.stream.job``), rewritten after every micro-batch and when the query ended, and printed as
one ``SHARDYFUSION_STREAM_RESULT {json}`` line on stderr for humans (``core.stream.report``).

Stopping: SIGTERM, or the operator's stop object (``stop_key``), stops the query after the
micro-batch in progress (a batch interrupted anyway is rewritten by the next run: exactly once).

Spark Connect (``SPARK_REMOTE`` set by the operator, ``spark_jobs.connect_session``): the same
query from a Connect client. The server calls the micro-batch function in a Python process of its
own driver, which sees neither this script nor the session's artifacts; ``RemoteBatches`` is
pickled by value with the bundle's bytes and imports the writer from them there. What it did is
in the report it rewrites after every batch; the client adopts those batches in its final report.

Exit codes: 0 the query ended (available_now: everything new was written; or it was stopped);
1 the query failed; 2 the config was rejected before the query started.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from ..core.write.job_contract import STREAMING_JOB

if TYPE_CHECKING:
    from ..core.stream.report import BatchOutcome, StreamReport
    from .faults import Faults

__all__ = [
    "STOP_POLL_S", "RemoteBatches", "Reporter", "Stopper", "build_reader", "main", "remote_batches", "run",
    "run_script", "start_query", "stream_writer",
]

STOP_POLL_S = 2.0
log = logging.getLogger("shardyfusion.streaming_job")


class Reporter:
    """Runs the writer for each micro-batch and keeps the report object under the root current.

    Pickled by value with ``RemoteBatches``: the provider's modules are imported inside its methods,
    once the bundle is on the server's path (``RemoteBatches._start``).
    """

    def __init__(self, writer, store, key: str, stream_id: str):
        self.writer, self.store, self.key, self.stream_id = writer, store, key, stream_id
        self.busy = threading.Lock()  # held while a micro-batch is written: a stop waits for it

    def __call__(self, batch_df, batch_id: int) -> None:
        with self.busy:
            try:
                self.writer(batch_df, batch_id)
            finally:
                self.write(finished=False)

    def result(self, *, finished: bool, error: str | None = None,
               batches: tuple[BatchOutcome, ...] | None = None) -> StreamReport:
        from airflow_provider_shardyfusion.core.stream.report import StreamReport

        return StreamReport(self.stream_id, finished, error,
                            tuple(self.writer.outcomes) if batches is None else batches)

    def write(self, *, finished: bool, error: str | None = None,
              batches: tuple[BatchOutcome, ...] | None = None) -> StreamReport:
        report = self.result(finished=finished, error=error, batches=batches)
        try:
            self.store.put(self.key, report.to_bytes())
        except Exception as exc:  # the snapshots are what matters; the report is for the operator
            log.warning("could not write the stream report %s: %s", self.key, exc)
        return report

    def stored_batches(self) -> tuple[BatchOutcome, ...]:
        """The batches of the report as stored (written by the micro-batch function on a Connect server)."""
        from airflow_provider_shardyfusion.core.stream.report import StreamReport

        try:
            if self.store.exists(self.key):
                return StreamReport.from_bytes(self.store.get(self.key).data).batches
        except Exception as exc:  # a malformed report names its field here
            log.warning("could not read the stream report %s: %s", self.key, exc)
        return ()


class RemoteBatches:
    """The micro-batch function over Spark Connect; runs in the server driver's Python process.

    That process imports neither this script nor the session's artifacts, so the instance carries
    the bundle (pickled by value with it) and, on its first batch, puts the bundle first on
    ``sys.path`` and builds the writer and its ``Reporter`` there; they live as long as the query.
    """

    def __init__(self, bundle: bytes, job_json: str, faults: Faults):
        # The faults as plain data: their class can be unpickled only once the bundle is on the path.
        self.bundle, self.job_json, self.fault_spec = bundle, job_json, dict(faults.spec)
        self.reporter: Reporter | None = None

    def __call__(self, batch_df, batch_id: int) -> None:
        if self.reporter is None:
            self.reporter = self._start()
        self.reporter(batch_df, batch_id)

    def _start(self) -> Reporter:
        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="shardyfusion-stream-"), "bundle.zip")
        with open(path, "wb") as fh:
            fh.write(self.bundle)
        # The server's Python process has no other way to the bundle than its search path; after
        # this the imports are the same package-absolute modules as on the client.
        sys.path.insert(0, path)
        from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
        from airflow_provider_shardyfusion.core.stream.job import decode_job_config, report_key
        from airflow_provider_shardyfusion.spark_jobs.faults import Faults

        config, stream = decode_job_config(self.job_json)
        store = SnapshotRoot.open(config.output_uri, config.storage_options).store
        # This process has no logging set up; its stderr goes to the server's log.
        print(f"micro-batch writer of stream {stream.stream_id} started on the Connect server from {path}",
              file=sys.stderr, flush=True)
        return Reporter(stream_writer(config, stream, Faults(self.fault_spec)), store,
                        report_key(stream.stream_id, stream.report_id), stream.stream_id)


def stream_writer(config, stream, faults: Faults):
    """The micro-batch writer of the job's stream settings."""
    from airflow_provider_shardyfusion.spark_jobs.foreach_batch import foreach_batch_writer

    return foreach_batch_writer(config, stream_id=stream.stream_id, checkpoint_location=stream.checkpoint_location,
                                stream_reset=stream.stream_reset, accept_live_run=stream.accept_live_run,
                                faults=faults)


def remote_batches(job_json: str, faults: Faults) -> RemoteBatches:
    """The Connect micro-batch function, with the bundle the operator shipped (``SHARDYFUSION_BUNDLE``)."""
    from pyspark import cloudpickle

    from ..core.write import job_environment as job_env

    # By value: the server's process cannot import this module by name before the bundle is on its path.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with open(os.environ[job_env.BUNDLE], "rb") as fh:
        return RemoteBatches(fh.read(), job_json, faults)


class Stopper:
    """Stops the query after the micro-batch in progress: on SIGTERM or when the stop object appears."""

    def __init__(self, reporter: Reporter, store, stop_key: str, *, remote: bool = False):
        self.reporter, self.store, self.stop_key, self.remote = reporter, store, stop_key, remote
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
                if self.remote:  # the batch runs on the server: wait for its trigger to end
                    _wait_until_idle(self.query)
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


def _wait_until_idle(query, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not query.isActive or not query.status.get("isTriggerActive"):
                return
        except Exception as exc:  # the query ended meanwhile
            log.debug("query status unreadable: %s", exc)
            return
        time.sleep(0.2)


def _release(writer) -> None:
    try:
        writer.release()
    except Exception as exc:  # the lease runs out by itself
        log.warning("could not release the stream's lease: %s", exc)


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
    from .job_entry import run_entry

    return run_entry(argv, prog="streaming_job", job=STREAMING_JOB, config_help="urlsafe base64 of the streaming job JSON",
                     body=_stream)


def _stream(job_json: str) -> None:
    from ..core.stream.job import decode_job_config
    from .faults import from_environment
    from .foreach_batch import check_stream_options
    from .job_entry import rejecting

    with rejecting():
        config, stream = decode_job_config(job_json)
        check_stream_options(stream.source_options)
        faults = from_environment()
        writer = stream_writer(config, stream, faults)
    run(config, stream, writer, job_json, faults)


def run(config, stream, writer, job_json: str, faults: Faults) -> None:
    """Run the query until it ends; ``job_entry.Failed`` if it failed, after its report is written."""
    from ..core.model.snapshot import SnapshotRoot
    from ..core.stream.job import report_key, stop_key
    from . import connect_session
    from .job_entry import Failed, Rejected, open_session
    from .orphan_guard import exit_when_orphaned

    remote = connect_session.requested()
    store = SnapshotRoot.open(config.output_uri, config.storage_options).store
    reporter = Reporter(writer, store, report_key(stream.stream_id, stream.report_id), stream.stream_id)
    stopper = Stopper(reporter, store, stop_key(stream.stream_id, stream.report_id), remote=remote)
    exit_when_orphaned()
    spark, remote = open_session(f"stream-{stream.stream_id}")
    batch_fn: Reporter | RemoteBatches = reporter
    if remote:
        try:
            batch_fn = remote_batches(job_json, faults)
        except Exception as exc:  # the bundle the server needs is not readable: the query never starts
            spark.stop()
            raise Rejected(type(exc).__name__, f"could not read the job's bundle: {exc}") from exc
    failure: tuple[str, str] | None = None
    try:
        stopper.watch()
        stopper.query = query = start_query(spark, stream, batch_fn)
        if stopper.requested.is_set():  # stopped while the query was starting
            with reporter.busy:
                query.stop()
        query.awaitTermination()
    except Exception as exc:
        failure = _failure(exc)
    finally:
        if not remote:  # over Connect the writer lives on the server; its lease runs out
            _release(writer)
        report = reporter.write(finished=True, error=": ".join(failure) if failure else None,
                                batches=reporter.stored_batches() if remote else None)
        print(report.result_line(), file=sys.stderr)
        spark.stop()
    if failure is not None:
        raise Failed(*failure)


def _failure(exc: BaseException) -> tuple[str, str]:
    """The verdict of a failed query: a lost Connect server as one line with its cause (its raw error
    is a multi-line repr of a gRPC call object, or a stopped server's three JVM traces)."""
    from .errors import connect_server_lost

    lost = connect_server_lost(exc)
    if lost is not None:
        return "SparkConnectError", f"the Spark Connect server {lost}"
    return type(exc).__name__, str(exc)


def run_script() -> None:
    """Run ``main`` as the application and end the process with its exit code."""
    from .job_entry import run_script as run_entry_script

    run_entry_script(main)
