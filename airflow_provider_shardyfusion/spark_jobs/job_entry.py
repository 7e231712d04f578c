"""The one exit policy of the job's entry scripts (the batch write and the streaming query).

Exit codes, for both: ``DONE`` (0) the job did what it was asked; ``FAILED`` (1) it started and
failed; ``REJECTED`` (2) it never started: the config, the pyspark installation or the Spark session
was refused. A failure is one ``failed_line`` on stderr (``core.write.job_contract``), which the
operator reads back. Nothing here imports pyspark: an entry script checks the installation first.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..core.write.job_contract import failed_line

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "DONE", "FAILED", "REJECTED", "Failed", "Rejected", "open_session", "rejecting", "run_entry", "run_script",
]

DONE, FAILED, REJECTED = 0, 1, 2

_FORWARDED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


class Rejected(Exception):
    """The job did not start (exit 2): ``error_type`` and ``message`` make its failure line."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type, self.message = error_type, message


class Failed(Exception):
    """The job started and failed (exit 1) with a verdict already worded (``error_type``, ``message``)."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type, self.message = error_type, message


@contextmanager
def rejecting() -> Iterator[None]:
    """Inside: a provider error or a ``ValueError`` (bad base64, bad JSON, a bad setting) rejects the job."""
    from ..core.errors import ShardyfusionError

    try:
        yield
    except (ShardyfusionError, ValueError) as exc:
        raise Rejected(type(exc).__name__, str(exc)) from exc


def open_session(app_name: str) -> tuple[Any, bool]:
    """The job's Spark session and whether it is a Spark Connect one; ``Rejected`` if it cannot be opened
    (no run record exists yet, e.g. the Connect server cannot be reached)."""
    from . import connect_session
    from .errors import one_line, translate

    remote = connect_session.requested()
    try:
        return (connect_session.open_session() if remote else _classic_session(app_name)), remote
    except Exception as exc:
        failed = translate(exc)
        raise Rejected(type(failed).__name__, f"could not open the Spark session: {one_line(str(failed))}") from exc


def _classic_session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for name in _FORWARDED_ENV:
        if os.environ.get(name):
            # Cluster executors do not inherit the driver's environment. SparkConf keeps the values
            # off argv, and Spark's default redaction hides the secret ones in UI and event logs.
            builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    return builder.getOrCreate()


def run_entry(argv: list[str] | None, *, prog: str, job: str, config_help: str, body: Callable[[str], None]) -> int:
    """Parse ``--config-b64``, set up logging and run ``body`` on the decoded JSON; its exit code.

    ``body`` returns when the job is done; it raises ``Rejected`` (``rejecting`` makes one) before the
    job started, ``Failed`` with a worded verdict, or any other exception once it started.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config-b64", required=True, help=config_help)
    args = parser.parse_args(argv)
    from . import job_logging
    from .errors import one_line

    job_logging.configure()
    try:
        with rejecting():
            config_json = base64.urlsafe_b64decode(args.config_b64.encode()).decode()
        body(config_json)
    except (Rejected, Failed) as exc:
        print(failed_line(exc.error_type, one_line(exc.message), job=job), file=sys.stderr)
        return REJECTED if isinstance(exc, Rejected) else FAILED
    except Exception as exc:
        print(failed_line(type(exc).__name__, one_line(str(exc)), job=job), file=sys.stderr)
        return FAILED
    return DONE


def run_script(main: Callable[[], int]) -> None:
    """Run an entry's ``main`` as the application and end the process with its exit code."""
    code = main()
    # The verdict is printed: exit now. A Connect client's exit-time cleanup (RPCs to a server that
    # may be gone, gRPC's threads) could otherwise keep this process alive for minutes after it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
