"""``SparkJobLauncher``: what an operator needs of the process that runs its Spark job.

Two hooks implement it: ``hooks.spark_submit.ShardyfusionSparkSubmitHook`` (spark-submit, the
apache-spark provider's hook) and ``hooks.spark_connect.ShardyfusionConnectJobHook`` (a Spark
Connect client in a child process). ``operators.spark_job`` chooses one per try from the
connection's type and then only speaks this protocol. No Airflow import.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SparkJobLauncher"]


class SparkJobLauncher(Protocol):
    """A started-on-demand Spark job: run it, ask whether it still runs, read its output, stop it."""

    def submit(self, application: str = "") -> object:
        """Run ``application`` until the job ends (or, deferring, until the cluster took it); raises
        when it failed. The result, if any, is not used."""
        ...

    def is_running(self) -> bool:
        """Whether the process this launcher started is still running."""
        ...

    def tail_text(self) -> str:
        """The last lines of the job's output, credentials redacted."""
        ...

    def on_kill(self) -> None:
        """Stop the job (the task was stopped)."""
        ...
