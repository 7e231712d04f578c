"""Follow ``_CURRENT`` from a background thread (SPEC §19): ``ShardedReader(follow_interval_s=…)``.

A ``Follower`` owns one daemon thread. Each round it asks its ``PointerWatch`` whether the pointer moved
away from the served snapshot (on S3 a conditional GET: 304 while nothing moved) and, if so, calls the
reader's own refresh, which takes the reader's swap lock: a follower's refresh and a user's never
run at once. Failures (also a pointer naming a run the reader cannot serve) are kept for
``health()`` and back off: the wait doubles with each failure in a row, up to
``MAX_BACKOFF_INTERVALS`` intervals. Every wait is jittered by ±10 % so a fleet started together
does not poll in step, and is an ``Event`` wait, so ``stop()`` returns as soon as the round in
progress ends.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError, UnusableSnapshotError

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

__all__ = [
    "JITTER", "MAX_BACKOFF_INTERVALS", "THREAD_NAME", "Follower", "PointerWatch", "check_follow_arguments",
    "follower_thread_name", "next_wait",
]

log = logging.getLogger(__name__)

JITTER = 0.1
MAX_BACKOFF_INTERVALS = 10
# A stop() that outlives this is logged: the round in progress is a storage call bounded by its retry policy.
_JOIN_TIMEOUT_S = 30.0
# What a follower's thread is called, so a thread dump (or a test) tells which reader it polls for.
THREAD_NAME = "shardyfusion-follow"


def follower_thread_name(output_uri: str) -> str:
    """The name of the follower thread of a ``ShardedReader`` of ``output_uri`` (as the reader normalised it)."""
    return f"{THREAD_NAME} {output_uri}"


def check_follow_arguments(follow_interval_s: float | None, max_staleness_s: float | None, *, pinned: bool) -> None:
    """Refuse a follow set-up ``ShardedReader`` cannot honour, naming the argument."""
    if follow_interval_s is not None:
        if isinstance(follow_interval_s, bool) or not isinstance(follow_interval_s, int | float) \
                or not follow_interval_s > 0 or follow_interval_s == float("inf"):
            raise ConfigError(f"follow_interval_s must be a positive number of seconds or None, got {follow_interval_s!r}")
        if pinned:
            raise ConfigError("follow_interval_s is for a reader that follows _CURRENT; a manifest_ref reader is "
                              "pinned to one manifest and never refreshes: drop one of the two")
    if max_staleness_s is not None and (isinstance(max_staleness_s, bool) or not isinstance(max_staleness_s, int | float)
                                        or not max_staleness_s > 0):
        raise ConfigError(f"max_staleness_s must be a positive number of seconds or None, got {max_staleness_s!r}")


def next_wait(interval_s: float, failures: int, rand: Callable[[], float] = random.random) -> float:
    """The wait before the next round: the interval, doubled per failure in a row up to
    ``MAX_BACKOFF_INTERVALS`` intervals, then jittered by ±``JITTER``."""
    factor = min(2 ** min(failures, 16), MAX_BACKOFF_INTERVALS)
    return interval_s * factor * (1 - JITTER + 2 * JITTER * rand())


class PointerWatch:
    """Whether ``_CURRENT`` names another snapshot than the one served, read conditionally.

    The etag of a pointer is remembered only once the reader serves what it names (``settle()``
    after a round that did not fail): a refresh that failed, also one that found the run unusable
    (a malformed pointer, a missing or invalid manifest), is tried again at the next round, backed off.
    """

    def __init__(self, snapshots: SnapshotRoot, served: Callable[[], CurrentPointer]):
        self._snapshots = snapshots
        self._served = served
        self._etag: str | None = None
        self._seen: str | None = None

    def moved(self) -> bool:
        """Whether ``_CURRENT`` names another snapshot; ``UnusableSnapshotError`` when it is malformed
        or gone (as ``refresh()`` words it), a ``StorageError`` when it cannot be read."""
        current_uri = self._snapshots.store.uri(layout.CURRENT_KEY)
        try:
            state = self._snapshots.read_pointer_if_changed(self._etag)
        except ManifestValidationError as exc:
            raise UnusableSnapshotError.malformed_pointer(current_uri, exc, self._served().run_id) from exc
        if state is None:
            return False
        if state.pointer is None:
            raise UnusableSnapshotError.pointer_gone(current_uri, self._served().run_id)
        self._seen = state.etag
        served = self._served()
        return (state.pointer.manifest_ref, state.pointer.run_id) != (served.manifest_ref, served.run_id)

    def settle(self) -> None:
        self._etag = self._seen


class Follower:
    """The background thread of a following reader.

    ``watch``: says whether ``_CURRENT`` moved (raises on a storage failure). ``refresh()``: the
    reader's checked refresh, returning True when it swapped and raising when the check failed,
    also for a run it cannot serve; it records its own outcome (for ``health()`` and the metrics).
    ``report()``: what the last swap cost (``reader.last_refresh``), handed to ``on_refresh``.
    ``on_check(exc, seconds)`` records the outcome of a round that did not call ``refresh()``
    (``None``: ``_CURRENT`` had not moved; else the poll's error) and how long it took. A callback
    that raises is logged and never stops the thread.
    """

    def __init__(
        self,
        *,
        interval_s: float,
        watch: PointerWatch,
        refresh: Callable[[], bool],
        report: Callable[[], Any],
        on_check: Callable[[BaseException | None, float], None],
        on_refresh: Callable[[Any], Any] | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
        name: str = THREAD_NAME,
    ):
        self.interval_s = float(interval_s)
        self._watch = watch
        self._refresh = refresh
        self._report = report
        self._on_check = on_check
        self._on_refresh = on_refresh
        self._on_error = on_error
        self._stop = threading.Event()
        self.failures = 0  # failed rounds in a row
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop and join; the round in progress (if any) finishes first. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("follower %s still inside a storage call %.0fs after close(); it stops when it returns",
                            self._thread.name, _JOIN_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.wait(next_wait(self.interval_s, self.failures)):
            self.round()

    def round(self) -> None:
        """One check: poll, refresh if the pointer moved, record the outcome, call the callbacks."""
        start = time.perf_counter()
        refreshing = False
        try:
            swapped = False
            if self._watch.moved() and not self._stop.is_set():
                refreshing = True
                swapped = self._refresh()
        except Exception as exc:
            self.failures += 1
            if not refreshing:  # refresh() records its own failure
                self._on_check(exc, time.perf_counter() - start)
            log.warning("follower %s: check failed (%d in a row; next in about %.1fs): %s", self._thread.name,
                        self.failures, next_wait(self.interval_s, self.failures, lambda: 0.5), exc)
            self._call(self._on_error, exc)
            return
        self.failures = 0
        self._watch.settle()
        if not refreshing:
            self._on_check(None, time.perf_counter() - start)
        if swapped:
            self._call(self._on_refresh, self._report())

    def _call(self, callback: Callable[[Any], Any] | None, arg: Any) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except Exception:
            log.exception("follower %s: callback %r raised; the follower goes on", self._thread.name, callback)
