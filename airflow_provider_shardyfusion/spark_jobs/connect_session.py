"""The job's Spark session when the operator started it as a Spark Connect client.

The operator sets the Connect URL and the bundle in the environment (``core.write.job_environment``).
The bundle goes to the cluster with ``addArtifacts(pyfile=True)``, so the server's Python
workers import the same ``spark_jobs`` and ``core`` as this client; a packed Python environment
goes with ``archive=True`` and becomes the executors' interpreter.

pyspark's own client retries an unreachable server for about ten minutes without a word, and its
exit-time cleanup retries again. Here the retries are bounded (``RETRY_*``, each one logged), HTTP/2
keep-alive pings notice a server that vanished without closing the connection, and once the
retries are spent the server counts as gone: later calls (restoring conf, releasing the session)
fail at once instead of waiting again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from ..core.errors import ConfigError, RunKilled
from ..core.write import job_environment as job_env
from .connect_channel import channel_builder
from .errors import describe_rpc_error

__all__ = [
    "DEFAULT_ARCHIVE_ALIAS", "KEEPALIVE_OPTIONS", "RETRY_INITIAL_MS", "RETRY_MAX", "RETRY_MAX_BACKOFF_MS",
    "STOP_WAIT_SECONDS", "open_session", "requested", "retry_policy", "stop", "stop_on_terminate",
]

log = logging.getLogger(__name__)
DEFAULT_ARCHIVE_ALIAS = "shardyfusion_env"
# Waits of 1, 2, 4, 8, 8 s: a server restart or a network blip is ridden out, a dead server is
# reported within half a minute.
RETRY_MAX = 5
RETRY_INITIAL_MS = 1000
RETRY_MAX_BACKOFF_MS = 8000
# A ping after 20 s without traffic, answered within 15 s; gRPC sends at most two pings between
# data frames, which stays within what a Java gRPC server tolerates without answering GOAWAY.
KEEPALIVE_OPTIONS = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 15_000)]
STOP_WAIT_SECONDS = 10.0


def requested() -> bool:
    return bool(os.environ.get(job_env.REMOTE_URL))


def retry_policy() -> Any:
    """pyspark's default policy (which errors are retried) with a bounded, logged budget."""
    from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState

    class BoundedPolicy(DefaultPolicy):
        def __init__(self) -> None:
            super().__init__(max_retries=RETRY_MAX, initial_backoff=RETRY_INITIAL_MS, backoff_multiplier=2.0,
                             max_backoff=RETRY_MAX_BACKOFF_MS, max_server_retry_delay=RETRY_MAX_BACKOFF_MS)
            self.gone_since: float | None = None

        def can_retry(self, exception: BaseException) -> bool:
            return self.gone_since is None and super().can_retry(exception)

        def to_state(self) -> RetryPolicyState:
            return LoggedState(self)

    class LoggedState(RetryPolicyState):
        def __init__(self, policy: BoundedPolicy) -> None:
            super().__init__(policy)
            self.retries = 0
            self.started = time.monotonic()

        def next_attempt(self, exception: BaseException | None = None) -> int | None:
            wait = super().next_attempt(exception)
            cause = (describe_rpc_error(exception) or repr(exception)) if exception is not None else "no error"
            if wait is None:
                self.policy.gone_since = time.monotonic()  # type: ignore[attr-defined]
                log.error("Spark Connect server gone: no answer after %d retries over %.1fs (%s)", self.retries,
                          time.monotonic() - self.started, cause)
            else:
                self.retries += 1
                log.warning("Spark Connect server did not answer (%s); retry %d of %d in %.1fs", cause, self.retries,
                            RETRY_MAX, wait / 1000)
            return wait

    return BoundedPolicy()


def open_session() -> Any:
    """A Connect session with the bundle (and the Python environment) added and spark_conf set."""
    from pyspark.sql.connect.session import SparkSession

    # What pyspark's own builder sets on its way to a remote session (its function dispatch reads it).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = channel_builder(os.environ[job_env.REMOTE_URL], ca_cert=os.environ.get(job_env.CA_CERT),
                              options=KEEPALIVE_OPTIONS)
    spark = SparkSession.builder.channelBuilder(builder).getOrCreate()
    spark._client.set_retry_policies([retry_policy()])
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


def stop(spark: Any) -> None:
    """Stop the session, waiting at most ``STOP_WAIT_SECONDS``: the verdict is out already, and a gone
    server must not hold the job's exit."""
    stopper = threading.Thread(target=spark.stop, name="stop-connect-session", daemon=True)
    stopper.start()
    stopper.join(STOP_WAIT_SECONDS)
    if stopper.is_alive():
        log.warning("the Spark Connect session did not stop within %ss; exiting without it", STOP_WAIT_SECONDS)


def stop_on_terminate(spark: Any) -> None:
    """On SIGTERM (the Airflow task was stopped): interrupt the session's queries and fail as killed."""

    def handler(signum: int, frame: Any) -> None:
        threading.Thread(target=spark.interruptAll, name="interrupt-connect-session", daemon=True).start()
        raise RunKilled("killed: the Airflow task was stopped")

    signal.signal(signal.SIGTERM, handler)
