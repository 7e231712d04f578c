"""Test-only fault injection: the ``Faults`` collaborator, resolved once at the job's entry.

Production code takes a ``Faults`` and defaults to ``NO_FAULTS``, which does nothing; no plan or
config carries faults. The job's entry scripts build one with ``from_environment``: the JSON of
``SHARDYFUSION_TEST_FAULTS`` counts only while ``SHARDYFUSION_ENABLE_TEST_FAULTS=1`` is set as well
(a test-only switch, named in docs/security.md), so one stray variable cannot make a production job fail,
hold or route wrongly. The driver hands the object to the task closures, so executors see it even
when their Python workers were started before the variables were set. Keys of the JSON:
  fail_shard_attempt: {"db_id": int, "attempt": int}     raise in that task attempt, before writing
  fail_after_upload: {"db_id": int, "attempt": int}      raise after its files were uploaded
  slow_shard_attempt: {"db_id": int, "attempt": int, "seconds": float}
  wrong_router: true                                      route to (id + 1) % num_dbs
  single_db_fail_attempts: int                            fail the first N single-db attempts
  hold_shard_write: {"db_id": int, "attempt": int, <hold>}  the Python worker writing that shard attempt
                                                          holds after its files were uploaded
  hold_before_publish: {<hold>}                           the driver holds just before publishing
  hold_before_pointer, hold_after_batch: {<hold>}         see ``Faults.hold_point``
  clock_offset_seconds: float                             the driver's run-record clock is this far off
A hold: {"marker": path, "seconds": float, "release": path}: the process writes its pid to marker,
then waits until the release file exists or seconds pass ("{run_id}" in either path is replaced).
Tests use the pid to kill that process at that point, and the release file to let several
writers go on at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..core import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "ENABLE_VAR", "ENV_VAR", "NO_FAULTS", "Faults", "InjectedFault", "from_environment",
]

ENV_VAR = "SHARDYFUSION_TEST_FAULTS"
# The second switch: without it ENV_VAR is ignored (with a warning).
ENABLE_VAR = "SHARDYFUSION_ENABLE_TEST_FAULTS"

log = logging.getLogger("shardyfusion.faults")


class InjectedFault(RuntimeError):
    """A failure injected by a test; retryable like any infrastructure error."""


@dataclass(frozen=True)
class Faults:
    """The faults a test asked for (``spec``: the JSON described above); empty for production."""

    spec: dict[str, Any] = field(default_factory=dict)

    def clock(self) -> Callable[[], datetime]:
        """The clock the driver stamps its run record with: the real one, or one skewed by the test."""
        offset = timedelta(seconds=float(self.spec.get("clock_offset_seconds", 0)))
        return (lambda: layout.utc_now() + offset) if offset else layout.utc_now

    @property
    def route_shift(self) -> int:
        """Added to every shard id (mod num_dbs): 1 proves verify_routing catches a broken router."""
        return 1 if self.spec.get("wrong_router") else 0

    def before_single_db_attempt(self, attempt: int) -> None:
        if attempt < int(self.spec.get("single_db_fail_attempts", 0)):
            raise InjectedFault(f"injected failure of single-db attempt {attempt}")

    def _for_attempt(self, name: str, db_id: int, attempt: int) -> dict[str, Any] | None:
        """The fault ``name`` if it targets this shard attempt."""
        spec = self.spec.get(name)
        return spec if spec and spec.get("db_id") == db_id and spec.get("attempt", 0) == attempt else None

    def before_shard_write(self, db_id: int, attempt: int) -> None:
        if self._for_attempt("fail_shard_attempt", db_id, attempt):
            raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt}")
        slow = self._for_attempt("slow_shard_attempt", db_id, attempt)
        if slow:
            time.sleep(float(slow.get("seconds", 5)))

    def after_shard_write(self, db_id: int, attempt: int, run_id: str = "") -> None:
        hold = self._for_attempt("hold_shard_write", db_id, attempt)
        if hold:
            _hold(hold, run_id)
        if self._for_attempt("fail_after_upload", db_id, attempt):
            raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt} after upload")

    def hold_point(self, name: str, run_id: str) -> None:
        """Hold at the named point (``hold_before_publish``: just before publishing;
        ``hold_before_pointer``: manifest written and the run recorded succeeded, ``_CURRENT`` not
        moved yet; ``hold_after_batch``: a stream's micro-batch is live, its checkpoint not committed
        yet) if the test asked for it."""
        hold = self.spec.get(name)
        if hold:
            _hold(hold, run_id)


NO_FAULTS = Faults()


def from_environment(environ: Mapping[str, str] | None = None) -> Faults:
    """The faults of ``SHARDYFUSION_TEST_FAULTS``, only behind ``SHARDYFUSION_ENABLE_TEST_FAULTS=1``."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR)
    if not raw:
        return NO_FAULTS
    if env.get(ENABLE_VAR) != "1":
        log.warning("%s is set but ignored: test faults also need %s=1 (never set in production)", ENV_VAR, ENABLE_VAR)
        return NO_FAULTS
    return Faults(json.loads(raw))


def _hold(spec: dict[str, Any], run_id: str) -> None:
    marker = spec["marker"].replace("{run_id}", run_id)
    with open(marker + ".tmp", "w") as fh:  # renamed into place: a reader never sees a half-written pid
        fh.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    deadline = time.monotonic() + float(spec.get("seconds", 30))
    release = spec["release"].replace("{run_id}", run_id) if spec.get("release") else None
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.05)
