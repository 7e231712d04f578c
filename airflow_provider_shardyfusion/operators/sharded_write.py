"""``ShardedWriteOperator``: build and publish a sharded RocksDB snapshot with Spark (SPEC §8).

The operator is a thin shell over pure parts:

- ``core.write_args``: the arguments, defaults, templating and docs (declared once);
- ``core.config.build_write_config``: validation, so a bad argument fails before Spark starts;
- ``operators.write_run``: which run a try writes or re-attaches to, and what its run record means;
- ``operators.submit_plan``: the spark-submit arguments and the deploy-mode policy;
- ``hooks.spark_submit``: the apache-spark provider's hook that runs the plan.

It trusts only the run record the writer keeps under the output root: success → a small summary
(XCom) and, when the run went live, an asset event; failure → the writer's own error type and
message. Importing this module is light (no pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import Asset, AssetAlias, BaseOperator, BaseOperatorLink
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.core import layout, write_args
from airflow_provider_shardyfusion.core.errors import ConfigError, PublishManifestError, RunRecordError, SparkSubmitError
from airflow_provider_shardyfusion.core.run_record import SUCCEEDED
from airflow_provider_shardyfusion.core.write_args import DEFAULTS as _D
from airflow_provider_shardyfusion.operators.write_run import (
    RunChoice,
    WriteOutcome,
    candidate_run_ids,
    choose_run,
    interpret_outcome,
    resolve_deferral_timeout,
    same_try,
    snapshot_summary,
    writer_exception,
    writer_identity,
)

if TYPE_CHECKING:
    from datetime import timedelta

    from airflow.sdk import Context
    from airflow.sdk.types import TaskInstanceKey

    from airflow_provider_shardyfusion.core.config import WriteConfig
    from airflow_provider_shardyfusion.core.run_record import RunRecord
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook
    from airflow_provider_shardyfusion.hooks.spark_submit import ShardyfusionSparkSubmitHook
    from airflow_provider_shardyfusion.operators.submit_plan import SparkSettings

__all__ = ["ShardedWriteOperator", "SparkApplicationLink", "SparkSubmitError", "snapshot_summary"]

# A cluster-mode driver may sit in a queue before it writes its run record; past this the
# deferred task gives up instead of waiting for a driver that was never started.
_RUN_RECORD_MISSING_TIMEOUT_S = 3600.0
# Longer than the writer's pointer move with its retries (1 s, 2 s, 4 s; SPEC §6).
_POINTER_SETTLE_S = 30.0
_ALIAS_PREFIX = "shardyfusion-snapshot:"


class SparkApplicationLink(BaseOperatorLink):
    """Spark UI / history server page of the application that wrote the snapshot (when known)."""

    name = "Spark application"
    key: ClassVar[str] = "spark_app_id"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        try:
            value = XCom.get_value(key=self.key, ti_key=ti_key)
        except Exception:  # a missing link must never fail the task or the UI
            return ""
        return (value or {}).get("url") or "" if isinstance(value, dict) else ""

    @classmethod
    def persist(cls, context: Context, operator: BaseOperator, app_id: str | None, url: str | None) -> None:
        if not operator.do_xcom_push or not app_id:
            return
        context["ti"].xcom_push(key=cls.key, value={"spark_app_id": app_id, "url": url})


def _submit_hook_class() -> type[ShardyfusionSparkSubmitHook]:
    """Imported on use so that parsing a DAG does not import the spark provider's hook."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_shardyfusion import compat
    from airflow_provider_shardyfusion.hooks.spark_submit import ShardyfusionSparkSubmitHook

    # The provider's class, not ours: our subclass defines the overridden members itself.
    compat.check_spark_provider(SparkSubmitHook, compat._installed_version("apache-airflow-providers-apache-spark"))
    return ShardyfusionSparkSubmitHook


class ShardedWriteOperator(BaseOperator):
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
    """

    template_fields: Sequence[str] = write_args.TEMPLATE_FIELDS
    template_fields_renderers: ClassVar[dict[str, str]] = dict(write_args.TEMPLATE_RENDERERS)
    ui_color = "#f4a460"
    operator_extra_links = (SparkApplicationLink(),)

    # Defaults: core.write_args (one declaration); tests/unit/test_write_args.py checks this signature.
    def __init__(
        self,
        *,
        output_uri: str,
        input_path: str | None = _D.input_path,
        input_format: str = _D.input_format,
        input_options: Mapping[str, Any] | None = _D.input_options,
        input_table: str | None = _D.input_table,
        input_sql: str | None = _D.input_sql,
        key_column: str = _D.key_column,
        value_column: str | None = _D.value_column,
        value_columns: Sequence[str] | None = _D.value_columns,
        value_format: str = _D.value_format,
        num_dbs: int | None = _D.num_dbs,
        max_keys_per_shard: int | None = _D.max_keys_per_shard,
        cel_expr: str | None = _D.cel_expr,
        cel_columns: Mapping[str, str] | Sequence[str] | None = _D.cel_columns,
        routing_values: Sequence[Any] | None = _D.routing_values,
        infer_routing_values: bool = _D.infer_routing_values,
        key_encoding: str | None = _D.key_encoding,
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
        super().__init__(outlets=_with_snapshot_outlet(list(kwargs.pop("outlets", None) or []), output_uri, publish),
                         **kwargs)
        # Verbatim on purpose: templates render after __init__, so validation lives in execute().
        self.output_uri = output_uri
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
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.spark_env_vars = spark_env_vars
        self.python_env_archive = python_env_archive
        self.aws_conn_id = aws_conn_id
        self.driver_memory = driver_memory
        self.executor_memory = executor_memory
        self.executor_cores = executor_cores
        self.num_executors = num_executors
        self.total_executor_cores = total_executor_cores
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.deferral_timeout = deferral_timeout
        # Set during execute() so on_kill() can stop what this try started (and only that).
        self._submit_hook: Any = None
        self._active_run_id: str | None = None
        self._active_output_uri: str | None = None
        self._me: dict[str, Any] | None = None
        # The summary of this try's snapshot, for get_openlineage_facets_on_complete.
        self._lineage_summary: dict[str, Any] | None = None

    # -- configuration ---------------------------------------------------------------------------

    @staticmethod
    def airflow_context(context: Context) -> dict[str, Any]:
        """The identity of this try, recorded in the run record as ``writer.airflow``."""
        ti = context["ti"]
        return {
            "dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
            "try_number": ti.try_number, "map_index": ti.map_index,
        }

    def build_config(self, context: Context, storage_options: Any = None) -> WriteConfig:
        """Validated ``WriteConfig``; raises ``ConfigError`` naming the argument at fault."""
        from airflow_provider_shardyfusion.core.config import build_write_config

        return build_write_config(
            **{name: getattr(self, name) for name in write_args.OPERATOR_CONFIG_ARGS},
            storage_options=storage_options, airflow_context=self.airflow_context(context),
        )

    def spark_settings(self) -> SparkSettings:
        """The Spark arguments, validated (``ConfigError`` naming the argument at fault)."""
        from airflow_provider_shardyfusion.operators.submit_plan import SparkSettings

        return SparkSettings(
            conf=self.spark_conf, env_vars=self.spark_env_vars, python_env_archive=self.python_env_archive,
            driver_memory=self.driver_memory, executor_memory=self.executor_memory,
            executor_cores=self.executor_cores, num_executors=self.num_executors,
            total_executor_cores=self.total_executor_cores,
        ).validate()

    def _waiting_timeout(self) -> timedelta:
        if isinstance(self.poll_interval, bool) or not isinstance(self.poll_interval, (int, float)) or self.poll_interval <= 0:
            raise ConfigError(f"poll_interval {self.poll_interval!r} must be a number of seconds > 0")
        return resolve_deferral_timeout(self.deferral_timeout, self.execution_timeout)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.log import mask_secret

        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook
        from airflow_provider_shardyfusion.hooks.spark_submit import resolve_spark_connection
        from airflow_provider_shardyfusion.operators.bundle import build_bundle
        from airflow_provider_shardyfusion.operators.submit_plan import Host, build_submit_plan

        spark = self.spark_settings()
        timeout = self._waiting_timeout()
        hook = ShardyfusionHook(aws_conn_id=self.aws_conn_id)
        config = self.build_config(context)  # validates every argument before touching a connection
        config = replace(config, storage_options=hook.public_storage_options(config.output_uri)).validate()
        self._me = me = self.airflow_context(context)
        choice = self._choose_run(hook, config, me)
        if choice.action == "attach":
            return self._attach(context, hook, config.with_run_id(choice.run_id).validate(), choice, timeout)
        if choice.run_id != config.run_id:
            self.log.info("Run %s: %s", choice.run_id, choice.reason)
            config = config.with_run_id(choice.run_id).validate()

        credential_env = hook.credential_env(config.output_uri)
        for value in credential_env.values():
            mask_secret(value)
        target = resolve_spark_connection(self.spark_conn_id)
        bundle = build_bundle()
        plan = build_submit_plan(
            target=target, spark=spark, host=Host.current(target.spark_binary), application=bundle.entry_script,
            py_files=bundle.zip_path, config_json=config.to_json(), name=f"shardyfusion-{self.task_id}-{config.run_id}",
            credential_env=credential_env, deferrable=bool(self.deferrable),
        )
        for note in plan.notes:
            self.log.warning("Run %s (connection %r, %s): %s", config.run_id, self.aws_conn_id, config.output_uri, note)
        submit_hook = _submit_hook_class()(**plan.hook_kwargs())
        self._submit_hook, self._active_run_id, self._active_output_uri = submit_hook, config.run_id, config.output_uri
        if self.do_xcom_push:
            context["ti"].xcom_push(key="run_id", value=config.run_id)
        self.log.info("Run %s: submitting the sharded write of %s to %s (bundle %s)",
                      config.run_id, config.output_uri, target.master, bundle.zip_path)
        # The job gets this as base64 on its command line; the plain JSON (no secrets) is for humans.
        self.log.info("Run %s: write config %s", config.run_id, config.to_json())

        submit_error: BaseException | None = None
        try:
            submit_hook.submit(application=plan.application)
            if plan.wait_for_driver:
                state = submit_hook.wait_for_driver()
                if state != "FINISHED":
                    raise SparkSubmitError(f"Spark driver of run {config.run_id} ended as {state}")
        except Exception as exc:
            submit_error = exc

        record = self._read_record(hook, config)
        if submit_error is None and plan.defer and (record is None or not record.is_terminal):
            self._defer_on(config, timeout, own_run=True)
        outcome = interpret_outcome(
            record, run_id=config.run_id, output_uri=config.output_uri, me=me, published=self.publish is True,
            cluster_mode=plan.cluster_mode, submit_error=submit_error,
            tail=submit_hook.tail_text() if hasattr(submit_hook, "tail_text") else "",
        )
        return self._conclude(context, hook, config, record, outcome)

    def _choose_run(self, hook: ShardyfusionHook, config: WriteConfig, me: Mapping[str, Any]) -> RunChoice:
        if self.run_id is None:  # generated: fresh per try, nothing to re-attach to
            return RunChoice("start", config.run_id, "generated run id")
        # An unreadable record counts as absent: the job's own unique-run-id check still refuses
        # a duplicate, and the outcome below never takes another writer's record for ours.
        records = {rid: self._read_record(hook, config.with_run_id(rid))
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

    def _attach(self, context: Context, hook: ShardyfusionHook, config: WriteConfig, choice: RunChoice,
                timeout: timedelta) -> dict[str, Any]:
        """Wait for an earlier try's still-running run instead of writing the snapshot twice."""
        self.log.info("Run %s: %s; re-attaching instead of writing again", config.run_id, choice.reason)
        if self.do_xcom_push:
            context["ti"].xcom_push(key="run_id", value=config.run_id)
        if self.deferrable:
            self._defer_on(config, timeout, own_run=False)
        record = self._wait_in_worker(hook, config, timeout)
        self._persist_link(context, record)
        if record.status == SUCCEEDED:
            return self._succeeded_run(context, hook, record)
        err = record.error
        raise writer_exception(err.type if err else RunRecordError.__name__,
                               f"{err.message if err else 'failed without an error in its run record'} "
                               f"(run {config.run_id!r}, started by an earlier try and re-attached to by this one)")

    def _wait_in_worker(self, hook: ShardyfusionHook, config: WriteConfig, timeout: timedelta) -> RunRecord:
        from airflow_provider_shardyfusion.core.run_record import RunOutcome

        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            record = self._read_record(hook, config)
            if record is None:
                raise RunRecordError(f"run record of run {config.run_id!r} under {config.output_uri} disappeared "
                                     "while this try waited for it")
            outcome = RunOutcome.of(record, config.run_id, layout.utc_now())
            if outcome.kind in ("succeeded", "failed"):
                return record
            if outcome.is_final:  # the writer is lost: not ours to mark; the next try starts afresh
                raise writer_exception(outcome.error_type or RunRecordError.__name__, outcome.message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunRecordError(f"run {config.run_id!r} is still running after {timeout} (deferral_timeout)")
            time.sleep(min(float(self.poll_interval), left))

    def _read_record(self, hook: ShardyfusionHook, config: WriteConfig) -> RunRecord | None:
        try:
            return hook.read_run_record(config.output_uri, config.run_id)
        except Exception as exc:
            self.log.warning("Run %s: could not read the run record: %s", config.run_id, exc)
            return None

    def _conclude(self, context: Context, hook: ShardyfusionHook, config: WriteConfig, record: RunRecord | None,
                  outcome: WriteOutcome) -> dict[str, Any]:
        if record is not None and outcome.ours:
            self._persist_link(context, record)
        if outcome.abandon is not None:
            from airflow_provider_shardyfusion.core.errors import RunAbandoned
            from airflow_provider_shardyfusion.core.run_record import mark_failed

            try:
                mark_failed(hook.get_store(config.output_uri), config.run_id, RunAbandoned(outcome.abandon))
            except Exception as exc:  # the run's own error below matters more than the bookkeeping
                self.log.warning("Run %s: could not mark the run record failed: %s", config.run_id, exc)
        if outcome.summary is not None:
            assert record is not None  # a summary comes only from a succeeded record
            return self._succeeded_run(context, hook, record)
        if outcome.traceback_tail:
            self.log.error("Run %s failed in the Spark job; traceback tail:\n%s", config.run_id, outcome.traceback_tail)
        outcome.raise_error()

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core.run_record import RunRecord

        event = event or {}
        if event.get("status") == "success":
            record = RunRecord.from_dict(event["run_record"])
            self._persist_link(context, record)
            from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

            return self._succeeded_run(context, ShardyfusionHook(aws_conn_id=self.aws_conn_id), record)
        if event.get("run_record"):
            with contextlib.suppress(Exception):  # the link is a convenience; the error below is what matters
                self._persist_link(context, RunRecord.from_dict(event["run_record"]))
        error_type = event.get("error_type") or "ShardyfusionError"
        message = event.get("writer_message") or event.get("message") or f"run record trigger failed: {event!r}"
        raise writer_exception(error_type, message)

    def _succeeded_run(self, context: Context, hook: ShardyfusionHook, record: RunRecord) -> dict[str, Any]:
        if self.publish is not True:
            return self._succeeded(context, snapshot_summary(record, published=False))
        if record.published_at is not None:
            return self._succeeded(context, snapshot_summary(record))
        from airflow_provider_shardyfusion.core.publish import publish_status

        # The writer records `succeeded` just before it moves _CURRENT: a waiter woken by the
        # record may look in between, so "not live" is only believed once the writer had time.
        snapshots = hook.get_snapshots(record.output_uri)
        deadline = time.monotonic() + _POINTER_SETTLE_S
        while (status := publish_status(snapshots, record)).state == "not_live" and time.monotonic() < deadline:
            time.sleep(min(float(self.poll_interval), 2.0))
        if status.state == "not_live":
            raise PublishManifestError(status.message())
        if status.state == "superseded":
            self.log.warning("Run %s: %s", record.run_id, status.message())
            return self._succeeded(context, dict(snapshot_summary(record, published=False),
                                                 superseded_by=status.superseded_by))
        return self._succeeded(context, snapshot_summary(record))

    def _succeeded(self, context: Context, summary: dict[str, Any]) -> dict[str, Any]:
        if summary["published"]:
            how = "published"
        elif summary.get("superseded_by"):
            how = f"staged (superseded by live run {summary['superseded_by']})"
        else:
            how = "staged (publish=False, _CURRENT untouched)"
        self.log.info("Run %s %s %s rows in %s shards (%s empty): %s", summary["run_id"], how,
                      summary["rows"], summary["num_dbs"], summary["empty_shards"], summary["manifest_ref"])
        _emit_snapshot_event(context, self.outlets or [], summary["output_uri"], summary, live=summary["published"])
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
                from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

                snapshots = ShardyfusionHook(aws_conn_id=self.aws_conn_id).get_snapshots(summary["output_uri"])
                schema = ol.SnapshotSchema.of_manifest(snapshots.read_manifest(summary["manifest_ref"]))
            except Exception as exc:  # lineage must never fail the task
                self.log.info("OpenLineage: manifest not read (%s); schema from the arguments", exc)
                schema = ol.SnapshotSchema.of_arguments(self.key_column, self.key_encoding, self.value_format,
                                                        self.value_column, self.value_columns)
        return ol.write_lineage(summary, input_path=self.input_path, input_table=self.input_table,
                                input_sql=self.input_sql, spark_conf=self.spark_conf, schema=schema)

    def _persist_link(self, context: Context, record: RunRecord) -> None:
        app_id = record.writer.get("spark_app_id")
        url = record.writer.get("spark_ui_url")
        conf = self.spark_conf if isinstance(self.spark_conf, Mapping) else {}
        history = conf.get("spark.yarn.historyServer.address")
        if app_id and history:
            base = history if "://" in str(history) else f"http://{history}"
            url = f"{str(base).rstrip('/')}/history/{app_id}/"
        try:
            SparkApplicationLink.persist(context, self, app_id, url)
        except Exception as exc:
            self.log.warning("Could not store the Spark application link: %s", exc)

    def on_kill(self) -> None:
        if self._submit_hook is not None:
            self._submit_hook.on_kill()
        if not (self._active_run_id and self._active_output_uri):
            return  # nothing submitted by this try (or only re-attached): not ours to mark
        from airflow_provider_shardyfusion.core.errors import RunKilled
        from airflow_provider_shardyfusion.core.run_record import mark_failed, read_run_record
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        try:
            store = ShardyfusionHook(aws_conn_id=self.aws_conn_id).get_store(self._active_output_uri)
            record = read_run_record(store, self._active_run_id)
            ident = writer_identity(record) if record is not None else None
            if ident is not None and self._me is not None and not same_try(ident, self._me):
                self.log.warning("Run %s belongs to another writer; not marking it", self._active_run_id)
                return
            mark_failed(store, self._active_run_id, RunKilled("killed: the Airflow task was stopped"))
        except Exception as exc:  # the kill itself must go through
            self.log.warning("Run %s: could not mark the run record failed: %s", self._active_run_id, exc)


# The :param: lines come from the one declaration of the arguments (core.write_args).
ShardedWriteOperator.__doc__ = (
    (ShardedWriteOperator.__doc__ or "").rstrip() + "\n\n" + write_args.param_docs(write_args.OPERATOR_ARGS) + "\n"
)


def _snapshot_asset(output_uri: Any) -> Asset | None:
    """Asset for a concrete output URI; templated or invalid URIs get none (validated in execute)."""
    if not isinstance(output_uri, str) or "{{" in output_uri or "{%" in output_uri:
        return None
    try:
        return Asset(layout.normalize_root(output_uri))
    except Exception:
        return None


def _with_snapshot_outlet(outlets: list[Any], output_uri: Any, publish: Any) -> list[Any]:
    """The snapshot's asset as an outlet, so Airflow emits its event only for writes meant to go live.

    Airflow emits an event for every ``Asset`` outlet of a successful task, so a staging write
    (``publish=False``) gets none: ``PublishSnapshotOperator`` emits it when the run goes live. A
    templated ``publish`` is only known in ``execute``: an ``AssetAlias`` outlet then carries the
    event, added only if the run was published.
    """
    asset = _snapshot_asset(output_uri)
    if asset is None or publish is False:
        return outlets
    if publish is True:
        if all(getattr(o, "uri", None) != asset.uri for o in outlets):
            outlets.append(asset)
        return outlets
    return [*outlets, AssetAlias(name=f"{_ALIAS_PREFIX}{asset.uri}")]


def _emit_snapshot_event(context: Context, outlets: Sequence[Any], output_uri: str, summary: Mapping[str, Any], *,
                         live: bool = True) -> None:
    """The summary as the event's extra. Airflow emits a declared ``Asset`` outlet's event on every
    success, so a superseded run's event cannot be withheld: its extra says ``published: false``
    and ``superseded_by``. Through the alias, only a run that went ``live`` emits."""
    asset = _snapshot_asset(output_uri)
    if asset is None:
        return
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri == asset.uri:
            context["outlet_events"][outlet].extra = dict(summary)
        elif isinstance(outlet, AssetAlias) and outlet.name == f"{_ALIAS_PREFIX}{asset.uri}" and live:
            context["outlet_events"][outlet].add(asset, extra=dict(summary))
