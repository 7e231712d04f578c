"""Test-only fault injection, read on the driver from ``SHARDYFUSION_TEST_FAULTS`` (JSON).

The driver passes the parsed dict into task closures, so executors see it even when their
Python workers were started before the variable was set. Keys:
  fail_shard_attempt: {"db_id": int, "attempt": int}     raise in that task attempt, before writing
  fail_after_upload: {"db_id": int, "attempt": int}      raise after its files were uploaded
  slow_shard_attempt: {"db_id": int, "attempt": int, "seconds": float}
  wrong_router: true                                      route to (id + 1) % num_dbs
  single_db_fail_attempts: int                            fail the first N single-db attempts
  hold_before_publish: {"seconds": float, "marker": path}  the driver writes its pid to marker, then waits
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV_VAR = "SHARDYFUSION_TEST_FAULTS"


class InjectedFault(RuntimeError):
    """A failure injected by a test; retryable like any infrastructure error."""


def load() -> dict[str, Any]:
    raw = os.environ.get(ENV_VAR)
    return json.loads(raw) if raw else {}


def before_shard_write(faults: dict[str, Any], db_id: int, attempt: int) -> None:
    fail = faults.get("fail_shard_attempt")
    if fail and fail.get("db_id") == db_id and fail.get("attempt", 0) == attempt:
        raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt}")
    slow = faults.get("slow_shard_attempt")
    if slow and slow.get("db_id") == db_id and slow.get("attempt", 0) == attempt:
        time.sleep(float(slow.get("seconds", 5)))


def after_shard_write(faults: dict[str, Any], db_id: int, attempt: int) -> None:
    fail = faults.get("fail_after_upload")
    if fail and fail.get("db_id") == db_id and fail.get("attempt", 0) == attempt:
        raise InjectedFault(f"injected failure of shard {db_id} attempt {attempt} after upload")


def before_publish(faults: dict[str, Any], run_id: str) -> None:
    hold = faults.get("hold_before_publish")
    if hold:
        with open(hold["marker"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(float(hold.get("seconds", 30)))
