"""The spark-submit plan of a sharded write: a pure function of the arguments and the connection.

Deploy-mode policy lives here and nowhere else: which interpreter executors and driver use, what
may go into the environment (credentials only to a driver that runs next to spark-submit, never
as arguments), whether the task can defer, and how the job gets its configuration. No Airflow
import: the plan is unit-tested as data (tests/unit/test_submit_plan.py).
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_shardyfusion.core.arguments import as_int, as_mapping
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.lifecycle.write_attempts import SPARK_SUBMIT
from airflow_provider_shardyfusion.core.secrets import refuse_credential_settings, refuse_userinfo

__all__ = [
    "CONFIG_ARG", "DEFAULT_ENV_ALIAS", "DEFAULT_SPARK_LOG_LEVEL", "Host", "SparkSettings", "SparkTarget", "SubmitPlan",
    "build_submit_plan", "encode_config",
]

DEFAULT_ENV_ALIAS = "shardyfusion_env"
CONFIG_ARG = "--config-b64"
DEFAULT_SPARK_LOG_LEVEL = "WARN"


@dataclass(frozen=True)
class SparkTarget:
    """Where spark-submit sends the job (from the spark connection)."""

    conn_id: str
    master: str
    deploy_mode: str | None = None
    spark_binary: str = "spark-submit"

    @property
    def cluster_mode(self) -> bool:
        return self.deploy_mode == "cluster"

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    @property
    def is_yarn(self) -> bool:
        return "yarn" in self.master

    @property
    def is_k8s(self) -> bool:
        return "k8s" in self.master

    @property
    def is_standalone(self) -> bool:
        return self.master.startswith("spark://")


@dataclass(frozen=True)
class Host:
    """Facts about the worker that submits (kept apart so the plan stays a pure function)."""

    python: str
    environ: Mapping[str, str]
    binary_on_path: bool
    binary_next_to_python: bool

    @classmethod
    def current(cls, spark_binary: str) -> Host:
        venv_bin = os.path.dirname(sys.executable)
        return cls(
            python=sys.executable, environ=dict(os.environ),
            binary_on_path=shutil.which(spark_binary) is not None,
            binary_next_to_python=os.path.exists(os.path.join(venv_bin, spark_binary)),
        )


_SIZES = ("executor_cores", "num_executors", "total_executor_cores")


@dataclass(frozen=True)
class SparkSettings:
    """The operator's Spark arguments (validated by ``SparkSettings.validate``)."""

    conf: Mapping[str, Any] | None = None
    env_vars: Mapping[str, Any] | None = None
    python_env_archive: str | None = None
    driver_memory: str | None = None
    executor_memory: str | None = None
    executor_cores: int | None = None
    num_executors: int | None = None
    total_executor_cores: int | None = None

    def validate(self) -> SparkSettings:
        # Mappings and sizes may arrive rendered as text (a templated argument): read as their value.
        conf, env_vars = as_mapping("spark_conf", self.conf), as_mapping("spark_env_vars", self.env_vars)
        refuse_credential_settings(conf, "spark_conf keys")
        for key, value in (conf or {}).items():  # a URI-valued setting (e.g. an event log dir) too
            refuse_userinfo(value, f"spark_conf[{key!r}]")
        refuse_userinfo(self.python_env_archive, "python_env_archive")
        archive = self.python_env_archive
        if archive is not None and (not isinstance(archive, str) or not archive.strip("#")):
            raise ConfigError(f"python_env_archive {archive!r} must be a path or URI, e.g. 's3://b/env.tar.gz#env'")
        sizes: dict[str, Any] = {name: as_int(name, getattr(self, name), minimum=1) for name in _SIZES
                                 if getattr(self, name) is not None}
        return replace(self, conf=conf, env_vars=env_vars, **sizes)


@dataclass(frozen=True)
class SubmitPlan:
    """Everything spark-submit gets, plus the waiting policy the operator follows."""

    conn_id: str
    application: str
    py_files: str
    name: str
    application_args: tuple[str, ...]
    conf: Mapping[str, str]
    env_vars: Mapping[str, str]
    archives: str | None
    resources: Mapping[str, Any]
    defer: bool  # submit without waiting; the task waits on the run record in the triggerer
    wait_for_driver: bool  # standalone cluster mode: the worker waits for the driver's final state
    cluster_mode: bool
    notes: tuple[str, ...] = ()  # what the operator logs about the policy it applied
    # Credentials: never printed (repr) and never arguments; only the spark-submit process has them.
    process_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    redact: tuple[str, ...] = field(default=(), repr=False)

    @property
    def launcher(self) -> str:
        """The job's process as errors name it."""
        return SPARK_SUBMIT

    def hook_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ShardyfusionSparkSubmitHook``."""
        return {
            "conn_id": self.conn_id, "conf": dict(self.conf), "py_files": self.py_files, "archives": self.archives,
            "env_vars": dict(self.env_vars) or None, "application_args": list(self.application_args),
            "name": self.name, **dict(self.resources), "process_env": dict(self.process_env),
            "redact": list(self.redact), "wait_for_driver": self.wait_for_driver,
        }


def encode_config(config_json: str) -> str:
    """The write config as the job's command line carries it (no secrets in it, see WriteConfig)."""
    return base64.urlsafe_b64encode(config_json.encode()).decode("ascii")


def build_submit_plan(  # noqa: C901 - one branch per deploy mode and resource flag of spark-submit
    *,
    target: SparkTarget,
    spark: SparkSettings,
    host: Host,
    application: str,
    py_files: str,
    config_json: str,
    name: str,
    credential_env: Mapping[str, str] | None = None,
    deferrable: bool = False,
) -> SubmitPlan:
    """The spark-submit arguments and the waiting policy for one run."""
    spark = spark.validate()
    credential_env = dict(credential_env or {})
    cluster = target.cluster_mode
    notes: list[str] = []
    conf = {k: str(v) for k, v in (spark.conf or {}).items()}
    # Spark's INFO lines (hundreds per run) would bury the job's own progress lines; spark_conf may
    # set another level. Applied when the SparkContext starts (Spark >= 3.5).
    conf.setdefault("spark.log.level", DEFAULT_SPARK_LOG_LEVEL)
    env_vars = {k: str(v) for k, v in (spark.env_vars or {}).items()}
    if target.is_standalone and cluster and env_vars:
        raise ConfigError(
            "spark_env_vars cannot be used with a standalone cluster in deploy mode 'cluster' "
            f"(connection {target.conn_id!r}); set spark.driverEnv.* / spark.executorEnv.* in spark_conf"
        )

    archives = None
    if spark.python_env_archive:
        archive = spark.python_env_archive
        archives = archive if "#" in archive else f"{archive}#{DEFAULT_ENV_ALIAS}"
        python = f"./{archives.rsplit('#', 1)[1]}/bin/python"
        conf.setdefault("spark.pyspark.python", python)
        conf.setdefault("spark.executorEnv.PYSPARK_PYTHON", python)
        if target.is_yarn and cluster:
            conf.setdefault("spark.yarn.appMasterEnv.PYSPARK_PYTHON", python)
        if not cluster:
            # The driver runs here, outside the unpacked archive.
            conf.setdefault("spark.pyspark.driver.python", host.python)
    elif (target.is_local or (target.is_standalone and not cluster)) \
            and "PYSPARK_PYTHON" not in env_vars and "PYSPARK_PYTHON" not in host.environ:
        # Workers started by this driver must import the same interpreter (and packages).
        env_vars["PYSPARK_PYTHON"] = host.python
    if target.is_local and "SPARK_LOCAL_IP" not in env_vars and "SPARK_LOCAL_IP" not in host.environ:
        env_vars["SPARK_LOCAL_IP"] = "127.0.0.1"

    defer = deferrable and cluster
    if deferrable and not cluster:
        notes.append(
            f"deferrable=True needs a cluster deploy mode (the driver of {target.master!r} runs inside "
            "spark-submit here, so the worker must wait for it); running without deferring"
        )
    if defer:
        if target.is_yarn:
            conf["spark.yarn.submit.waitAppCompletion"] = "false"
        elif target.is_k8s:
            conf["spark.kubernetes.submission.waitAppCompletion"] = "false"
        elif target.is_standalone:
            conf["spark.standalone.submit.waitAppCompletion"] = "false"

    # spark_jobs.job_logging.LOG_TIME_ENV (the job's module is not imported here): a driver that runs
    # inside spark-submit writes task log lines, which the task log stamps already.
    process_env: dict[str, str] = {} if cluster else {"SHARDYFUSION_JOB_LOG_TIME": "0"}
    if credential_env:
        if cluster:
            notes.append(
                "credentials are not forwarded: the driver runs on the cluster (deploy mode 'cluster') and "
                "passing them would put them on the spark-submit command line; give the cluster its own role"
            )
        else:
            process_env.update(credential_env)
            if not target.is_local:
                notes.append(
                    f"credentials go to the Spark driver's environment; the job hands them to executors on "
                    f"{target.master} through SparkConf spark.executorEnv.* (never argv; secrets redacted by Spark)"
                )
    if not host.binary_on_path and host.binary_next_to_python:
        # pyspark installs spark-submit next to the interpreter; a worker's PATH may not have it.
        process_env["PATH"] = os.path.dirname(host.python) + os.pathsep + host.environ.get("PATH", "")

    resources = {
        "driver_memory": spark.driver_memory, "executor_memory": spark.executor_memory,
        "executor_cores": spark.executor_cores, "num_executors": spark.num_executors,
        "total_executor_cores": spark.total_executor_cores,
    }
    return SubmitPlan(
        conn_id=target.conn_id, application=application, py_files=py_files, name=name,
        application_args=(CONFIG_ARG, encode_config(config_json)), conf=conf, env_vars=env_vars,
        archives=archives, resources=resources, defer=defer,
        wait_for_driver=target.is_standalone and cluster and not defer, cluster_mode=cluster,
        notes=tuple(notes), process_env=process_env, redact=tuple(v for v in credential_env.values() if v),
    )
