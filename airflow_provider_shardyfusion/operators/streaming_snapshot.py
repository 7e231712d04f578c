"""``StreamingSnapshotOperator``: a Structured Streaming query, one published snapshot per micro-batch (SPEC §14).

A sibling of ``ShardedWriteOperator`` on ``operators.spark_job.SparkJobOperator``: it runs
``spark_jobs/streaming_job.py`` the same way (bundle, credentials, the launcher of the connection's
type); only the application and the JSON it gets differ (``core.stream.job``). The job reports the batches it handled in
``runs/_streams/<stream_id>/<report_id>.json`` under the root; the operator reads that report for
its XCom and emits one asset event per published batch. Importing this module is light (no
pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.assets import emit_snapshot_event
from airflow_provider_shardyfusion.core.arguments import as_mapping, as_number
from airflow_provider_shardyfusion.core.errors import ConfigError, SparkConnectError, SparkSubmitError, StorageError
from airflow_provider_shardyfusion.core.lifecycle.write_attempts import SPARK_SUBMIT
from airflow_provider_shardyfusion.core.model import write_args
from airflow_provider_shardyfusion.core.model.write_args import DEFAULTS as _D
from airflow_provider_shardyfusion.core.write.input_check import check_write_input
from airflow_provider_shardyfusion.operators.spark_job import SPARK_JOB_ARGS, SparkJobOperator

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow.sdk import Context

    from airflow_provider_shardyfusion.core.model.config import WriteConfig
    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding, ValueFormat
    from airflow_provider_shardyfusion.core.stream.job import StreamSettings, StreamTrigger
    from airflow_provider_shardyfusion.core.stream.report import StreamReport
    from airflow_provider_shardyfusion.submission.bundle import Bundle

__all__ = ["StreamingSnapshotOperator"]

_STREAM_FIELDS = ("source_path", "source_format", "source_schema", "source_options", "checkpoint_location",
                  "stream_id", "trigger", "processing_time", "accept_live_run")
# The write arguments a stream does not take: the source replaces the input, and the job chooses the
# run id, publishing and write mode per batch; the task always runs the query itself.
_WHY_NOT_STREAM_ARG = {
    **dict.fromkeys(("input_path", "input_format", "input_options", "input_table", "input_sql", "cache_input"),
                    "the stream's source is the input: use source_path, source_format, source_schema and "
                    "source_options"),
    "run_id": "each micro-batch's run id is <stream_id>-b<batch_id:012d>: set stream_id",
    "publish": "every micro-batch is published (the next one is a delta on it)",
    "write_mode": "the writer chooses each micro-batch's write mode: full on an empty root, then delta "
                  "(max_chain_depth compacts)",
    "base_run_id": "every micro-batch is written on the live snapshot",
    **dict.fromkeys(("deferrable", "poll_interval", "deferral_timeout"),
                    "the task runs the query itself: deferring is not supported"),
}
_NOT_STREAM_ARGS = frozenset(_WHY_NOT_STREAM_ARG)
# Declared once in core.model.write_args; tests/unit/test_write_args.py checks the signature and docs below.
_WRITE_FIELDS = tuple(a.name for a in write_args.OPERATOR_ARGS if a.name not in _NOT_STREAM_ARGS)
# The write config every batch starts from: each batch is a delta, published (the job sets the run
# id and the base per batch); the input fields only describe the source (``_source_input``).
_BATCH_CONFIG = {"input_options": None, "input_sql": None, "run_id": None, "cache_input": _D.cache_input,
                 "publish": True, "write_mode": "delta", "base_run_id": None}


class StreamingSnapshotOperator(SparkJobOperator):
    """Ingest a stream into a snapshot: every micro-batch a published delta (the first one full).

    Runs a Spark Structured Streaming query over a file source (``source_path``, ``source_format``,
    ``source_schema`` or the schema of the files present, ``source_options``) or any source given by
    ``source_format`` and ``source_options`` alone, with ``checkpoint_location``. Each micro-batch
    goes through ``airflow_provider_shardyfusion.streaming.foreach_batch_writer``: written as a
    delta on the live snapshot and published, the batch id as the idempotency key (run ids
    ``<stream_id>-b<batch_id:012d>[-r<n>]``), so a replayed batch is skipped and a failed one
    rewritten; ``max_chain_depth`` compacts automatically.

    ``trigger="available_now"`` processes everything new since the last run and stops: one
    scheduled task, one increment. ``trigger="processing_time"`` with ``processing_time`` (e.g.
    ``"1 minute"``) runs until the task is stopped; ``on_kill`` asks the job to stop the query after
    the micro-batch in progress, waits at most ``stop_timeout`` seconds, then kills spark-submit.
    The stream belongs to the query's checkpoint: another checkpoint on the same ``stream_id`` is
    refused unless ``stream_reset=True``; a batch is refused while ``_CURRENT`` names another run than
    the stream's last batch (a rollback, another writer) unless it is ``accept_live_run``.

    Returns (XCom) ``{"stream_id", "output_uri", "trigger", "batches": [{"batch_id", "run_id",
    "action", "rows"}, ...], "published", "live_run_id"}``: ``action`` is ``written`` (the batch
    was written and published), ``published`` (an earlier attempt's run was published) or
    ``skipped`` (already live, or below the last live batch). An asset event for ``output_uri`` is
    emitted per published batch (through the snapshot's ``AssetAlias``). With a ``spark_connect``
    connection the job runs as a Connect client in a child process of the task (as the write
    operator's does) and the micro-batch function runs on the server's driver, which then needs the
    writer's libraries and reaches the output root with the cluster's own credentials. Deferring is
    not supported: the task runs the query itself.

    :param output_uri: root of the snapshot, ``s3://bucket/prefix`` or ``file:///abs/dir``. (templated)
    :param source_path: folder of the file source the query reads; ``None`` for a source given by ``source_format``
        and ``source_options`` alone (e.g. Kafka). (templated)
    :param source_format: Spark streaming source: a file format (parquet, orc, json, csv, avro, text) with
        ``source_path``, or any source name. (templated)
    :param source_schema: schema of the source as a DDL string (``"id LONG, v STRING"``); ``None``: for a file
        source the schema of the files present when the job starts. (templated)
    :param source_options: options of the streaming source (e.g. ``maxFilesPerTrigger``; never credentials).
        ``asyncProgressTrackingEnabled`` is refused. (templated)
    :param checkpoint_location: the query's checkpoint (offsets and commits); keep it with ``stream_id`` across
        runs. (templated)
    :param stream_id: the stream's idempotency id, the start of every batch's run id; ``None``:
        ``<dag_id>.<task_id>`` (with ``.<map_index>`` for a mapped task), other characters than ``[A-Za-z0-9._-]``
        replaced by ``_``. (templated)
    :param trigger: ``available_now`` (process what is new, then stop) or ``processing_time`` (run until stopped).
        (templated)
    :param processing_time: the interval of ``trigger='processing_time'``, e.g. ``"30 seconds"``. (templated)
    :param stream_reset: let this query's checkpoint take the stream over from the checkpoint that owns it (a new or
        reset checkpoint): its batches continue after the newest batch on the root. Without it such a query is refused
        before it writes anything (its batch ids would restart at 0 and be skipped as replays).
    :param accept_live_run: continue the stream on this run although ``_CURRENT`` names it instead of the stream's last
        published batch (after a deliberate rollback, or another writer's run); without it such a batch is refused.
        (templated)
    :param key_column: the lookup key column (integer, string or binary). (templated)
    :param value_column: the value column (binary or string) with ``value_format='binary'``. (templated)
    :param value_columns: the columns stored as one JSON object per key with ``value_format='json'``. (templated)
    :param value_format: ``binary`` (``value_column``) or ``json`` (``value_columns``); ``None``: ``binary``, and a
        delta takes its base's format and columns. (templated)
    :param num_dbs: number of shards (hash sharding, or CEL direct routing). (templated)
    :param max_keys_per_shard: hash sharding sized from the row count instead of ``num_dbs``. (templated)
    :param cel_expr: CEL expression routing each row to a shard (CEL sharding). (templated)
    :param cel_columns: columns the CEL expression reads (names, or name -> CEL type); default ``[key_column]``.
        (templated)
    :param routing_values: categorical CEL routing: the expression's values, one shard each, in this order.
        (templated)
    :param infer_routing_values: categorical CEL routing with the distinct values found in the input. (templated)
    :param key_encoding: how keys are encoded; ``None`` chooses by the key type (SPEC §5). (templated)
    :param batch_size: rows per RocksDB write batch. (templated)
    :param verify_routing: re-check a sample of keys against the routing rule after writing. (templated)
    :param sample_size: keys per shard checked by ``verify_routing``. (templated)
    :param sort_within_partitions: write each shard's keys in sorted order. (templated)
    :param max_writes_per_second: per-task cap on rows written per second. (templated)
    :param max_write_bytes_per_second: per-task cap on bytes written per second. (templated)
    :param shard_retry: retries of a single-shard write: max retries, or a mapping with ``max_retries``,
        ``initial_backoff_s``, ``max_backoff_s``. (templated)
    :param allow_duplicate_keys: keep the last row of a repeated key instead of failing. (templated)
    :param delete_column: a boolean column of the source, true for rows that delete their key (dropped from the
        first, full batch). (templated)
    :param max_chain_depth: a batch whose base already has this many delta runs on its last full layer is written
        compacted. (templated)
    :param spark_conn_id: apache-spark connection (master, deploy mode, spark-submit binary). (templated)
    :param spark_conf: extra ``--conf`` settings of spark-submit. (templated)
    :param spark_env_vars: environment of the Spark driver (``env_vars`` of the spark provider). (templated)
    :param python_env_archive: ``path#alias`` of a packed Python environment shipped with ``--archives`` and used as
        the executors' interpreter on clusters. (templated)
    :param aws_conn_id: AWS connection for ``s3://`` outputs; its credentials reach the driver only as environment
        variables of the spark-submit process (never argv, logs, XCom or stored objects). (templated)
    :param driver_memory: ``--driver-memory`` of spark-submit. (templated)
    :param executor_memory: ``--executor-memory`` of spark-submit. (templated)
    :param executor_cores: ``--executor-cores`` of spark-submit. (templated)
    :param num_executors: ``--num-executors`` of spark-submit. (templated)
    :param total_executor_cores: ``--total-executor-cores`` of spark-submit. (templated)
    :param stop_timeout: seconds ``on_kill`` waits for the query to stop after the batch in progress before it
        kills spark-submit.
    """

    template_fields: Sequence[str] = (*_WRITE_FIELDS[:1], *_STREAM_FIELDS, *_WRITE_FIELDS[1:])
    template_fields_renderers = {k: v for k, v in write_args.TEMPLATE_RENDERERS.items() if k in _WRITE_FIELDS} | {
        "source_options": "json"}
    ui_color = "#f8c471"

    def __init__(
        self,
        *,
        output_uri: str,
        checkpoint_location: str,
        source_path: str | None = None,
        source_format: str = "parquet",
        source_schema: str | None = None,
        source_options: Mapping[str, Any] | None = None,
        stream_id: str | None = None,
        trigger: StreamTrigger = "available_now",
        processing_time: str | None = None,
        stream_reset: bool = False,
        accept_live_run: str | None = None,
        key_column: str = _D.key_column,
        value_column: str | None = _D.value_column,
        value_columns: Sequence[str] | None = _D.value_columns,
        value_format: ValueFormat | None = _D.value_format,
        num_dbs: int | None = _D.num_dbs,
        max_keys_per_shard: int | None = _D.max_keys_per_shard,
        cel_expr: str | None = _D.cel_expr,
        cel_columns: Mapping[str, str] | Sequence[str] | None = _D.cel_columns,
        routing_values: Sequence[Any] | None = _D.routing_values,
        infer_routing_values: bool = _D.infer_routing_values,
        key_encoding: KeyEncoding | None = _D.key_encoding,
        batch_size: int = _D.batch_size,
        verify_routing: bool = _D.verify_routing,
        sample_size: int = _D.sample_size,
        sort_within_partitions: bool = _D.sort_within_partitions,
        max_writes_per_second: float | None = _D.max_writes_per_second,
        max_write_bytes_per_second: float | None = _D.max_write_bytes_per_second,
        shard_retry: int | Mapping[str, Any] | None = _D.shard_retry,
        allow_duplicate_keys: bool = _D.allow_duplicate_keys,
        delete_column: str | None = _D.delete_column,
        max_chain_depth: int = _D.max_chain_depth,
        spark_conn_id: str = _D.spark_conn_id,
        spark_conf: Mapping[str, Any] | None = _D.spark_conf,
        spark_env_vars: Mapping[str, Any] | None = _D.spark_env_vars,
        python_env_archive: str | None = _D.python_env_archive,
        aws_conn_id: str | None = _D.aws_conn_id,
        driver_memory: str | None = _D.driver_memory,
        executor_memory: str | None = _D.executor_memory,
        executor_cores: int | None = _D.executor_cores,
        num_executors: int | None = _D.num_executors,
        total_executor_cores: int | None = _D.total_executor_cores,
        stop_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        refused = sorted(set(kwargs) & _NOT_STREAM_ARGS)
        if refused:
            # Passed on as-is they would clash with what is set below (a bare TypeError) or be ignored.
            raise ConfigError("StreamingSnapshotOperator does not take " + "; ".join(
                f"{name!r} ({_WHY_NOT_STREAM_ARG[name]})" for name in refused))
        given = {k: v for k, v in locals().items() if k in _WRITE_FIELDS}
        # publishes=None gives the snapshot's AssetAlias as the outlet: every published batch adds its own
        # event through it.
        super().__init__(**{k: given.pop(k) for k in SPARK_JOB_ARGS}, publishes=None, **kwargs)
        # Verbatim, as the base keeps its own: the shard layout and write limits of every batch.
        for name, value in given.items():
            setattr(self, name, value)
        self.source_path = source_path
        self.source_format = source_format
        self.source_schema = source_schema
        self.source_options = source_options
        self.checkpoint_location = checkpoint_location
        self.stream_id = stream_id
        self.trigger = trigger
        self.processing_time = processing_time
        self.stream_reset = stream_reset
        self.accept_live_run = accept_live_run
        self.stop_timeout = stop_timeout
        self._stream: StreamSettings | None = None

    # -- configuration ---------------------------------------------------------------------------

    def _config_arguments(self) -> dict[str, Any]:
        """The write config every batch starts from; ``input`` only describes the source."""
        from airflow_provider_shardyfusion.core.model.config import INPUT_FORMATS

        file_input = self.source_path is not None and self.source_format in INPUT_FORMATS
        return {**{name: getattr(self, name) for name in write_args.OPERATOR_CONFIG_ARGS if name in _WRITE_FIELDS},
                **_BATCH_CONFIG,
                "input_path": self.source_path if file_input else None,
                "input_format": self.source_format if file_input else _D.input_format,
                "input_table": None if file_input else "stream"}

    def stream_settings(self, context: Context) -> StreamSettings:
        """The validated stream settings of this try (``ConfigError`` naming the argument at fault)."""
        from airflow_provider_shardyfusion.core.stream.job import StreamSettings, sanitize_stream_id

        ti = context["ti"]
        stream_id = self.stream_id
        if stream_id is None:
            map_index = getattr(ti, "map_index", -1)
            suffix = f".{map_index}" if isinstance(map_index, int) and map_index >= 0 else ""
            stream_id = sanitize_stream_id(f"{ti.dag_id}.{ti.task_id}{suffix}")
        source_options = as_mapping("source_options", self.source_options) or {}
        as_number("stop_timeout", self.stop_timeout, minimum=0)
        report_id = sanitize_stream_id(f"{ti.run_id}.try{ti.try_number}.{getattr(ti, 'map_index', -1)}")
        return StreamSettings(
            stream_id=stream_id, checkpoint_location=self.checkpoint_location, report_id=report_id,
            source_path=self.source_path, source_format=self.source_format, source_schema=self.source_schema,
            source_options={k: str(v) for k, v in source_options.items()},
            trigger=self.trigger, processing_time=self.processing_time, stream_reset=self.stream_reset,
            accept_live_run=self.accept_live_run,
        ).validate()

    def _application(self, bundle: Bundle) -> str:
        from airflow_provider_shardyfusion.submission.bundle import STREAMING_SCRIPT

        return bundle.application(STREAMING_SCRIPT)

    def _job_config_json(self, config: WriteConfig) -> str:
        from airflow_provider_shardyfusion.core.stream.job import encode_job_config

        assert self._stream is not None
        return encode_job_config(config, self._stream)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_shardyfusion.streaming import check_stream_options, foreach_batch_writer

        spark = self.spark_settings()
        # The stream's own settings first: their errors name this operator's arguments (source_path, ...).
        self._stream = stream = self.stream_settings(context)
        config = self._write_config(context)
        check_write_input(config, output_uri=self.output_uri, input_name="source_path", read_columns=False)
        check_stream_options(stream.source_options)  # the job's own checks, before Spark starts
        foreach_batch_writer(config, stream_id=stream.stream_id, checkpoint_location=stream.checkpoint_location,
                             stream_reset=stream.stream_reset, accept_live_run=stream.accept_live_run)
        self.log.info("Stream %s: %s query over %s into %s (checkpoint %s)", stream.stream_id, stream.trigger,
                      stream.source_path or stream.source_format, config.output_uri, stream.checkpoint_location)
        plan, submit_error = self._launch(context, config, spark)
        try:
            report = self._read_report(config.output_uri, stream)
        except StorageError as exc:
            raise StorageError(
                f"stream {stream.stream_id!r}: the streaming job {'failed' if submit_error else 'ended'} but its "
                f"report cannot be read ({exc}); the batches it published are the runs whose manifest names this "
                "stream (`shardyfusion history`), and the next run resumes from the checkpoint"
            ) from (submit_error or exc)
        return self._finish(context, config.output_uri, stream, report, submit_error, launcher=plan.launcher)

    def _read_report(self, output_uri: str, stream: StreamSettings) -> StreamReport | None:
        from airflow_provider_shardyfusion.core.stream.job import read_report

        return read_report(self.hook.get_store(output_uri), stream.stream_id, stream.report_id)

    def _finish(self, context: Context, output_uri: str, stream: StreamSettings, report: StreamReport | None,
                submit_error: Exception | None, *, launcher: str = SPARK_SUBMIT) -> dict[str, Any]:
        batches = report.batches if report is not None else ()
        live = [b for b in batches if b.live]
        for batch in live:
            self.log.info("Stream %s batch %s: run %s %s, %s rows", stream.stream_id, batch.batch_id, batch.run_id,
                          batch.action, batch.rows)
            summary = {"stream_id": stream.stream_id, **batch.summary(), "output_uri": output_uri, "published": True}
            emit_snapshot_event(context, self.outlets or [], output_uri, summary, live=True)
        error = (report.error if report is not None else None) or (
            None if submit_error is None else f"{type(submit_error).__name__}: {submit_error}")
        if error is not None or report is None:
            tail = self._launcher_tail()
            if tail:
                self.log.error("Stream %s: %s output tail:\n%s", stream.stream_id, launcher, tail)
            # Over Connect no spark-submit ran: the error names the Connect job (SPEC §15).
            error_type = SparkSubmitError if launcher == SPARK_SUBMIT else SparkConnectError
            raise error_type(
                f"stream {stream.stream_id!r}: the streaming job failed ({error or 'it left no report'}); "
                f"batches published before: {[b.batch_id for b in live]}{self._live_now(output_uri)} "
                "(the next run resumes from the checkpoint)"
            ) from submit_error
        pointer = self.hook.get_snapshots(output_uri).current()
        return {"stream_id": stream.stream_id, "output_uri": output_uri, "trigger": stream.trigger,
                "batches": [b.summary() for b in batches], "published": len(live),
                "live_run_id": pointer.run_id if pointer is not None else None}

    def _live_now(self, output_uri: str) -> str:
        """What ``_CURRENT`` names as the job failed: the report lists a batch once its function returned,
        so a job that died between a batch's ``_CURRENT`` and its checkpoint commit published one more."""
        try:
            pointer = self.hook.get_snapshots(output_uri).current()
        except Exception as exc:  # the job's own error matters more; say why this part is missing
            return f"; _CURRENT could not be read ({type(exc).__name__})"
        return f"; _CURRENT names run {pointer.run_id!r}" if pointer is not None else "; nothing is live"

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """No facets of its own (``None``): the OpenLineage listener then reports the declared outlets;
        each batch's snapshot event goes through the asset alias."""
        return None

    def on_kill(self) -> None:
        """Ask the job to stop its query after the batch in progress, wait for it, then kill spark-submit."""
        stream, output_uri = self._stream, self._active_output_uri
        if stream is not None and output_uri is not None:
            try:
                self._request_stop(output_uri, stream)
            except Exception as exc:  # the kill itself must go through
                self.log.warning("Stream %s: could not stop the query gracefully: %s", stream.stream_id, exc)
        super().on_kill()

    def _job_running(self) -> bool:
        """Whether the job's process is still running (it shuts Spark down after the query stopped)."""
        return self._launcher is not None and self._launcher.is_running()

    def _request_stop(self, output_uri: str, stream: StreamSettings) -> None:
        from airflow_provider_shardyfusion.core.retry import NO_RETRY
        from airflow_provider_shardyfusion.core.stream.job import read_report, stop_key, wait_for_stop

        store = self.hook.get_store(output_uri)
        store.put(stop_key(stream.stream_id, stream.report_id), b'{"reason": "the Airflow task was stopped"}')
        self.log.info("Stream %s: asked the query to stop after the batch in progress (at most %ss)",
                      stream.stream_id, self.stop_timeout)
        # One read per poll: the wait itself is the retry (a failed read counts as "not yet").
        if wait_for_stop(lambda: read_report(store, stream.stream_id, stream.report_id, policy=NO_RETRY),
                         self._job_running, timeout=float(as_number("stop_timeout", self.stop_timeout, minimum=0))):
            self.log.info("Stream %s: the query stopped", stream.stream_id)
            return
        self.log.warning("Stream %s: the query did not stop within %ss; killing spark-submit", stream.stream_id,
                         self.stop_timeout)
