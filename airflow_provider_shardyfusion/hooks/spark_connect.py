"""The sharded write as a Spark Connect client: a child Python process of the task.

``SparkConnectHook`` (the apache-spark provider's) turns the connection into the Connect URL;
``ShardyfusionConnectJobHook`` runs the bundled job with that URL in its environment, streams its
output (redacted) into the task log, keeps the tail for errors, and stops it on ``on_kill``. The
worker needs no Java and no spark-submit: only the ``pyspark-client`` the spark provider installs.

Before the job starts, ``check_connect_server`` asks the server its Spark version with a short
deadline: the pyspark client itself retries an unreachable server for about ten minutes in silence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
import warnings
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.hook import BaseHook

from airflow_provider_shardyfusion.core.errors import ConfigError, SparkConnectError
from airflow_provider_shardyfusion.core.secrets import redact_values

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.submission.connect import ConnectPlan

__all__ = [
    "CONNECT_CONN_TYPE", "KILL_GRACE_SECONDS", "OUTPUT_TAIL_LINES", "PLAINTEXT_PROBE_SECONDS", "PREFLIGHT_TIMEOUT_SECONDS",
    "ShardyfusionConnectJobHook", "check_connect_server", "connect_ca_cert", "connect_url", "is_connect_connection",
]

CONNECT_CONN_TYPE = "spark_connect"
OUTPUT_TAIL_LINES = 40
KILL_GRACE_SECONDS = 30.0
PREFLIGHT_TIMEOUT_SECONDS = 10.0
# A server that completes an HTTP/2 handshake in plain text within this time speaks no TLS.
PLAINTEXT_PROBE_SECONDS = 3.0


def is_connect_connection(conn_id: str) -> bool:
    """Whether ``conn_id`` is a Spark Connect connection (else spark-submit runs the job)."""
    return BaseHook.get_connection(conn_id).conn_type == CONNECT_CONN_TYPE


def connect_url(conn_id: str) -> str:
    """The Connect URL of ``conn_id`` as the apache-spark provider builds it (token included), after
    ``check_connect_settings`` refused what that builder would silently misread."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from airflow_provider_shardyfusion.submission.connect import check_connect_settings

    conn = BaseHook.get_connection(conn_id)
    check_connect_settings(conn_id, host=conn.host, port=conn.port, has_token=bool(conn.password),
                           extra=conn.extra_dejson)
    return SparkConnectHook(conn_id=conn_id).get_connection_url()


def connect_ca_cert(conn_id: str) -> str | None:
    """The PEM of the connection's ``ca_cert`` extra (PEM text, or the path of a PEM file on the
    worker): the CA the client trusts for the server's TLS certificate; None without one."""
    value = BaseHook.get_connection(conn_id).extra_dejson.get("ca_cert")
    if not value:
        return None
    text = str(value)
    if "-----BEGIN" not in text:
        try:
            text = Path(text).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"the Spark Connect connection {conn_id!r} has \"ca_cert\": {value!r}, which is not PEM "
                              f"text and cannot be read as a file on this worker ({exc.__class__.__name__})") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(f"the Spark Connect connection {conn_id!r} has a \"ca_cert\" without a PEM certificate "
                          "(-----BEGIN CERTIFICATE-----)")
    return text


def check_connect_server(conn_id: str, url: str, timeout: float = PREFLIGHT_TIMEOUT_SECONDS, *,
                         ca_cert: str | None = None) -> str:
    """The server's Spark version, asked over the channel the job will use, within ``timeout``.

    ``SparkConnectError`` naming the connection, ``host:port`` and the gRPC status and details when
    it does not answer; ``ConfigError`` when the connection asks for TLS (a token or ``use_ssl``) and
    the server speaks plain text, when the server refuses the token, and when its TLS certificate is
    not one this worker trusts (``ca_cert``: the connection's CA, PEM).
    """
    import grpc

    with warnings.catch_warnings():
        # pyspark's Connect modules warn on import that pandas 3 is not fully supported; this check
        # uses no pandas, and the warning would be noise in every Connect task's log.
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc

        from airflow_provider_shardyfusion.spark_jobs.connect_channel import channel_builder

    builder = channel_builder(url, ca_cert=ca_cert)
    # A fresh session id, released after: the check leaves no session behind on the server.
    user = base_pb2.UserContext(user_id=builder.userId or os.environ.get("USER") or "shardyfusion")
    session = str(uuid.uuid4())
    with builder.toChannel() as channel:
        stub = base_pb2_grpc.SparkConnectServiceStub(channel)
        try:
            answer = stub.AnalyzePlan(
                base_pb2.AnalyzePlanRequest(session_id=session, user_context=user,
                                            spark_version=base_pb2.AnalyzePlanRequest.SparkVersion()),
                timeout=timeout, metadata=builder.metadata())
        except grpc.RpcError as exc:
            status = f"gRPC {exc.code().name}: {exc.details()}"
            _raise_if_refused(conn_id, builder.endpoint, exc, status)
            if builder.secure and _speaks_plain_text(builder.endpoint):
                raise ConfigError(
                    f"the Spark Connect connection {conn_id!r} asks for TLS (it has a token or use_ssl true), but "
                    f"the server at {builder.endpoint} speaks plain text ({status}); serve Connect over TLS, or "
                    "remove the token and use_ssl"
                ) from None
            # A refused connection is an answer (nothing listens there), not a wait that ran out.
            refused = "connection refused" in (exc.details() or "").lower()
            what = "refused the connection" if refused else f"did not answer within {timeout:g}s"
            raise SparkConnectError(
                f"the Spark Connect server of connection {conn_id!r} at {builder.endpoint} {what} ({status}); nothing "
                "was written. Check that the server runs and that the connection's host, port and TLS settings are "
                "the server's"
            ) from None
        # The server drops idle sessions on its own; the answer above is what counted.
        with contextlib.suppress(grpc.RpcError):
            stub.ReleaseSession(base_pb2.ReleaseSessionRequest(session_id=session, user_context=user),
                                timeout=timeout, metadata=builder.metadata())
    return answer.spark_version.version


def _raise_if_refused(conn_id: str, endpoint: str, exc: Any, status: str) -> None:
    """``ConfigError`` when the server answered but refused the connection's token or the worker
    refused the server's certificate: settings to fix, which no retry changes."""
    import grpc

    where = f"the Spark Connect server of connection {conn_id!r} at {endpoint}"
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        raise ConfigError(
            f"{where} refused the connection's token ({status}); nothing was written. Set the connection's "
            "password (Token) to the server's spark.connect.authenticate.token"
        ) from None
    # A plain-text server fails the handshake with WRONG_VERSION_NUMBER (and "Invalid certificate
    # verification context: OK"): the caller's probe names that case.
    details = (exc.details() or "").lower()
    if "certificate_verify_failed" in details or "peer certificate" in details:
        raise ConfigError(
            f"{where} has a TLS certificate this worker does not trust ({status}); nothing was written. Set "
            "\"ca_cert\" in the connection's extra to the CA (PEM, or a PEM file's path) that signed the server's "
            "certificate, and check that the connection's host is a name in it"
        ) from None


def _speaks_plain_text(endpoint: str) -> bool:
    import grpc

    with grpc.insecure_channel(endpoint) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=PLAINTEXT_PROBE_SECONDS)
        except grpc.FutureTimeoutError:
            return False
    return True


class ShardyfusionConnectJobHook(BaseHook):
    """Run the job of a ``ConnectPlan`` as a child process; a ``submission.launcher.SparkJobLauncher``
    (as the spark-submit hook is).

    :param plan: argv and environment of the child (``submission.connect.build_connect_plan``).
    """

    def __init__(self, plan: ConnectPlan):
        super().__init__()
        self.plan = plan
        self.output_tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
        self._proc: subprocess.Popen[str] | None = None

    def redacted(self, text: str) -> str:
        return redact_values(text, self.plan.redact)

    def tail_text(self) -> str:
        return "\n".join(self.output_tail)

    def submit(self, application: str = "") -> None:
        """Run the child to its end; ``SparkConnectError`` with its exit code if it failed.
        ``application`` is already in the plan's argv."""
        self._proc = proc = subprocess.Popen(
            list(self.plan.argv), env={**os.environ, **self.plan.env}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
        )
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = self.redacted(raw.rstrip("\n"))
            self.output_tail.append(line)
            self.log.info("%s", line)
        code = proc.wait()
        if code != 0:
            # The operator names the job and the connection around this (``plan.launcher``).
            signal_name = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
            raise SparkConnectError(f"exited with code {code}{signal_name}")

    def is_running(self) -> bool:
        """Whether the child this hook started is still running."""
        return self._proc is not None and self._proc.poll() is None

    def on_kill(self) -> None:
        """SIGTERM: the job interrupts its Connect session's queries and marks the run killed."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.log.warning("The Spark Connect job did not stop within %ss; killing it", KILL_GRACE_SECONDS)
            proc.kill()
