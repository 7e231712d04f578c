"""The sharded write as a Spark Connect client: a child Python process of the task.

``SparkConnectHook`` (the apache-spark provider's) turns the connection into the Connect URL;
``ShardyfusionConnectJobHook`` runs the bundled job with that URL in its environment, streams its
output (redacted) into the task log, keeps the tail for errors, and stops it on ``on_kill``. The
worker needs no Java and no spark-submit: only the ``pyspark-client`` the spark provider installs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import deque
from typing import TYPE_CHECKING

from airflow.sdk.bases.hook import BaseHook

from airflow_provider_shardyfusion.core.errors import SparkSubmitError
from airflow_provider_shardyfusion.core.secrets import redact_values

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.submission.connect import ConnectPlan

CONNECT_CONN_TYPE = "spark_connect"
OUTPUT_TAIL_LINES = 40
KILL_GRACE_SECONDS = 30.0


def is_connect_connection(conn_id: str) -> bool:
    """Whether ``conn_id`` is a Spark Connect connection (else spark-submit runs the job)."""
    return BaseHook.get_connection(conn_id).conn_type == CONNECT_CONN_TYPE


def connect_url(conn_id: str) -> str:
    """The Connect URL of ``conn_id`` as the apache-spark provider builds it (token included)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    return SparkConnectHook(conn_id=conn_id).get_connection_url()


class ShardyfusionConnectJobHook(BaseHook):
    """Run the job of a ``ConnectPlan`` as a child process; the interface of the spark-submit hook
    the operator uses (``submit``, ``on_kill``, ``tail_text``).

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
        """Run the child to its end; ``SparkSubmitError`` with its exit code if it failed."""
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
            raise SparkSubmitError(
                f"the Spark Connect job (connection {self.plan.conn_id!r}) exited with code {code}"
            )

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
