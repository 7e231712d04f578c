"""The job's Spark session when the operator started it as a Spark Connect client.

The operator sets the Connect URL and the bundle in the environment (``core.job_environment``).
The bundle goes to the cluster with ``addArtifacts(pyfile=True)``, so the server's Python
workers import the same ``spark_jobs`` and ``core`` as this client; a packed Python environment
goes with ``archive=True`` and becomes the executors' interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from typing import Any

from airflow_provider_shardyfusion.core import job_environment as job_env
from airflow_provider_shardyfusion.core.errors import ConfigError, RunKilled

log = logging.getLogger(__name__)
DEFAULT_ARCHIVE_ALIAS = "shardyfusion_env"


def requested() -> bool:
    return bool(os.environ.get(job_env.REMOTE_URL))


def open_session() -> Any:
    """A Connect session with the bundle (and the Python environment) added and spark_conf set."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(os.environ[job_env.REMOTE_URL]).getOrCreate()
    bundle = os.environ.get(job_env.BUNDLE)
    if bundle:
        spark.addArtifacts(bundle, pyfile=True)
    archive = os.environ.get(job_env.PYTHON_ENV_ARCHIVE)
    if archive:
        path, _, alias = archive.partition("#")
        spark.addArtifacts(f"{path}#{alias or DEFAULT_ARCHIVE_ALIAS}", archive=True)
        spark.conf.set("spark.sql.execution.pyspark.python", f"{alias or DEFAULT_ARCHIVE_ALIAS}/bin/python")
    for key, value in json.loads(os.environ.get(job_env.SPARK_CONF) or "{}").items():
        try:
            spark.conf.set(key, value)
        except Exception as exc:
            detail = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ConfigError(
                f"spark_conf {key!r} cannot be set on a Spark Connect session ({detail}); static settings "
                "belong in the Connect server's own configuration"
            ) from exc
    log.info("Spark Connect session opened (server Spark %s)", spark.version)
    return spark


def stop_on_terminate(spark: Any) -> None:
    """On SIGTERM (the Airflow task was stopped): interrupt the session's queries and fail as killed."""

    def handler(signum: int, frame: Any) -> None:
        threading.Thread(target=spark.interruptAll, name="interrupt-connect-session", daemon=True).start()
        raise RunKilled("killed: the Airflow task was stopped")

    signal.signal(signal.SIGTERM, handler)
