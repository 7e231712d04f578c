"""``ShardedWriteOperator``: build and publish a sharded RocksDB snapshot with Spark (SPEC §8).

The operator is a thin shell over pure parts:

- ``core.model.write_args``: the arguments, defaults, templating and docs (declared once);
- ``core.model.config.build_write_config``: validation, so a bad argument fails before Spark starts;
- ``core.lifecycle.write_attempts``: which run a try writes or re-attaches to, and what a submission left;
- ``core.lifecycle.run_outcome``: what the run record means, and the waiting (shared with the sensors);
- ``operators.spark_job``: what running a Spark job takes (Spark settings, credentials, bundle,
  the launcher chosen from the connection, ``on_kill``, the Spark link), shared with
  ``StreamingSnapshotOperator``;
- ``assets``: which asset event the task emits.

It trusts only the run record the writer keeps under the output root: success → a small summary
(XCom) and, when the run went live, an asset event; failure → the writer's own error type and
message. Importing this module is light (no pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.assets import emit_snapshot_event
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.arguments import as_number
from airflow_provider_shardyfusion.core.errors import ConfigError, SparkSubmitError
from airflow_provider_shardyfusion.core.lifecycle.run_outcome import RunOutcome, wait_for_run
from airflow_provider_shardyfusion.core.lifecycle.write_attempts import (
    RunChoice,
    abandon_reason,
    candidate_run_ids,
    choose_run,
    owned_by_another,
    resolve_deferral_timeout,
    same_try,
    submission_outcome,
    writer_identity,
)
from airflow_provider_shardyfusion.core.model import write_args
from airflow_provider_shardyfusion.core.model.write_args import DEFAULTS as _D
from airflow_provider_shardyfusion.core.write.input_check import check_write_input
from airflow_provider_shardyfusion.operators.spark_job import SparkApplicationLink, SparkJobOperator
from airflow_provider_shardyfusion.operators.write_stats import emit_write_stats

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from airflow.sdk import Context

    from airflow_provider_shardyfusion.core.model.config import InputFormat, WriteConfig
    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding, ValueFormat
    from airflow_provider_shardyfusion.core.model.manifest import WriteMode
    from airflow_provider_shardyfusion.core.model.run_record import RunRecord
    from airflow_provider_shardyfusion.submission.bundle import Bundle
    from airflow_provider_shardyfusion.submission.launcher import SparkJobLauncher

__all__ = ["ShardedWriteOperator", "SparkApplicationLink", "SparkSubmitError"]

# A cluster-mode driver may sit in a queue before it writes its run record; past this the
# deferred task gives up instead of waiting for a driver that was never started.
_RUN_RECORD_MISSING_TIMEOUT_S = 3600.0
# Bounds the settle wait after a trigger's success event: the settle rule itself ends it sooner.
_SETTLE_TIMEOUT = timedelta(minutes=2)


class ShardedWriteOperator(SparkJobOperator):
    """Write a table as ``num_dbs`` RocksDB shards with Spark and publish it atomically.

    The input is read by Spark from ``input_path`` (``input_format``, ``input_options``), an
    ``input_table`` or an ``input_sql`` query; ``key_column`` is the lookup key and
    ``value_column`` (``value_format="binary"``) or ``value_columns`` (``"json"``) the value.
    Shards are assigned by hash (``num_dbs`` or ``max_keys_per_shard``) or by a CEL expression
    (``cel_expr``, ``cel_columns``, ``routing_values`` / ``infer_routing_values``).

    Spark: ``spark_conn_id`` names an apache-spark connection (master, deploy mode);
    ``spark_conf`` / ``spark_env_vars`` / executor sizes go to spark-submit.
    ``python_env_archive`` (``path#alias``, e.g. a venv-pack / conda-pack archive) is shipped with
    ``--archives`` and used as the executors' interpreter on clusters.

    Storage: ``s3://`` outputs are reached with ``aws_conn_id``; its credentials reach the Spark
    driver only as environment variables of the spark-submit process (never argv, logs, XCom,
    manifests or run records). On YARN / Kubernetes give the cluster its own role (instance
    profile, IRSA) for executors.

    Returns (XCom) ``{"run_id", "manifest_ref", "run_record_ref", "num_dbs", "rows", "bytes",
    "empty_shards", "spark_app_id", "output_uri", "published"}``. With ``publish=True`` (the
    default) the run goes live and an asset event for ``output_uri`` is emitted; with
    ``publish=False`` the run is staged and no asset event is emitted (nothing went live:
    ``PublishSnapshotOperator`` emits it). ``deferrable=True`` (cluster deploy modes) submits
    without waiting and waits on the run record in the triggerer, at most ``deferral_timeout``.

    Retries: with a fixed ``run_id``, a retry re-attaches to the earlier try's run while it is
    still running (valid lease), or writes a fresh run ``<run_id>-try<N>`` when that run ended;
    it never reports the earlier try's error, and never marks a run failed that it did not start.

    When a run is over follows ``core.lifecycle.run_outcome`` (the rule ``RunRecordSensor`` follows too): a
    run meant to go live is waited for until ``_CURRENT`` names it, a later run is live
    (superseded: staged, not a failure) or 30 s passed (not live: ``PublishManifestError``).

    :param output_uri: root of the snapshot, ``s3://bucket/prefix`` or ``file:///abs/dir``. (templated)
    :param input_path: input files Spark reads (``input_format``, ``input_options``); or give ``input_table`` or
        ``input_sql``. (templated)
    :param input_format: Spark data source of ``input_path``: parquet, orc, json, csv, avro, delta or text.
        (templated)
    :param input_options: reader options of ``input_path`` (never credentials). (templated)
    :param input_table: a table of the Spark catalog as the input. (templated)
    :param input_sql: a Spark SQL query as the input. (templated)
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
    :param run_id: the run id; ``None`` generates one per try. A fixed id is retried as ``<run_id>-try<N>`` when
        an earlier try's run failed, and re-attached to while that run is still running. (templated)
    :param batch_size: rows per RocksDB write batch. (templated)
    :param verify_routing: re-check a sample of keys against the routing rule after writing. (templated)
    :param sample_size: keys per shard checked by ``verify_routing``. (templated)
    :param cache_input: persist the input in Spark before writing (inputs read twice). (templated)
    :param sort_within_partitions: write each shard's keys in sorted order. (templated)
    :param max_writes_per_second: per-task cap on rows written per second. (templated)
    :param max_write_bytes_per_second: per-task cap on bytes written per second. (templated)
    :param shard_retry: retries of a single-shard write: max retries, or a mapping with ``max_retries``,
        ``initial_backoff_s``, ``max_backoff_s``. (templated)
    :param allow_duplicate_keys: keep the last row of a repeated key instead of failing. (templated)
    :param publish: move ``_CURRENT`` to the run when it succeeds; ``False`` stages it (manifest and a succeeded
        run record, no asset event) for ``ValidateManifestOperator`` / ``PublishSnapshotOperator``. (templated)
    :param write_mode: ``full`` writes the whole table; ``delta`` writes only the changed rows of the input on a
        base run (SPEC §13); ``compact`` merges the live chain into one full layer per shard (no input).
        (templated)
    :param delete_column: with ``write_mode='delta'``: a boolean column, true for rows that delete their key, false
        for upserts; a null fails the run. (templated)
    :param base_run_id: the run a delta or compaction is written on; ``None``: the run ``_CURRENT`` names when the
        job starts. (templated)
    :param max_chain_depth: a delta whose base already has this many delta runs on its last full layer is written
        compacted. (templated)
    :param spark_conn_id: apache-spark connection (master, deploy mode, spark-submit binary). (templated)
    :param spark_conf: extra ``--conf`` settings of spark-submit. (templated)
    :param spark_env_vars: environment of the Spark driver (``env_vars`` of the spark provider). (templated)
    :param python_env_archive: ``path#alias`` of a packed Python environment shipped with ``--archives`` and used
        as the executors' interpreter on clusters. (templated)
    :param aws_conn_id: AWS connection for ``s3://`` outputs; its credentials reach the driver only as environment
        variables of the spark-submit process (never argv, logs, XCom or stored objects). (templated)
    :param driver_memory: ``--driver-memory`` of spark-submit. (templated)
    :param executor_memory: ``--executor-memory`` of spark-submit. (templated)
    :param executor_cores: ``--executor-cores`` of spark-submit. (templated)
    :param num_executors: ``--num-executors`` of spark-submit. (templated)
    :param total_executor_cores: ``--total-executor-cores`` of spark-submit. (templated)
    :param deferrable: in a cluster deploy mode, submit without waiting and wait on the run record in the
        triggerer; default ``[operators] default_deferrable``.
    :param poll_interval: seconds between run-record reads while waiting.
    :param deferral_timeout: longest wait (seconds or timedelta) on the run record after submitting or
        re-attaching; ``None``: ``execution_timeout`` if set, else 24 hours.
    """

    template_fields: Sequence[str] = write_args.TEMPLATE_FIELDS
    template_fields_renderers: ClassVar[dict[str, str]] = dict(write_args.TEMPLATE_RENDERERS)
    ui_color = "#f4a460"

    # Defaults: core.model.write_args (one declaration); tests/unit/test_write_args.py checks this signature.
    def __init__(
        self,
        *,
        output_uri: str,
        input_path: str | None = _D.input_path,
        input_format: InputFormat = _D.input_format,
        input_options: Mapping[str, Any] | None = _D.input_options,
        input_table: str | None = _D.input_table,
        input_sql: str | None = _D.input_sql,
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
        run_id: str | None = _D.run_id,
        batch_size: int = _D.batch_size,
        verify_routing: bool = _D.verify_routing,
        sample_size: int = _D.sample_size,
        cache_input: bool = _D.cache_input,
        sort_within_partitions: bool = _D.sort_within_partitions,
        max_writes_per_second: float | None = _D.max_writes_per_second,
        max_write_bytes_per_second: float | None = _D.max_write_bytes_per_second,
        shard_retry: int | Mapping[str, Any] | None = _D.shard_retry,
        allow_duplicate_keys: bool = _D.allow_duplicate_keys,
        publish: bool = _D.publish,
        write_mode: WriteMode = _D.write_mode,
        delete_column: str | None = _D.delete_column,
        base_run_id: str | None = _D.base_run_id,
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
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=_D.deferrable),
        poll_interval: float = _D.poll_interval,
        deferral_timeout: timedelta | float | None = _D.deferral_timeout,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            output_uri=output_uri, publishes=publish, spark_conn_id=spark_conn_id, spark_conf=spark_conf,
            spark_env_vars=spark_env_vars, python_env_archive=python_env_archive, aws_conn_id=aws_conn_id,
            driver_memory=driver_memory, executor_memory=executor_memory, executor_cores=executor_cores,
            num_executors=num_executors, total_executor_cores=total_executor_cores, **kwargs)
        # Verbatim on purpose: templates render after __init__, so validation lives in execute().
        self.input_path = input_path
        self.input_format = input_format
        self.input_options = input_options
        self.input_table = input_table
        self.input_sql = input_sql
        self.key_column = key_column
        self.value_column = value_column
        self.value_columns = value_columns
        self.value_format = value_format
        self.num_dbs = num_dbs
        self.max_keys_per_shard = max_keys_per_shard
        self.cel_expr = cel_expr
        self.cel_columns = cel_columns
        self.routing_values = routing_values
        self.infer_routing_values = infer_routing_values
        self.key_encoding = key_encoding
        self.run_id = run_id
        self.batch_size = batch_size
        self.verify_routing = verify_routing
        self.sample_size = sample_size
        self.cache_input = cache_input
        self.sort_within_partitions = sort_within_partitions
        self.max_writes_per_second = max_writes_per_second
        self.max_write_bytes_per_second = max_write_bytes_per_second
        self.shard_retry = shard_retry
        self.allow_duplicate_keys = allow_duplicate_keys
        self.publish = publish
        self.write_mode = write_mode
        self.delete_column = delete_column
        self.base_run_id = base_run_id
        self.max_chain_depth = max_chain_depth
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.deferral_timeout = deferral_timeout
        # Set during execute() so on_kill() marks only the run this try started.
        self._active_run_id: str | None = None
        self._me: dict[str, Any] | None = None
        # The summary of this try's snapshot, for get_openlineage_facets_on_complete.
        self._lineage_summary: dict[str, Any] | None = None
        # Time for the waits in core.lifecycle.run_outcome (None: the real clock); tests drive a fake one.
        self._clock: Callable[[], datetime] | None = None
        self._sleep: Callable[[float], None] | None = None

    # -- configuration ---------------------------------------------------------------------------

    def _config_arguments(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in write_args.OPERATOR_CONFIG_ARGS}

    def _waiting_timeout(self) -> timedelta:
        if as_number("poll_interval", self.poll_interval) <= 0:  # nan and inf are refused there
            raise ConfigError(f"poll_interval {self.poll_interval!r} must be a number of seconds > 0")
        return resolve_deferral_timeout(self.deferral_timeout, self.execution_timeout)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        spark = self.spark_settings()
        timeout = self._waiting_timeout()
        config = self._write_config(context)
        check_write_input(config, output_uri=self.output_uri)
        self._me = me = self.airflow_context(context)
        choice = self._choose_run(config, me)
        if choice.action == "attach":
            return self._attach(context, config.with_run_id(choice.run_id).validate(), choice, timeout)
        if choice.run_id != config.run_id:
            self.log.info("Run %s: %s", choice.run_id, choice.reason)
            config = config.with_run_id(choice.run_id).validate()
        plan, submit_error = self._launch(context, config, spark)
        record = self._read_record(config)
        if submit_error is None and plan.defer and (record is None or not record.is_terminal):
            self._defer_on(config, timeout, own_run=True)
        failure = submission_outcome(record, run_id=config.run_id, output_uri=config.output_uri, me=me,
                                     submit_error=submit_error, tail=self._launcher_tail(), launcher=plan.launcher)
        if record is not None and not owned_by_another(record, me):
            self._persist_link(context, record)
        if failure is None:
            return self._conclude(context, self._wait(config.output_uri, config.run_id, timeout))
        reason = abandon_reason(record, me, cluster_mode=plan.cluster_mode, submit_error=submit_error,
                                launcher=plan.launcher)
        if reason is not None:
            self._mark_abandoned(config, reason)
        return self._conclude(context, failure)

    def _application(self, bundle: Bundle) -> str:
        return bundle.entry_script

    def _job_config_json(self, config: WriteConfig) -> str:
        """Here the write config itself."""
        return config.to_json()

    def _start(self, context: Context, config: WriteConfig, launcher: SparkJobLauncher) -> None:
        """Also remember the run (``on_kill`` marks it) and tell XCom which run this try writes."""
        super()._start(context, config, launcher)
        self._active_run_id = config.run_id
        if self.do_xcom_push:
            context["ti"].xcom_push(key="run_id", value=config.run_id)

    def _choose_run(self, config: WriteConfig, me: Mapping[str, Any]) -> RunChoice:
        if self.run_id is None:  # generated: fresh per try, nothing to re-attach to
            return RunChoice("start", config.run_id, "generated run id")
        records = {rid: self._read_record(config.with_run_id(rid))
                   for rid in candidate_run_ids(config.run_id, int(me.get("try_number") or 1))}
        return choose_run(config.run_id, records, me, layout.utc_now())

    def _defer_on(self, config: WriteConfig, timeout: timedelta, *, own_run: bool) -> None:
        from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger

        self.log.info("Run %s: deferring until its run record is final (at most %s)", config.run_id, timeout)
        self.defer(
            trigger=RunRecordTrigger(
                output_uri=config.output_uri, run_id=config.run_id, aws_conn_id=self.aws_conn_id,
                poll_interval=self.poll_interval, missing_timeout=_RUN_RECORD_MISSING_TIMEOUT_S,
                # Only this try's own run may be failed when the user stops the deferred task.
                fail_run_on_kill=own_run,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def _attach(self, context: Context, config: WriteConfig, choice: RunChoice, timeout: timedelta) -> dict[str, Any]:
        """Wait for an earlier try's still-running run instead of writing the snapshot twice."""
        self.log.info("Run %s: %s; re-attaching instead of writing again", config.run_id, choice.reason)
        if self.do_xcom_push:
            context["ti"].xcom_push(key="run_id", value=config.run_id)
        if self.deferrable:
            self._defer_on(config, timeout, own_run=False)
        # A lost writer is not ours to mark: the next try starts afresh.
        outcome = self._wait(config.output_uri, config.run_id, timeout, missing_timeout=0.0)
        if outcome.record is not None:
            self._persist_link(context, outcome.record)
        return self._conclude(context, outcome, "started by an earlier try and re-attached to by this one")

    def _wait(self, output_uri: str, run_id: str, timeout: timedelta, *,
              missing_timeout: float | None = None) -> RunOutcome:
        """The run's final outcome (``core.lifecycle.run_outcome``: a run meant to go live waits for ``_CURRENT``)."""
        return wait_for_run(self.hook.get_snapshots(output_uri), run_id, timeout=timeout, poll=float(self.poll_interval),
                            publish=self.publish is True, missing_timeout=missing_timeout,
                            clock=self._clock, sleep=self._sleep)

    def _read_record(self, config: WriteConfig) -> RunRecord | None:
        """The run record, or ``None`` when there is none; a failed read raises (it is not "no record")."""
        return self.hook.read_run_record(config.output_uri, config.run_id)

    def _mark_abandoned(self, config: WriteConfig, reason: str) -> None:
        from airflow_provider_shardyfusion.core.errors import RunAbandoned
        from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

        try:
            SnapshotRoot(self.hook.get_store(config.output_uri)).mark_failed(config.run_id, RunAbandoned(reason))
        except Exception as exc:  # the run's own error matters more than the bookkeeping
            self.log.warning("Run %s: could not mark the run record failed: %s", config.run_id, exc)

    def _conclude(self, context: Context, outcome: RunOutcome, context_note: str = "") -> dict[str, Any]:
        """Return the summary of a succeeded run, or raise the one exception of a failed one."""
        if outcome.succeeded:
            return self._succeeded(context, outcome)
        if outcome.traceback_tail:
            self.log.error("Run %s failed in the Spark job; traceback tail:\n%s", outcome.run_id, outcome.traceback_tail)
        raise outcome.to_exception(context_note)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        outcome = RunOutcome.from_event(event or {})
        if outcome.record is not None:
            with contextlib.suppress(Exception):  # the link is a convenience; the outcome is what matters
                self._persist_link(context, outcome.record)
        if outcome.succeeded and self.publish is True and not outcome.published and not outcome.superseded_by:
            # A trigger that could not know the run was meant to go live: settle it here.
            outcome = self._wait(outcome.record.output_uri, outcome.run_id, _SETTLE_TIMEOUT)  # type: ignore[union-attr]
        return self._conclude(context, outcome)

    def _succeeded(self, context: Context, outcome: RunOutcome) -> dict[str, Any]:
        summary = outcome.summary()
        if summary["published"]:
            how = "published"
        elif outcome.superseded_by:
            self.log.warning("Run %s: %s", outcome.run_id, outcome.message)
            how = f"staged (superseded by live run {outcome.superseded_by})"
        else:
            how = "staged (publish=False, _CURRENT untouched)"
        self.log.info("Run %s %s %s rows in %s shards (%s empty): %s", summary["run_id"], how,
                      summary["rows"], summary["num_dbs"], summary["empty_shards"], summary["manifest_ref"])
        emit_snapshot_event(context, self.outlets or [], summary["output_uri"], summary, live=summary["published"])
        emit_write_stats(summary, outcome.record.stats if outcome.record is not None else {})
        self._lineage_summary = dict(summary)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``airflow_provider_shardyfusion.openlineage.write_lineage``): the input → the
        snapshot with its row count, size and schema; ``None`` without the OpenLineage provider."""
        from airflow_provider_shardyfusion import openlineage as ol

        summary = self._lineage_summary
        schema = None
        if summary:
            try:  # the manifest knows the key encoding chosen by key type; the arguments may not
                snapshots = self.hook.get_snapshots(summary["output_uri"])
                schema = ol.SnapshotSchema.of_manifest(snapshots.read_manifest(summary["manifest_ref"]))
            except Exception as exc:  # lineage must never fail the task
                self.log.info("OpenLineage: manifest not read (%s); schema from the arguments", exc)
                schema = ol.SnapshotSchema.of_arguments(self.key_column, self.key_encoding, self.value_format,
                                                        self.value_column, self.value_columns)
        return ol.write_lineage(summary, input_path=self.input_path, input_table=self.input_table,
                                input_sql=self.input_sql, spark_conf=self.spark_conf, schema=schema)

    def on_kill(self) -> None:
        super().on_kill()
        if not (self._active_run_id and self._active_output_uri):
            return  # nothing submitted by this try (or only re-attached): not ours to mark
        from airflow_provider_shardyfusion.core.errors import RunKilled
        from airflow_provider_shardyfusion.core.model.run_record import read_run_record
        from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

        try:
            store = self.hook.get_store(self._active_output_uri)
            record = read_run_record(store, self._active_run_id)
            ident = writer_identity(record) if record is not None else None
            if ident is not None and self._me is not None and not same_try(ident, self._me):
                self.log.warning("Run %s belongs to another writer; not marking it", self._active_run_id)
                return
            SnapshotRoot(store).mark_failed(self._active_run_id, RunKilled("killed: the Airflow task was stopped"))
        except Exception as exc:  # the kill itself must go through
            self.log.warning("Run %s: could not mark the run record failed: %s", self._active_run_id, exc)
