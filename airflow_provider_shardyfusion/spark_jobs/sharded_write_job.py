"""The batch write job: ``spark-submit --py-files bundle.zip sharded_write_job.py --config-b64 <base64 JSON>``.

``sharded_write_job.py`` at the bundle's root is ``scripts/sharded_write_job.py``, which calls ``run_script``.

Exit codes: 0 written (published, or staged: ``publish=False`` or superseded by a run that started
later and is live already); 1 the write failed (error in the run record and on stderr);
2 the config was rejected before a run record existed.
"""

from __future__ import annotations

import os
import sys

from ..core.write.job_contract import JOB
from .job_entry import rejecting, run_entry

__all__ = [
    "main", "run_script",
]


def main(argv: list[str] | None = None) -> int:
    return run_entry(argv, prog="sharded_write_job", job=JOB, config_help="urlsafe base64 of the WriteConfig JSON",
                     body=_write)


def _write(config_json: str) -> None:
    from ..compat import check_pyspark_install
    from ..core.errors import SparkConnectError
    from ..core.model.config import WriteConfig
    from ..core.write.job_contract import done_line
    from ..core.write.job_environment import REMOTE_URL

    with rejecting():
        config = WriteConfig.from_json(config_json).validate()
        # Before pyspark is imported: a pyspark / pyspark-client mix may fail on import with an
        # error that names neither distribution.
        check_pyspark_install(connect_client=bool(os.environ.get(REMOTE_URL)))

    from . import connect_session, faults
    from .driver import run_write
    from .job_entry import open_session
    from .orphan_guard import exit_when_orphaned

    exit_when_orphaned()
    spark, remote = open_session(f"shardyfusion-{config.run_id}")
    if remote:
        connect_session.stop_on_terminate(spark)
    server_lost = False
    try:
        record = run_write(spark, config, faults=faults.from_environment())
        print(done_line("published" if record.published_at else "staged", config.run_id, record.manifest_ref),
              file=sys.stderr)
    except SparkConnectError:
        # Inside the job a SparkConnectError means the server was lost: its session went with it, and
        # stopping it would only retry against a server that is gone (logged retries after the verdict).
        server_lost = True
        raise
    finally:
        if remote and not server_lost:
            connect_session.stop(spark)
        else:
            spark.stop()


def run_script() -> None:
    """Run ``main`` as the application and end the process with its exit code."""
    from .job_entry import run_script as run_entry_script

    run_entry_script(main)
