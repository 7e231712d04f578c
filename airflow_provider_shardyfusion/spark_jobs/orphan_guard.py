"""Exit the Python driver when the process that launched it is gone.

In client and local deploy modes ``spark-submit`` (a JVM) starts this Python driver as its child.
When Airflow stops a task it kills ``spark-submit``; the Python child would live on as an orphan
and could still finish its write. The run record fence already keeps such a run from going live
once it is marked failed, but an orphan would still burn resources and write shards nobody will
read, so it ends itself as soon as it notices it was re-parented.
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = [
    "EXIT_CODE", "exit_when_orphaned",
]

log = logging.getLogger("shardyfusion.job")

EXIT_CODE = 143  # as if terminated by SIGTERM


def exit_when_orphaned(interval_s: float = 1.0) -> threading.Thread:
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                log.error("the process that launched this driver (pid %d) is gone (spark-submit killed?); "
                          "exiting without finishing the run", parent)
                logging.shutdown()
                os._exit(EXIT_CODE)

    thread = threading.Thread(target=watch, name="shardyfusion-orphan-guard", daemon=True)
    thread.start()
    return thread
