"""The batch write job: ``spark-submit --py-files bundle.zip sharded_write_job.py --config-b64 <base64 JSON>``.

``sharded_write_job.py`` at the bundle's root is ``scripts/sharded_write_job.py``, which calls ``run_script``.

Exit codes: 0 written (published, or staged: ``publish=False`` or superseded by a run that started
later and is live already); 1 the write failed (error in the run record and on stderr);
2 the config was rejected before a run record existed.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import sys

__all__ = [
    "main", "run_script",
]

_FORWARDED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sharded_write_job")
    parser.add_argument("--config-b64", required=True, help="urlsafe base64 of the WriteConfig JSON")
    args = parser.parse_args(argv)
    from . import job_logging

    job_logging.configure()

    from ..core.errors import ShardyfusionError, SparkConnectError
    from ..core.model.config import WriteConfig
    from ..core.write.job_contract import done_line, failed_line

    try:
        config = WriteConfig.from_json(base64.urlsafe_b64decode(args.config_b64.encode()).decode()).validate()
    except (ShardyfusionError, ValueError) as exc:
        print(failed_line(type(exc).__name__, str(exc)), file=sys.stderr)
        return 2

    from ..compat import check_pyspark_install
    from ..core.write.job_environment import REMOTE_URL

    try:
        # Before pyspark is imported: a pyspark / pyspark-client mix may fail on import with an
        # error that names neither distribution.
        check_pyspark_install(connect_client=bool(os.environ.get(REMOTE_URL)))
    except ShardyfusionError as exc:
        print(failed_line(type(exc).__name__, str(exc)), file=sys.stderr)
        return 2

    from . import connect_session, faults
    from .driver import run_write
    from .errors import one_line, translate
    from .orphan_guard import exit_when_orphaned

    exit_when_orphaned()
    remote = connect_session.requested()
    try:
        spark = connect_session.open_session() if remote else _classic_session(config.run_id)
    except Exception as exc:  # e.g. the Connect server cannot be reached: no run record exists yet
        failed = translate(exc)
        print(failed_line(type(failed).__name__, f"could not open the Spark session: {one_line(str(failed))}"),
              file=sys.stderr)
        return 2
    if remote:
        connect_session.stop_on_terminate(spark)
    server_lost = False
    try:
        record = run_write(spark, config, faults=faults.from_environment())
        print(done_line("published" if record.get("published_at") else "staged", config.run_id,
                        record.get("manifest_ref")), file=sys.stderr)
        return 0
    except Exception as exc:
        # Inside the job a SparkConnectError means the server was lost: its session went with it, and
        # stopping it would only retry against a server that is gone (logged retries after the verdict).
        server_lost = isinstance(exc, SparkConnectError)
        print(failed_line(type(exc).__name__, one_line(str(exc))), file=sys.stderr)
        return 1
    finally:
        if remote and not server_lost:
            connect_session.stop(spark)
        else:
            spark.stop()


def _classic_session(run_id: str):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"shardyfusion-{run_id}")
    for name in _FORWARDED_ENV:
        if os.environ.get(name):
            # Cluster executors do not inherit the driver's environment. SparkConf keeps the values
            # off argv, and Spark's default redaction hides the secret ones in UI and event logs.
            builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    return builder.getOrCreate()


def run_script() -> None:
    """Run ``main`` as the application and end the process with its exit code."""
    code = main()
    # The verdict is printed: exit now. A Connect client's exit-time cleanup (RPCs to a server that
    # may be gone, gRPC's threads) could otherwise keep this process alive for minutes after it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
