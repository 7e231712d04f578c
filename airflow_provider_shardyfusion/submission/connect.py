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
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.lifecycle.write_attempts import connect_launcher
from airflow_provider_shardyfusion.core.write import job_environment as job_env
from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, SparkSettings, encode_config

__all__ = ["ConnectPlan", "build_connect_plan", "check_connect_settings"]

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

    @property
    def application(self) -> str:
        """The bundled script the child runs (its argv after the interpreter)."""
        return self.argv[1]

    @property
    def launcher(self) -> str:
        """The job's process as errors name it (no spark-submit runs with Connect)."""
        return connect_launcher(self.conn_id)


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
    ca_cert: str | None = None,
    deferrable: bool = False,
    deferrable_by_default: bool = False,
) -> ConnectPlan:
    """The child's argv and environment for one run; ``ConfigError`` for what Connect cannot do.

    ``ca_cert``: PEM of the CA the client trusts for the server's TLS certificate (the connection's
    ``ca_cert``), handed to the child in its environment.

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
    if ca_cert:
        env[job_env.CA_CERT] = ca_cert
    if spark.python_env_archive:
        env[job_env.PYTHON_ENV_ARCHIVE] = spark.python_env_archive
    secrets = [v for v in credentials.values() if v] + _url_secrets(remote_url)
    return ConnectPlan(
        conn_id=conn_id, argv=(python, application, CONFIG_ARG, encode_config(config_json)),
        notes=tuple(notes), env=env, redact=tuple(secrets),
    )


def check_connect_settings(conn_id: str, *, host: str | None, port: Any, has_token: bool,
                           extra: Mapping[str, Any]) -> None:
    """``ConfigError`` for a ``spark_connect`` connection the Connect client would silently misread.

    The apache-spark provider's URL builder drops a foreign scheme (``https://`` becomes plain-text
    ``sc://``), doubles a port given in the host and the port field, and passes any ``use_ssl`` text
    on, which pyspark reads as "no TLS" unless it is exactly ``true``: each ends in a client retrying a
    server that never answers the way it expects, for minutes, instead of in an error.
    """
    where = f"the Spark Connect connection {conn_id!r}"
    if not host or not host.strip():
        raise ConfigError(f"{where} has no host: set it to the Connect server's host name (sc://host is accepted)")
    scheme, sep, rest = host.partition("://")
    if sep and scheme != "sc":
        raise ConfigError(
            f"{where} has the host {host!r}: a Spark Connect host is a bare host name or sc://host, not "
            f"{scheme}://; for TLS set \"use_ssl\": true in the connection's extra"
        )
    parts = urlsplit(f"sc://{rest if sep else host}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"{where} has the host {host!r}: a Spark Connect host takes no path, query or fragment")
    try:
        host_port = parts.port
    except ValueError:
        raise ConfigError(f"{where} has the host {host!r}, whose port is not a number") from None
    if host_port is not None and port:
        raise ConfigError(f"{where} gives a port twice: {host_port} in the host {host!r} and {port} in the port field; "
                          "keep one")
    if port and not (isinstance(port, int) and 0 < port < 65536):
        raise ConfigError(f"{where} has the port {port!r}: a number from 1 to 65535")
    _check_tls_settings(where, has_token=has_token, hostname=parts.hostname, extra=extra)


def _check_tls_settings(where: str, *, has_token: bool, hostname: str | None, extra: Mapping[str, Any]) -> None:
    """``use_ssl``, ``ca_cert`` and the token: the combinations pyspark would read otherwise than meant."""
    use_ssl = extra.get("use_ssl")
    if use_ssl is not None and not isinstance(use_ssl, bool) and str(use_ssl).strip().lower() not in ("true", "false"):
        raise ConfigError(f"{where} has \"use_ssl\": {use_ssl!r} in its extra: it must be true or false")
    ca_cert = extra.get("ca_cert")
    if ca_cert is not None and (not isinstance(ca_cert, str) or not ca_cert.strip()):
        raise ConfigError(f"{where} has \"ca_cert\": {ca_cert!r} in its extra: it must be PEM text or the path of a "
                          "PEM file on the worker")
    if ca_cert and str(use_ssl).strip().lower() != "true":
        raise ConfigError(f"{where} has a \"ca_cert\" but not \"use_ssl\": true in its extra: the certificate is "
                          "trusted for TLS only; set use_ssl true")
    if has_token and use_ssl is not None and str(use_ssl).strip().lower() == "false" and hostname != "localhost":
        raise ConfigError(
            f"{where} has a token and \"use_ssl\": false: the Connect client sends a token only over TLS, so it "
            "would use TLS anyway; serve Connect over TLS and set use_ssl true, or remove the token"
        )


def _url_secrets(url: str) -> list[str]:
    """The token (and the whole URL, which contains it) of a Connect URL ``sc://host:port/;token=...``."""
    found = [url] if "token=" in url else []
    for part in url.split(";")[1:]:
        name, _, value = part.partition("=")
        if name == "token" and value:
            found.append(value)
    return found
