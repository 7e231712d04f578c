"""``ShardedWriteOperator``: build and publish a sharded RocksDB snapshot with Spark (SPEC §8).

The operator is a thin shell: it validates the arguments into a ``WriteConfig`` (so a bad argument
fails here, before Spark starts), ships the bundled PySpark application with the apache-spark
provider's ``SparkSubmitHook``, and then trusts only the run record the writer keeps under the
output root: success → a small summary (XCom) and an asset event; failure → the writer's own
error type and message.

Importing this module is light (no pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
from collections import deque
from dataclasses import replace
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import Asset, AssetAlias, BaseOperator, BaseOperatorLink

from airflow_provider_shardyfusion.core.errors import (
    ConfigError, ShardyfusionError, SparkSubmitError, error_type_by_name,
)

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Context
    from airflow.sdk.types import TaskInstanceKey

    from airflow_provider_shardyfusion.core.config import WriteConfig
    from airflow_provider_shardyfusion.core.run_record import RunRecord
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

_JOB_FAILED_RE = re.compile(r"shardyfusion job failed: (?P<type>[A-Za-z_][A-Za-z0-9_]*): (?P<message>.*)")
_OUTPUT_TAIL_LINES = 40
# A cluster-mode driver may sit in a queue before it writes its run record; past this the
# deferred task gives up instead of waiting for a driver that was never started.
_RUN_RECORD_MISSING_TIMEOUT_S = 3600.0
_DEFAULT_ENV_ALIAS = "shardyfusion_env"


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


def _submit_hook_class() -> type[SparkSubmitHook]:
    """``SparkSubmitHook`` that keeps the last lines of spark-submit output and a process-only env.

    Built lazily so importing this module does not import the spark provider's hook.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class ShardyfusionSparkSubmitHook(SparkSubmitHook):
        def __init__(self, *args: Any, process_env: Mapping[str, str] | None = None,
                     redact: Sequence[str] = (), **kwargs: Any):
            super().__init__(*args, **kwargs)
            # Set on the local spark-submit process only: unlike ``env_vars`` these never turn into
            # ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments,
            # so credentials cannot reach argv (or the Spark UI's environment page).
            self.process_env = dict(process_env or {})
            self._redact = [s for s in redact if s]
            self.output_tail: deque[str] = deque(maxlen=_OUTPUT_TAIL_LINES)

        def _build_spark_common_args(self) -> list[str]:
            args = super()._build_spark_common_args()
            if self.process_env:
                self._env = {**(self._env or {}), **self.process_env}
            return args

        def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
            def tee() -> Iterator[Any]:
                for line in itr:
                    self.output_tail.append(self.redacted(str(line).rstrip("\n")))
                    yield line

            super()._process_spark_submit_log(tee())

        def redacted(self, text: str) -> str:
            for secret in self._redact:
                text = text.replace(secret, "***")
            return self._mask_cmd(text)

        def tail_text(self) -> str:
            return "\n".join(self.output_tail)

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
    "empty_shards", "spark_app_id", "output_uri"}`` and emits an asset event for ``output_uri``.
    ``deferrable=True`` (cluster deploy modes) submits without waiting and waits on the run record
    in the triggerer.
    """

    template_fields: Sequence[str] = (
        "output_uri", "input_path", "input_format", "input_options", "input_table", "input_sql",
        "key_column", "value_column", "value_columns", "value_format", "num_dbs", "max_keys_per_shard",
        "cel_expr", "cel_columns", "routing_values", "infer_routing_values", "key_encoding", "run_id",
        "batch_size", "verify_routing", "sample_size", "cache_input", "sort_within_partitions",
        "max_writes_per_second", "max_write_bytes_per_second", "shard_retry", "allow_duplicate_keys",
        "spark_conn_id", "spark_conf", "spark_env_vars", "python_env_archive", "aws_conn_id",
        "driver_memory", "executor_memory", "executor_cores", "num_executors", "total_executor_cores", "publish",
    )
    template_fields_renderers = {
        "input_sql": "sql", "input_options": "json", "spark_conf": "json", "spark_env_vars": "json",
        "cel_columns": "json", "routing_values": "json", "shard_retry": "json",
    }
    ui_color = "#f4a460"
    operator_extra_links = (SparkApplicationLink(),)

    def __init__(
        self,
        *,
        output_uri: str,
        input_path: str | None = None,
        input_format: str = "parquet",
        input_options: Mapping[str, Any] | None = None,
        input_table: str | None = None,
        input_sql: str | None = None,
        key_column: str = "id",
        value_column: str | None = None,
        value_columns: Sequence[str] | None = None,
        value_format: str = "binary",
        num_dbs: int | None = None,
        max_keys_per_shard: int | None = None,
        cel_expr: str | None = None,
        cel_columns: Mapping[str, str] | Sequence[str] | None = None,
        routing_values: Sequence[Any] | None = None,
        infer_routing_values: bool = False,
        key_encoding: str | None = None,
        run_id: str | None = None,
        batch_size: int = 50_000,
        verify_routing: bool = True,
        sample_size: int = 20,
        cache_input: bool = False,
        sort_within_partitions: bool = True,
        max_writes_per_second: float | None = None,
        max_write_bytes_per_second: float | None = None,
        shard_retry: int | Mapping[str, Any] | None = None,
        spark_conn_id: str = "spark_default",
        spark_conf: Mapping[str, Any] | None = None,
        spark_env_vars: Mapping[str, Any] | None = None,
        python_env_archive: str | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = False,
        allow_duplicate_keys: bool = False,
        driver_memory: str | None = None,
        executor_memory: str | None = None,
        executor_cores: int | None = None,
        num_executors: int | None = None,
        total_executor_cores: int | None = None,
        poll_interval: float = 30.0,
        publish: bool = True,
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
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.spark_env_vars = spark_env_vars
        self.python_env_archive = python_env_archive
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.allow_duplicate_keys = allow_duplicate_keys
        self.driver_memory = driver_memory
        self.executor_memory = executor_memory
        self.executor_cores = executor_cores
        self.num_executors = num_executors
        self.total_executor_cores = total_executor_cores
        self.poll_interval = poll_interval
        self.publish = publish
        # Set during execute() so on_kill() can stop what this try started.
        self._submit_hook: Any = None
        self._active_run_id: str | None = None
        self._active_output_uri: str | None = None

    # -- configuration ---------------------------------------------------------------------------

    @staticmethod
    def airflow_context(context: Context) -> dict[str, Any]:
        ti = context["ti"]
        return {
            "dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
            "try_number": ti.try_number, "map_index": ti.map_index,
        }

    def build_config(self, context: Context, storage_options: Any = None) -> WriteConfig:
        """Validated ``WriteConfig``; raises ``ConfigError`` naming the argument at fault."""
        from airflow_provider_shardyfusion.core.config import build_write_config

        return build_write_config(
            output_uri=self.output_uri, key_column=self.key_column,
            input_path=self.input_path, input_format=self.input_format, input_options=self.input_options,
            input_table=self.input_table, input_sql=self.input_sql,
            value_column=self.value_column, value_columns=self.value_columns, value_format=self.value_format,
            num_dbs=self.num_dbs, max_keys_per_shard=self.max_keys_per_shard,
            cel_expr=self.cel_expr, cel_columns=self.cel_columns, routing_values=self.routing_values,
            infer_routing_values=self.infer_routing_values, key_encoding=self.key_encoding,
            run_id=self.run_id, batch_size=self.batch_size, verify_routing=self.verify_routing,
            sample_size=self.sample_size, cache_input=self.cache_input,
            sort_within_partitions=self.sort_within_partitions,
            max_writes_per_second=self.max_writes_per_second,
            max_write_bytes_per_second=self.max_write_bytes_per_second,
            shard_retry=self.shard_retry, allow_duplicate_keys=self.allow_duplicate_keys, publish=self.publish,
            storage_options=storage_options, airflow_context=self.airflow_context(context),
        )

    def _check_spark_args(self) -> None:
        for name in ("spark_conf", "spark_env_vars"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value)):
                raise ConfigError(f"{name} {value!r} must be a mapping of string keys")
        if self.python_env_archive is not None and (not isinstance(self.python_env_archive, str)
                                                    or not self.python_env_archive.strip("#")):
            raise ConfigError(f"python_env_archive {self.python_env_archive!r} must be a path or URI, e.g. 's3://b/env.tar.gz#env'")
        if isinstance(self.poll_interval, bool) or not isinstance(self.poll_interval, (int, float)) or self.poll_interval <= 0:
            raise ConfigError(f"poll_interval {self.poll_interval!r} must be a number of seconds > 0")

    # -- spark-submit ----------------------------------------------------------------------------

    def _resolve_spark_connection(self) -> dict[str, Any]:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        # Where the driver runs decides which env / conf are safe and useful; the spark provider
        # owns that parsing (connection host vs. conn_type, extras), so ask it rather than copy it.
        return dict(SparkSubmitHook(conn_id=self.spark_conn_id)._connection)

    def get_submit_hook(
        self, config: WriteConfig, zip_path: str, credential_env: Mapping[str, str], connection: Mapping[str, Any],
        *, wait_for_completion: bool = True,
    ) -> SparkSubmitHook:
        master = str(connection.get("master") or "")
        cluster_mode = connection.get("deploy_mode") == "cluster"
        is_local = master.startswith("local")
        is_yarn, is_k8s = "yarn" in master, "k8s" in master
        standalone_cluster = master.startswith("spark://") and cluster_mode

        conf = {k: str(v) for k, v in (self.spark_conf or {}).items()}
        env_vars = {k: str(v) for k, v in (self.spark_env_vars or {}).items()}
        if standalone_cluster and env_vars:
            raise ConfigError(
                "spark_env_vars cannot be used with a standalone cluster in deploy mode 'cluster' "
                f"(connection {self.spark_conn_id!r}); set spark.driverEnv.* / spark.executorEnv.* in spark_conf"
            )
        if self.python_env_archive:
            archive = self.python_env_archive if "#" in self.python_env_archive else f"{self.python_env_archive}#{_DEFAULT_ENV_ALIAS}"
            python = f"./{archive.rsplit('#', 1)[1]}/bin/python"
            conf.setdefault("spark.pyspark.python", python)
            conf.setdefault("spark.executorEnv.PYSPARK_PYTHON", python)
            if is_yarn and cluster_mode:
                conf.setdefault("spark.yarn.appMasterEnv.PYSPARK_PYTHON", python)
            if not cluster_mode:
                # The driver runs here, outside the unpacked archive.
                conf.setdefault("spark.pyspark.driver.python", sys.executable)
        else:
            archive = None
            if (is_local or (master.startswith("spark://") and not cluster_mode)) \
                    and "PYSPARK_PYTHON" not in env_vars and "PYSPARK_PYTHON" not in os.environ:
                # Workers started by this driver must import the same interpreter (and packages).
                env_vars["PYSPARK_PYTHON"] = sys.executable
        if is_local and "SPARK_LOCAL_IP" not in env_vars and "SPARK_LOCAL_IP" not in os.environ:
            env_vars["SPARK_LOCAL_IP"] = "127.0.0.1"
        if not wait_for_completion:
            if is_yarn:
                conf["spark.yarn.submit.waitAppCompletion"] = "false"
            elif is_k8s:
                conf["spark.kubernetes.submission.waitAppCompletion"] = "false"
            elif master.startswith("spark://"):
                conf["spark.standalone.submit.waitAppCompletion"] = "false"

        process_env: dict[str, str] = {}
        if credential_env:
            if cluster_mode:
                self.log.warning(
                    "Credentials of %r are not forwarded: the driver runs on the cluster (deploy mode 'cluster') "
                    "and passing them would put them on the spark-submit command line; give the cluster its own "
                    "role for %s", self.aws_conn_id, config.output_uri,
                )
            else:
                process_env.update(credential_env)
                if not is_local:
                    self.log.info(
                        "Credentials of %r go to the Spark driver's environment; the job hands them to executors "
                        "on %s through SparkConf spark.executorEnv.* (never argv; secrets redacted by Spark)",
                        self.aws_conn_id, master,
                    )
        binary = str(connection.get("spark_binary") or "spark-submit")
        venv_bin = os.path.dirname(sys.executable)
        if shutil.which(binary) is None and os.path.exists(os.path.join(venv_bin, binary)):
            # pyspark installs spark-submit next to the interpreter; a worker's PATH may not have it.
            process_env["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")

        config_b64 = base64.urlsafe_b64encode(config.to_json().encode()).decode("ascii")
        hook_cls = _submit_hook_class()
        return hook_cls(
            conn_id=self.spark_conn_id,
            conf=conf,
            py_files=zip_path,
            archives=archive,
            env_vars=env_vars or None,
            application_args=["--config-b64", config_b64],
            name=f"shardyfusion-{self.task_id}-{config.run_id}",
            driver_memory=self.driver_memory,
            executor_memory=self.executor_memory,
            executor_cores=self.executor_cores,
            num_executors=self.num_executors,
            total_executor_cores=self.total_executor_cores,
            process_env=process_env,
            redact=list(credential_env.values()),
        )

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.log import mask_secret

        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook
        from airflow_provider_shardyfusion.operators.bundle import build_bundle

        self._check_spark_args()
        hook = ShardyfusionHook(aws_conn_id=self.aws_conn_id)
        config = self.build_config(context)  # validates every argument before touching a connection
        config = replace(config, storage_options=hook.public_storage_options(config.output_uri)).validate()
        credential_env = hook.credential_env(config.output_uri)
        for value in credential_env.values():
            mask_secret(value)
        connection = self._resolve_spark_connection()
        cluster_mode = connection.get("deploy_mode") == "cluster"
        defer = bool(self.deferrable) and cluster_mode
        if self.deferrable and not cluster_mode:
            self.log.warning(
                "deferrable=True needs a cluster deploy mode (the driver of %r runs inside spark-submit "
                "here, so the worker must wait for it); running without deferring", connection.get("master"),
            )

        bundle = build_bundle()
        submit_hook = self.get_submit_hook(config, bundle.zip_path, credential_env, connection,
                                           wait_for_completion=not defer)
        self._submit_hook, self._active_run_id, self._active_output_uri = submit_hook, config.run_id, config.output_uri
        if self.do_xcom_push:
            context["ti"].xcom_push(key="run_id", value=config.run_id)
        self.log.info("Run %s: submitting the sharded write of %s to %s (bundle %s)",
                      config.run_id, config.output_uri, connection.get("master"), bundle.zip_path)
        # The job gets this as base64 on its command line; the plain JSON (no secrets) is for humans.
        self.log.info("Run %s: write config %s", config.run_id, config.to_json())

        submit_error: BaseException | None = None
        try:
            submit_hook.submit(application=bundle.entry_script)
            if not defer and getattr(submit_hook, "_should_track_driver_status", False):
                submit_hook._start_driver_status_tracking()  # standalone cluster mode: wait for the driver
                if submit_hook._driver_status != "FINISHED":
                    raise SparkSubmitError(f"Spark driver {submit_hook._driver_id} ended as {submit_hook._driver_status}")
        except Exception as exc:
            submit_error = exc

        record = self._read_record(hook, config)
        if submit_error is None and defer and (record is None or not record.is_terminal):
            from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger

            self.log.info("Run %s submitted; deferring until its run record is final", config.run_id)
            self.defer(
                trigger=RunRecordTrigger(
                    output_uri=config.output_uri, run_id=config.run_id, aws_conn_id=self.aws_conn_id,
                    poll_interval=self.poll_interval, missing_timeout=_RUN_RECORD_MISSING_TIMEOUT_S,
                    fail_run_on_kill=True,
                ),
                method_name="execute_complete",
            )
        return self._finish(context, hook, config, record, submit_error, submit_hook, cluster_mode)

    def _read_record(self, hook: ShardyfusionHook, config: WriteConfig) -> RunRecord | None:
        try:
            return hook.read_run_record(config.output_uri, config.run_id)
        except Exception as exc:
            self.log.warning("Run %s: could not read the run record: %s", config.run_id, exc)
            return None

    def _finish(self, context: Context, hook: ShardyfusionHook, config: WriteConfig, record: RunRecord | None,
                submit_error: BaseException | None, submit_hook: Any, cluster_mode: bool) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core import layout
        from airflow_provider_shardyfusion.core.errors import RunAbandoned
        from airflow_provider_shardyfusion.core.run_record import FAILED, RUNNING, SUCCEEDED, mark_failed

        tail = submit_hook.tail_text() if hasattr(submit_hook, "tail_text") else ""
        if record is not None:
            self._persist_link(context, record)
        if record is not None and record.status == SUCCEEDED:
            return self._succeeded(context, record)
        if record is not None and record.status == FAILED:
            self._raise_writer_error(record)
        if record is not None and record.status == RUNNING and not cluster_mode:
            # spark-submit (and with it the client-mode driver) is gone: nobody will finish this run.
            why = f"spark-submit ended ({submit_error or 'exit code 0'}) while the run was still running"
            mark_failed(hook.get_store(config.output_uri), config.run_id, RunAbandoned(why))
        job_line = _job_failure_line(tail)
        if job_line is not None and record is None:
            # The job refused the config before it could start a run record (exit code 2).
            raise _writer_exception(*job_line)
        where = layout.join(config.output_uri, layout.run_record_key(config.run_id))
        state = "no run record" if record is None else f"the run record still says {record.status!r}"
        cause = f"failed: {_short(submit_error)}" if submit_error is not None else "ended with exit code 0"
        raise SparkSubmitError(
            f"run {config.run_id}: spark-submit {cause}; {state} at {where}"
            + (f"\nLast spark-submit output:\n{tail}" if tail else "")
        ) from None

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core.run_record import RunRecord

        event = event or {}
        if event.get("status") == "success":
            record = RunRecord.from_dict(event["run_record"])
            self._persist_link(context, record)
            return self._succeeded(context, record)
        if event.get("run_record"):
            try:
                self._persist_link(context, RunRecord.from_dict(event["run_record"]))
            except Exception:  # the link is a convenience; the error below is what matters
                pass
        error_type = event.get("error_type") or "ShardyfusionError"
        message = event.get("writer_message") or event.get("message") or f"run record trigger failed: {event!r}"
        raise _writer_exception(error_type, message)

    def _succeeded(self, context: Context, record: RunRecord) -> dict[str, Any]:
        summary = snapshot_summary(record, published=self.publish is True)
        self.log.info("Run %s %s %s rows in %s shards (%s empty): %s", record.run_id,
                      "published" if summary["published"] else "staged (publish=False, _CURRENT untouched)",
                      summary["rows"], summary["num_dbs"], summary["empty_shards"], summary["manifest_ref"])
        if summary["published"]:
            _emit_snapshot_event(context, self.outlets or [], record.output_uri, summary)
        return summary

    def _raise_writer_error(self, record: RunRecord) -> None:
        err = record.error
        if err is None:
            raise SparkSubmitError(f"run {record.run_id} failed without an error in its run record")
        if err.traceback_tail:
            self.log.error("Run %s failed in the Spark job; traceback tail:\n%s", record.run_id, err.traceback_tail)
        raise _writer_exception(err.type, err.message)

    def _persist_link(self, context: Context, record: RunRecord) -> None:
        app_id = record.writer.get("spark_app_id")
        url = record.writer.get("spark_ui_url")
        history = (self.spark_conf or {}).get("spark.yarn.historyServer.address") if isinstance(self.spark_conf, Mapping) else None
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
        if self._active_run_id and self._active_output_uri:
            from airflow_provider_shardyfusion.core.run_record import mark_failed
            from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook
            from airflow_provider_shardyfusion.core.errors import RunKilled

            try:
                store = ShardyfusionHook(aws_conn_id=self.aws_conn_id).get_store(self._active_output_uri)
                mark_failed(store, self._active_run_id, RunKilled())
            except Exception as exc:  # the kill itself must go through
                self.log.warning("Run %s: could not mark the run record failed: %s", self._active_run_id, exc)


def snapshot_summary(record: RunRecord, *, published: bool = True) -> dict[str, Any]:
    """The small, JSON-able description of a written snapshot (the operator's XCom).

    ``published``: whether the run went live. The run record's ``published_at`` says so when the
    writer stamped it; otherwise the flag the run was written with (a succeeded run with
    ``publish=True`` moved ``_CURRENT``).
    """
    from airflow_provider_shardyfusion.core import layout

    stats = record.stats or {}
    return {
        "published": getattr(record, "published_at", None) is not None or bool(published),
        "run_id": record.run_id,
        "output_uri": record.output_uri,
        "manifest_ref": record.manifest_ref,
        "run_record_ref": layout.join(record.output_uri, layout.run_record_key(record.run_id)),
        "num_dbs": record.num_dbs if record.num_dbs is not None else stats.get("num_dbs"),
        "rows": stats.get("rows"),
        "bytes": stats.get("bytes"),
        "empty_shards": stats.get("empty_shards"),
        "spark_app_id": record.writer.get("spark_app_id"),
    }


def _snapshot_alias(output_uri: Any) -> AssetAlias:
    return AssetAlias(name=f"shardyfusion-snapshot:{output_uri}")


def _with_snapshot_outlet(outlets: list[Any], output_uri: Any, publish: Any) -> list[Any]:
    """The snapshot's asset as an outlet, so Airflow emits its event only when a write goes live.

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
    return [*outlets, _snapshot_alias(output_uri)]


def _emit_snapshot_event(context: Context, outlets: Sequence[Any], output_uri: str, summary: Mapping[str, Any]) -> None:
    asset = _snapshot_asset(output_uri)
    if asset is None:
        return
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri == asset.uri:
            context["outlet_events"][outlet].extra = dict(summary)
        elif isinstance(outlet, AssetAlias) and outlet.name.startswith("shardyfusion-snapshot:"):
            context["outlet_events"][outlet].add(asset, extra=dict(summary))


def _snapshot_asset(output_uri: Any) -> Asset | None:
    """Asset for a concrete output URI; templated or invalid URIs get none (validated in execute)."""
    from airflow_provider_shardyfusion.core import layout

    if not isinstance(output_uri, str) or "{{" in output_uri or "{%" in output_uri:
        return None
    try:
        return Asset(layout.normalize_root(output_uri))
    except Exception:
        return None


def _writer_exception(type_name: str, message: str) -> ShardyfusionError:
    """The writer's error as the same class (by name) and message it had in the Spark job."""
    cls = error_type_by_name(type_name)
    if cls is ShardyfusionError and type_name != "ShardyfusionError":
        message = f"{type_name}: {message}"  # not one of ours (e.g. a Py4J error): keep its name visible
    return cls(message)


def _job_failure_line(tail: str) -> tuple[str, str] | None:
    for line in reversed(tail.splitlines()):
        m = _JOB_FAILED_RE.search(line)
        if m:
            return m["type"], m["message"]
    return None


def _short(exc: BaseException) -> str:
    text = str(exc)
    # The spark provider's message repeats the whole command line and its own tail: keep the code.
    code = re.search(r"Error code is: (-?\d+)", text)
    if text.startswith("Cannot execute:") and code:
        return f"exit code {code[1]}"
    text = text.split("\nLast spark-submit output:", 1)[0]
    return text if len(text) <= 500 else text[:500] + "…"
