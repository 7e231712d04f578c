"""``SparkJobOperator``: the base of the operators that run a shardyfusion Spark job.

``ShardedWriteOperator`` (one write) and ``StreamingSnapshotOperator`` (a streaming query) are
siblings on it. It owns what running the job takes, whatever the job is: the Spark settings, the
storage credentials as the job's environment, the application bundle, the launch through a
``submission.launcher.SparkJobLauncher`` chosen once from the connection's type (spark-submit, or
a Spark Connect client), stopping it in ``on_kill``, and the Spark application link. A subclass
says which application runs with which JSON, and what the task makes of the outcome. Importing
this module is light (no pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, BaseOperatorLink
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.assets import with_snapshot_outlet
from airflow_provider_shardyfusion.hooks.hook_property import WithShardyfusionHook

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.types import TaskInstanceKey

    from airflow_provider_shardyfusion.core.model.config import WriteConfig
    from airflow_provider_shardyfusion.core.model.run_record import RunRecord
    from airflow_provider_shardyfusion.hooks.spark_submit import ShardyfusionSparkSubmitHook
    from airflow_provider_shardyfusion.submission.bundle import Bundle
    from airflow_provider_shardyfusion.submission.connect import ConnectPlan
    from airflow_provider_shardyfusion.submission.launcher import SparkJobLauncher
    from airflow_provider_shardyfusion.submission.plan import SparkSettings, SubmitPlan

__all__ = ["SPARK_JOB_ARGS", "SparkApplicationLink", "SparkJobOperator"]

# The arguments SparkJobOperator.__init__ keeps (besides ``publishes``), as the subclasses name them.
SPARK_JOB_ARGS = ("output_uri", "spark_conn_id", "spark_conf", "spark_env_vars", "python_env_archive", "aws_conn_id",
                  "driver_memory", "executor_memory", "executor_cores", "num_executors", "total_executor_cores")


class SparkApplicationLink(BaseOperatorLink):
    """Spark UI / history server page of the application that wrote the snapshot (when known)."""

    name = "Spark application"
    key: ClassVar[str] = "spark_app_id"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        if not isinstance(ti_key, tuple):
            # The task runner asks right after the try, with the operator that ran it: that knows
            # whether it stored a link. Reading an XCom never pushed is logged as an error by Airflow.
            return getattr(operator, "_spark_app_url", "")
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
        operator._spark_app_url = url or ""


def _submit_hook_class() -> type[ShardyfusionSparkSubmitHook]:
    """Imported on use so that parsing a DAG does not import the spark provider's hook."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_shardyfusion import compat
    from airflow_provider_shardyfusion.hooks.spark_submit import ShardyfusionSparkSubmitHook

    # The provider's class, not ours: our subclass defines the overridden members itself.
    compat.check_spark_provider(SparkSubmitHook, compat._installed_version("apache-airflow-providers-apache-spark"))
    return ShardyfusionSparkSubmitHook


class SparkJobOperator(WithShardyfusionHook, BaseOperator):
    """Run a shardyfusion Spark job for a snapshot at ``output_uri`` (not used directly).

    The arguments are the subclasses' (documented there); ``publishes`` chooses the snapshot's
    outlet (``assets.with_snapshot_outlet``): ``True`` its ``Asset``, ``False`` none, anything else
    (a template, or ``None`` for a job that publishes many runs) its ``AssetAlias``.
    """

    operator_extra_links = (SparkApplicationLink(),)
    # Whether the task may wait in the triggerer; a subclass that can defer sets it per task.
    deferrable: bool = False

    def __init__(
        self,
        *,
        output_uri: str,
        publishes: Any,
        spark_conn_id: str,
        spark_conf: Mapping[str, Any] | None,
        spark_env_vars: Mapping[str, Any] | None,
        python_env_archive: str | None,
        aws_conn_id: str | None,
        driver_memory: str | None,
        executor_memory: str | None,
        executor_cores: int | None,
        num_executors: int | None,
        total_executor_cores: int | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(outlets=with_snapshot_outlet(list(kwargs.pop("outlets", None) or []), output_uri, publishes),
                         **kwargs)
        # Verbatim on purpose: templates render after __init__, so validation lives in execute().
        self.output_uri = output_uri
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
        # Set when the job is launched, so on_kill() can stop what this try started (and only that).
        self._launcher: SparkJobLauncher | None = None
        self._active_output_uri: str | None = None

    # -- what a subclass runs ----------------------------------------------------------------------

    @abstractmethod
    def _config_arguments(self) -> dict[str, Any]:
        """The ``build_write_config`` arguments of this operator's (rendered) attributes."""

    @abstractmethod
    def _application(self, bundle: Bundle) -> str:
        """The bundle's entry script this operator runs."""

    @abstractmethod
    def _job_config_json(self, config: WriteConfig) -> str:
        """The JSON the job gets (base64 on its command line; no secrets in it)."""

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
        from airflow_provider_shardyfusion.core.model.config import build_write_config

        return build_write_config(**self._config_arguments(), storage_options=storage_options,
                                  airflow_context=self.airflow_context(context))

    def _write_config(self, context: Context) -> WriteConfig:
        """``build_config`` (every argument validated before a connection is touched), then the
        output's non-secret storage settings from the AWS connection."""
        config = self.build_config(context)
        return replace(config, storage_options=self.hook.public_storage_options(config.output_uri)).validate()

    def spark_settings(self) -> SparkSettings:
        """The Spark arguments, validated (``ConfigError`` naming the argument at fault)."""
        from airflow_provider_shardyfusion.submission.plan import SparkSettings

        return SparkSettings(
            conf=self.spark_conf, env_vars=self.spark_env_vars, python_env_archive=self.python_env_archive,
            driver_memory=self.driver_memory, executor_memory=self.executor_memory,
            executor_cores=self.executor_cores, num_executors=self.num_executors,
            total_executor_cores=self.total_executor_cores,
        ).validate()

    # -- launching -------------------------------------------------------------------------------

    def _launch(self, context: Context, config: WriteConfig,
                spark: SparkSettings) -> tuple[SubmitPlan | ConnectPlan, Exception | None]:
        """Run the job for ``config`` with the launcher of the connection's type; returns the plan and
        what the launch raised."""
        from airflow.sdk.log import mask_secret

        from airflow_provider_shardyfusion.hooks.spark_connect import is_connect_connection
        from airflow_provider_shardyfusion.submission.bundle import build_bundle

        credential_env = self.hook.credential_env(config.output_uri)
        for value in credential_env.values():
            mask_secret(value)
        bundle = build_bundle()
        prepare = self._prepare_connect if is_connect_connection(self.spark_conn_id) else self._prepare_spark_submit
        plan, launcher = prepare(config, spark, bundle, credential_env)
        self._start(context, config, launcher)
        # The job gets this as base64 on its command line; the plain JSON (no secrets) is for humans.
        self.log.info("Run %s: write config %s", config.run_id, config.to_json())
        try:
            launcher.submit(plan.application)
        except Exception as exc:
            return plan, exc
        return plan, None

    def _prepare_connect(self, config: WriteConfig, spark: SparkSettings, bundle: Bundle,
                         credential_env: Mapping[str, str]) -> tuple[ConnectPlan, SparkJobLauncher]:
        import sys

        from airflow.sdk.log import mask_secret

        from airflow_provider_shardyfusion.hooks.spark_connect import (
            ShardyfusionConnectJobHook,
            check_connect_server,
            connect_ca_cert,
            connect_url,
        )
        from airflow_provider_shardyfusion.submission.connect import build_connect_plan

        remote_url, ca_cert = connect_url(self.spark_conn_id), connect_ca_cert(self.spark_conn_id)
        plan = build_connect_plan(
            conn_id=self.spark_conn_id, remote_url=remote_url, spark=spark,
            python=sys.executable, application=self._application(bundle), bundle_zip=bundle.zip_path,
            config_json=self._job_config_json(config), credential_env=credential_env, ca_cert=ca_cert,
            deferrable=bool(self.deferrable),
            deferrable_by_default=conf.getboolean("operators", "default_deferrable", fallback=False),
        )
        for secret in plan.redact:
            mask_secret(secret)
        for note in plan.notes:
            self.log.warning("Run %s: %s", config.run_id, note)
        # Before anything is written: an unreachable server is one error now, not minutes of silence.
        version = check_connect_server(self.spark_conn_id, remote_url, ca_cert=ca_cert)
        self.log.info("Run %s: the Spark Connect server of connection %r answers (Spark %s)", config.run_id,
                      self.spark_conn_id, version)
        self.log.info("Run %s: running the sharded write of %s as a Spark Connect client (connection %r, bundle %s)",
                      config.run_id, config.output_uri, self.spark_conn_id, bundle.zip_path)
        return plan, ShardyfusionConnectJobHook(plan)

    def _prepare_spark_submit(self, config: WriteConfig, spark: SparkSettings, bundle: Bundle,
                              credential_env: Mapping[str, str]) -> tuple[SubmitPlan, SparkJobLauncher]:
        from airflow_provider_shardyfusion.hooks.spark_submit import resolve_spark_connection
        from airflow_provider_shardyfusion.submission.plan import Host, build_submit_plan

        target = resolve_spark_connection(self.spark_conn_id)
        plan = build_submit_plan(
            target=target, spark=spark, host=Host.current(target.spark_binary), application=self._application(bundle),
            py_files=bundle.zip_path, config_json=self._job_config_json(config),
            name=f"shardyfusion-{self.task_id}-{config.run_id}",
            credential_env=credential_env, deferrable=bool(self.deferrable),
        )
        for note in plan.notes:
            self.log.warning("Run %s (connection %r, %s): %s", config.run_id, self.aws_conn_id, config.output_uri, note)
        self.log.info("Run %s: submitting the sharded write of %s to %s (bundle %s)",
                      config.run_id, config.output_uri, target.master, bundle.zip_path)
        return plan, _submit_hook_class()(**plan.hook_kwargs())

    def _start(self, context: Context, config: WriteConfig, launcher: SparkJobLauncher) -> None:
        """Remember the running job, for ``on_kill``."""
        self._launcher, self._active_output_uri = launcher, config.output_uri

    def _launcher_tail(self) -> str:
        """The last lines of the job's output ("" before a launch)."""
        return self._launcher.tail_text() if self._launcher is not None else ""

    def _persist_link(self, context: Context, record: RunRecord) -> None:
        from airflow_provider_shardyfusion.core.write.job_contract import WriterIdentity

        writer = WriterIdentity.from_dict(record.writer)
        app_id, url = writer.spark_app_id, writer.spark_ui_url
        spark_conf = self.spark_conf if isinstance(self.spark_conf, Mapping) else {}
        history = spark_conf.get("spark.yarn.historyServer.address")
        if app_id and history:
            base = history if "://" in str(history) else f"http://{history}"
            url = f"{str(base).rstrip('/')}/history/{app_id}/"
        try:
            SparkApplicationLink.persist(context, self, app_id, url)
        except Exception as exc:
            self.log.warning("Could not store the Spark application link: %s", exc)

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.on_kill()
