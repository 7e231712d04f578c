"""The Spark Connect plan of a sharded write: the job as a Connect client in a child process.

With a ``spark_connect`` connection the worker needs neither Java nor spark-submit: the bundled
application runs as a Python child of the task (killable, its output captured), talks to the
Connect server at the connection's URL, and ships the bundle to the cluster with
``addArtifacts``. A pure function of the arguments, like ``submission.plan``; no Airflow import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_shardyfusion.core import job_environment as job_env
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, SparkSettings, encode_config

# Cluster resources belong to the Connect server (it owns its executors); a client cannot size them.
_SERVER_SIDE = ("driver_memory", "executor_memory", "executor_cores", "num_executors", "total_executor_cores")


@dataclass(frozen=True)
class ConnectPlan:
    """The child process that runs the job as a Spark Connect client."""

    conn_id: str
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    # The Connect URL (may carry a token) and storage credentials: environment only, never shown.
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    redact: tuple[str, ...] = field(default=(), repr=False)
    # The waiting policy, as in ``SubmitPlan``: the client is the driver's side and lives in the task.
    defer: bool = False
    cluster_mode: bool = False
    wait_for_driver: bool = False


def build_connect_plan(
    *,
    conn_id: str,
    remote_url: str,
    spark: SparkSettings,
    python: str,
    application: str,
    bundle_zip: str,
    config_json: str,
    credential_env: Mapping[str, str] | None = None,
    deferrable: bool = False,
    deferrable_by_default: bool = False,
) -> ConnectPlan:
    """The child's argv and environment for one run; ``ConfigError`` for what Connect cannot do.

    ``deferrable_by_default``: the deployment sets ``[operators] default_deferrable``, so
    ``deferrable=True`` may be its default rather than the DAG's choice: the run then waits in the
    task with a note instead of failing every Connect write of that deployment.
    """
    spark = spark.validate()
    notes = []
    if deferrable and deferrable_by_default:
        notes.append(f"[operators] default_deferrable is ignored with the Spark Connect connection {conn_id!r}: "
                     "the job runs as a Connect client inside this task, which waits for it")
    elif deferrable:
        raise ConfigError(
            f"deferrable=True cannot be used with the Spark Connect connection {conn_id!r}: the job runs as a "
            "Connect client inside this task, and the client must stay alive while the cluster writes. "
            "Set deferrable=False (the write still runs on the cluster)"
        )
    if spark.env_vars:
        raise ConfigError(
            f"spark_env_vars cannot be used with the Spark Connect connection {conn_id!r}: the Connect server's "
            "executors already run; set their environment on the server (spark.executorEnv.* in its conf)"
        )
    archive = spark.python_env_archive
    if archive and "://" in archive and not archive.startswith("file://"):
        raise ConfigError(
            f"python_env_archive {archive!r} must be a file on this worker with the Spark Connect connection "
            f"{conn_id!r}: the client uploads it with addArtifacts(archive=True); a cluster-side URI belongs in "
            "the Connect server's own configuration (spark.archives)"
        )
    notes += [f"{name} is ignored with the Spark Connect connection {conn_id!r}: the Connect server sizes its own "
             "executors" for name in _SERVER_SIDE if getattr(spark, name) is not None]
    credentials = dict(credential_env or {})
    # PYTHONPATH: the child imports the job from the very bundle the executors get.
    env = {job_env.REMOTE_URL: remote_url, job_env.BUNDLE: bundle_zip, "PYTHONPATH": bundle_zip, **credentials}
    if spark.conf:
        env[job_env.SPARK_CONF] = json.dumps({k: str(v) for k, v in spark.conf.items()})
    if spark.python_env_archive:
        env[job_env.PYTHON_ENV_ARCHIVE] = spark.python_env_archive
    secrets = [v for v in credentials.values() if v] + _url_secrets(remote_url)
    return ConnectPlan(
        conn_id=conn_id, argv=(python, application, CONFIG_ARG, encode_config(config_json)),
        notes=tuple(notes), env=env, redact=tuple(secrets),
    )


def _url_secrets(url: str) -> list[str]:
    """The token (and the whole URL, which contains it) of a Connect URL ``sc://host:port/;token=...``."""
    found = [url] if "token=" in url else []
    for part in url.split(";")[1:]:
        name, _, value = part.partition("=")
        if name == "token" and value:
            found.append(value)
    return found
