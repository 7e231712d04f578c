"""``/metrics`` of every worker of a ``serve --workers N``: their states shared through one folder.

A scrape reaches one worker process, yet must show all of them, each series labelled with its
worker's ``pid``. Each worker writes its state (``serve.metrics.WorkerMetrics``, through the
project's codec) to ``worker-<pid>.json`` in the folder ``run_server`` made for this server: every
``PUBLISH_S`` from a thread, and at each scrape it answers. Writes are atomic (``LocalStore``: temp
file + rename) and one worker's are serialized, so its file only ever moves forward.

A scrape renders every worker from its latest file, its own included (just written): rendering its
own live counters beside the others' files could show a worker's counter lower than the previous
scrape (answered by that worker, live) did, which Prometheus reads as a reset. The file of a
worker whose process is gone, or that has not been rewritten for ``STALE_S`` (a dead worker's pid
taken by another process), is skipped and removed. A worker removes its own file as it stops.
The folder's path comes from the ``ServeConfig``, never from a request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ShardyfusionError, StorageError
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.serve.metrics import WorkerMetrics

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["PUBLISH_S", "STALE_S", "SharedMetrics"]

log = logging.getLogger(__name__)

PUBLISH_S = 1.0
# Thirty missed writes: the worker is gone or hung, whatever process holds its pid now.
STALE_S = 30.0
_FILE = re.compile(r"worker-(\d+)\.json")
_CODEC = ser.Codec(WorkerMetrics, "a serve worker's metrics file", StorageError)


class SharedMetrics:
    """This worker's metrics in the server's folder ``folder``, and every live worker's for a scrape.

    ``snapshot`` reads this worker's state now; ``start`` begins writing it every ``PUBLISH_S``,
    ``close`` stops and removes the file.
    """

    def __init__(self, folder: str, pid: int, snapshot: Callable[[], WorkerMetrics]):
        self._store = LocalStore(f"file://{os.path.abspath(folder)}")
        self._pid = pid
        self._key = f"worker-{pid}.json"
        self._snapshot = snapshot
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        self._publish()
        self._thread = threading.Thread(target=self._run, name="shardyfusion-serve-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_S):
            self._publish()

    def _publish(self) -> WorkerMetrics:
        # Read and written under one lock: a state read earlier is never written over a later one.
        with self._write_lock:
            state = self._snapshot()
            if self._closed:  # a scrape answered while the worker stops: its file stays removed
                return state
            try:
                self._store.put(self._key, ser.dumps(ser.to_plain(state)))
            except ShardyfusionError as exc:  # the scrape still answers, from this worker's state
                log.warning("serve: cannot write this worker's metrics for the other workers: %s", exc)
            return state

    def scrape(self) -> list[WorkerMetrics]:
        """Every live worker's latest state, this one's taken now, by pid."""
        states = {self._pid: self._publish()}
        now = time.time()
        for info in self._store.list("worker-"):
            found = _FILE.fullmatch(info.key)
            pid = int(found[1]) if found else None
            if pid is None or pid == self._pid:
                continue
            written = info.last_modified.timestamp() if info.last_modified else now
            if not _alive(pid) or now - written > STALE_S:
                self._store.delete_many([info.key])
                continue
            try:
                state = _CODEC.from_bytes(self._store.get(info.key).data)
            except ShardyfusionError as exc:  # removed meanwhile (the worker stopped), or unreadable
                log.debug("serve: metrics of worker %s skipped: %s", pid, exc)
                continue
            if state.pid == pid:
                states[pid] = state
        return [states[pid] for pid in sorted(states)]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=PUBLISH_S + 5)
        with self._write_lock, contextlib.suppress(ShardyfusionError):
            self._closed = True
            self._store.delete_many([self._key])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds the pid: STALE_S retires the file
        return True
    return True
