"""The job's own log: its progress lines on stderr, without noise that reads like a problem."""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = [
    "LOG_TIME_ENV",
    "configure",
]

# Set to "0" by the launcher when the driver's stderr becomes task log lines (local and client deploy
# modes): the task log stamps each line, and a second timestamp only makes the lines longer.
LOG_TIME_ENV = "SHARDYFUSION_JOB_LOG_TIME"


def configure() -> None:
    """INFO lines of the job on stderr (the task log), and no pandas-version warnings from PySpark.

    Lines read ``INFO shardyfusion.job: ...``; with a timestamp in front when nothing else stamps
    them (a driver on the cluster writes to its own log). PySpark 4 warns on each use of its
    pandas layer that pandas 3 is not fully supported; the job uses Arrow batches only
    (mapInArrow), so the warning says nothing about this run.
    """
    stamped = os.environ.get(LOG_TIME_ENV) != "0"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=("%(asctime)s " if stamped else "") + "%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
