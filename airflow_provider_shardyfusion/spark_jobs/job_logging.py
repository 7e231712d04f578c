"""The job's own log: its progress lines on stderr, without noise that reads like a problem."""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = [
    "configure",
]


def configure() -> None:
    """INFO lines of the job on stderr (the task log), and no pandas-version warnings from PySpark.

    PySpark 4 warns on each use of its pandas layer that pandas 3 is not fully supported; the job
    uses Arrow batches only (mapInArrow), so the warning says nothing about this run.
    """
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
