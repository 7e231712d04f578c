"""``ShardyfusionSparkSubmitHook``: the apache-spark provider's ``SparkSubmitHook`` with a
process-only environment and a redacted output tail.

Private touch points on the apache-spark provider (checked against 6.x; each is the only way to
get the behaviour, and each is exercised by tests/unit/test_sharded_write_operator.py and the
integration tests, so a provider change that breaks one fails the suite):

- ``SparkSubmitHook._connection`` (read, ``resolve_spark_connection``): master, deploy mode and
  binary as the provider resolves them from the connection (host vs. conn type, extras). There is
  no public accessor, and copying the parsing would drift from the provider's.
- ``_build_spark_common_args`` (override) writing ``_env``: the only way to give the spark-submit
  process environment variables that never become arguments. The public ``env_vars`` turn into
  ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` on YARN and
  Kubernetes (even in client mode), which would put credentials in argv; ``submit(env=...)`` is
  overwritten by the provider whenever ``env_vars`` apply to the process.
- ``_process_spark_submit_log`` (override, calls the original): tees each output line into our
  redacted tail. The provider's own tail (``_last_submit_log_lines``) is private as well and
  only reaches us inside an exception text.
- ``_start_driver_status_tracking()`` and ``_driver_status`` (standalone cluster mode only,
  ``submit`` with ``wait_for_driver``): waiting for a driver the standalone master runs; the
  provider's own ``SparkSubmitOperator`` uses the same two.
- ``_submit_sp`` (read, ``is_running``): the spark-submit process, so that
  ``StreamingSnapshotOperator.on_kill`` lets a gracefully stopped job exit before killing it.
- The exit code of a failed spark-submit is only in the text of the provider's exception
  (``Error code is: N``); ``core.lifecycle.write_attempts.short_submit_error`` reads it from there.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_shardyfusion.core.errors import SparkSubmitError
from airflow_provider_shardyfusion.core.secrets import redact_values
from airflow_provider_shardyfusion.submission.plan import SparkTarget

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["OUTPUT_TAIL_LINES", "ShardyfusionSparkSubmitHook", "resolve_spark_connection"]

OUTPUT_TAIL_LINES = 40


def resolve_spark_connection(conn_id: str) -> SparkTarget:
    """The connection as the spark provider reads it (the provider owns that parsing)."""
    resolved = SparkSubmitHook(conn_id=conn_id)._connection
    return SparkTarget(
        conn_id=conn_id, master=str(resolved.get("master") or ""), deploy_mode=resolved.get("deploy_mode"),
        spark_binary=str(resolved.get("spark_binary") or "spark-submit"),
    )


class ShardyfusionSparkSubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` that keeps the last lines of spark-submit output and a process-only env;
    a ``submission.launcher.SparkJobLauncher``.

    :param process_env: variables set on the local spark-submit process only. Unlike ``env_vars``
        they never turn into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``
        arguments, so credentials cannot reach argv (or the Spark UI's environment page).
    :param redact: strings replaced by ``***`` in the kept output tail (the credentials' values).
    :param wait_for_driver: standalone cluster mode: ``submit`` also waits for the driver the master
        runs, and fails unless it finished.
    All other arguments are the apache-spark provider's ``SparkSubmitHook`` arguments.
    """

    def __init__(self, *args: Any, process_env: Mapping[str, str] | None = None,
                 redact: Sequence[str] = (), wait_for_driver: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Each line of the job's output is logged under this name: "airflow.task.hooks.shardyfusion",
        # not the ~90 characters of the module and class path on every line.
        self._logger_name = "shardyfusion"
        self.process_env = dict(process_env or {})
        self.wait_for_driver = wait_for_driver
        self._redact = [s for s in redact if s]
        self.output_tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)

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
        return redact_values(text, self._redact)

    def tail_text(self) -> str:
        return "\n".join(self.output_tail)

    def is_running(self) -> bool:
        """Whether the spark-submit process this hook started is still running (``_submit_sp``)."""
        process = getattr(self, "_submit_sp", None)
        return process is not None and process.poll() is None

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        """The provider's ``submit``; with ``wait_for_driver``, then block until the standalone master
        reports the driver final, and ``SparkSubmitError`` unless it finished."""
        result = super().submit(application, **kwargs)
        if self.wait_for_driver:
            self._start_driver_status_tracking()
            if self._driver_status != "FINISHED":
                raise SparkSubmitError(f"the Spark driver ended as {self._driver_status}")
        return result
