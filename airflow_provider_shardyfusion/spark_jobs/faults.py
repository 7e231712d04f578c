"""Test-only fault injection, read on the driver from ``SHARDYFUSION_TEST_FAULTS`` (JSON).

The driver passes the parsed dict into task closures, so executors see it even when their
Python workers were started before the variable was set. Keys:
  fail_shard_attempt: {"db_id": int, "attempt": int}     raise in that task attempt, before writing
  fail_after_upload: {"db_id": int, "attempt": int}      raise after its files were uploaded
  slow_shard_attempt: {"db_id": int, "attempt": int, "seconds": float}
  wrong_router: true                                      route to (id + 1) % num_dbs
  single_db_fail_attempts: int                            fail the first N single-db attempts
  hold_shard_write: {"db_id": int, "attempt": int, <hold>}  the Python worker writing that shard attempt
                                                          holds after its files were uploaded
  hold_before_publish: {<hold>}                           the driver holds just before publishing
  clock_offset_seconds: float                             the driver's run-record clock is this far off
A hold: {"marker": path, "seconds": float, "release": path}: the process writes its pid to marker,
then waits until the release file exists or seconds pass ("{run_id}" in either path is replaced).
Tests use the pid to kill that process at that point, and the release file to let several
writers go on at once.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..core import layout

if TYPE_CHECKING:
    from collections.abc import Callable

ENV_VAR = "SHARDYFUSION_TEST_FAULTS"


class InjectedFault(RuntimeError):
    """A failure injected by a test; retryable like any infrastructure error."""


def load() -> dict[str, Any]:
    raw = os.environ.get(ENV_VAR)
    return json.loads(raw) if raw else {}


def driver_clock(faults: dict[str, Any]) -> Callable[[], datetime]:
    """The clock the driver stamps its run record with: the real one, or one skewed by the test."""
    offset = timedelta(seconds=float(faults.get("clock_offset_seconds", 0)))
    return (lambda: layout.utc_now() + offset) if offset else layout.utc_now


def _for_attempt(faults: dict[str, Any], name: str, db_id: int, attempt: int) -> dict[str, Any] | None:
    """The fault ``name`` if it targets this shard attempt."""
    spec = faults.get(name)
    return spec if spec and spec.get("db_id") == db_id and spec.get("attempt", 0) == attempt else None


def _hold(spec: dict[str, Any], run_id: str) -> None:
    marker = spec["marker"].replace("{run_id}", run_id)
    with open(marker + ".tmp", "w") as fh:  # renamed into place: a reader never sees a half-written pid
        fh.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    deadline = time.monotonic() + float(spec.get("seconds", 30))
    release = spec["release"].replace("{run_id}", run_id) if spec.get("release") else None
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.05)


def before_shard_write(faults: dict[str, Any], db_id: int, attempt: int) -> None:
    if _for_attempt(faults, "fail_shard_attempt", db_id, attempt):
        raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt}")
    slow = _for_attempt(faults, "slow_shard_attempt", db_id, attempt)
    if slow:
        time.sleep(float(slow.get("seconds", 5)))


def after_shard_write(faults: dict[str, Any], db_id: int, attempt: int, run_id: str = "") -> None:
    hold = _for_attempt(faults, "hold_shard_write", db_id, attempt)
    if hold:
        _hold(hold, run_id)
    if _for_attempt(faults, "fail_after_upload", db_id, attempt):
        raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt} after upload")


def hold_point(faults: dict[str, Any], name: str, run_id: str) -> None:
    """Hold at the named point (``hold_before_pointer``: manifest written and the run recorded
    succeeded, ``_CURRENT`` not moved yet; ``hold_after_batch``: a stream's micro-batch is live, its
    checkpoint not committed yet) if the test asked for it."""
    hold = faults.get(name)
    if hold:
        _hold(hold, run_id)


def before_publish(faults: dict[str, Any], run_id: str) -> None:
    hold = faults.get("hold_before_publish")
    if hold:
        _hold(hold, run_id)
