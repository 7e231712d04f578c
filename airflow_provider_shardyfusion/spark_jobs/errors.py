"""Turn a failed Spark action back into the provider error raised inside the task."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NoReturn

from ..core.errors import (
    ShardWriteError,
    ShardyfusionError,
    SparkConnectError,
    SparkSubmitError,
    error_type_by_name,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "WORKER_CRASHED", "connect_server_gone", "connect_server_lost", "describe_rpc_error", "error_line", "one_line",
    "raise_translated", "translate",
]

_ERROR_LINE = re.compile(r"airflow_provider_shardyfusion\.core\.errors\.(\w+): ([^\n]*)")


def error_line(exc: ShardyfusionError) -> str:
    """``exc`` as the one line ``translate`` finds in a Spark failure (for errors raised by JVM expressions)."""
    return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"


# An error raised by a Spark expression (raise_error, in JVM routing) carries this suffix on its line.
_SQLSTATE_SUFFIX = re.compile(r" SQLSTATE: \w+$")
# Spark's text when a Python worker's connection ends without a result: the process died
# (SIGKILL from the kernel's out-of-memory killer, a signal, a segfault in native code).
WORKER_CRASHED = "Python worker exited unexpectedly"
_FAILED_TASK = re.compile(r"Task (\d+) in stage (\d+)\.\d+ failed (\d+) times")
_TASK_TRACE = re.compile(r"most recent failure:(.*?)(?:Driver stacktrace:|$)", re.S)


def one_line(text: str) -> str:
    """``text`` on one line: the task finds the job's verdict as one line of its output, and the cause of
    a multi-line error (a gRPC status, its details) must not be cut off after the first."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def describe_rpc_error(exc: BaseException) -> str | None:
    """``gRPC STATUS: details`` of a gRPC error, or ``None`` for anything else (no grpc import: a
    classic job may not have it)."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not type(exc).__module__.startswith("grpc") or not callable(code) or not callable(details):
        return None
    status = code()
    return f"gRPC {getattr(status, 'name', status)}: {details()}"


def connect_server_gone(exc: BaseException) -> str | None:
    """The gRPC status when ``exc`` (or an error it was raised from) says the Connect server is unreachable."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = describe_rpc_error(current)
        if status is not None and status.startswith("gRPC UNAVAILABLE"):
            return status
        current = current.__cause__ or current.__context__
    return None


# What a Connect server answers for a query in flight while it is being stopped (SIGTERM: its shutdown
# hook stops the SparkContext): "(java.lang.IllegalStateException) Cannot call methods on a stopped
# SparkContext." followed by three JVM traces, or the scheduler's "Job 3 cancelled because
# SparkContext was shut down" / "SparkContext has been shutdown".
_CONTEXT_STOPPED = re.compile(r"stopped SparkContext|SparkContext was shut down|SparkContext has been shutdown")


def connect_server_lost(exc: BaseException) -> str | None:
    """How the Connect server was lost under ``exc`` (or an error it was raised from), to follow "the
    Spark Connect server": it stopped answering (the gRPC status), or it was stopped (the first line
    of its answer, without the JVM traces); ``None`` when ``exc`` says neither."""
    gone = connect_server_gone(exc)
    if gone is not None:
        return f"stopped answering and did not come back within the client's retries ({gone})"
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # Only a Connect client's error: a classic job's stopped context is its own JVM going away.
        if type(current).__module__.startswith("pyspark.errors.exceptions.connect"):
            text = str(current)
            if _CONTEXT_STOPPED.search(text):
                first = next((line.strip() for line in text.splitlines() if line.strip()), text)
                return f"was stopped while the job ran (server lost mid-write: {first})"
        current = current.__cause__ or current.__context__
    return None


def translate(exc: BaseException, *, shards_of_task: Callable[[int], range] | None = None) -> BaseException:
    """The provider error behind a Spark failure, or ``exc`` unchanged.

    ``shards_of_task``: for the shard-writing action, the shard ids a task (partition) writes, so a
    dead Python worker's error names its shards.
    """
    if isinstance(exc, ShardyfusionError):
        return exc
    text = str(exc)
    match = _ERROR_LINE.search(text)
    if match:
        return error_type_by_name(match.group(1))(_SQLSTATE_SUFFIX.sub("", match.group(2)))
    if WORKER_CRASHED in text:
        return _worker_died(text, shards_of_task)
    lost = connect_server_lost(exc)
    if lost is not None:
        return SparkConnectError(
            f"the Spark Connect server {lost}; nothing was published. Run the write again once the server is back"
        )
    if _jvm_gone(exc):
        return SparkSubmitError(
            f"the Spark JVM this Python driver talks to (spark-submit's process) is gone: it was killed or crashed "
            f"while the write ran ({type(exc).__name__}: {exc}); nothing was published. Run the write again; if the "
            "JVM ran out of memory, give it more (spark.driver.memory)"
        )
    return exc


def raise_translated(exc: BaseException, *, shards_of_task: Callable[[int], range] | None = None) -> NoReturn:
    """Raise ``translate(exc)`` with ``exc`` as its cause (``exc`` itself keeps its own cause)."""
    translated = translate(exc, shards_of_task=shards_of_task)
    if translated is exc:
        raise exc
    raise translated from exc


def _jvm_gone(exc: BaseException) -> bool:
    """A lost Py4J connection: the driver JVM died under us (a raw ConnectionRefusedError otherwise)."""
    if not isinstance(exc, (ConnectionError, EOFError)) and not type(exc).__module__.startswith("py4j"):
        return False
    if type(exc).__name__ == "Py4JNetworkError":
        return True
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("py4j."):
            return True
        tb = tb.tb_next
    return False


def _worker_died(text: str, shards_of_task: Callable[[int], range] | None) -> ShardWriteError:
    failed = _FAILED_TASK.search(text)
    if failed is None:
        where, tries = "in a Spark task", ""
    else:
        task, stage, times = (int(g) for g in failed.groups())
        trace = _TASK_TRACE.search(text)
        # The writing tasks are the action's result tasks; a shuffle-map task reads and routes input rows.
        if shards_of_task is not None and trace is not None and "ResultTask" in trace.group(1):
            ids = shards_of_task(task)
            what = f"shard {ids.start}" if len(ids) == 1 else f"shards {ids.start}..{ids.stop - 1}"
            where = f"while writing {what} (task {task} of Spark stage {stage})"
        else:
            where = f"in task {task} of Spark stage {stage}"
        tries = f"; Spark gave up after {times} failed attempt(s) of that task"
    return ShardWriteError(
        f"a Spark Python worker died {where}: it exited unexpectedly, most likely killed by the operating "
        f"system's out-of-memory killer or by a signal{tries}; nothing was published. Let Spark retry the task "
        "(raise spark.task.maxFailures; in local mode the master local[N,F]) and, if memory ran out, give the "
        "Python workers more memory (spark.executor.memory, spark.executor.memoryOverhead, "
        "spark.executor.pyspark.memory) or lower sort_run_rows / batch_size"
    )
