"""The one retry helper for backoff loops (capped, jittered exponential backoff with a deadline),
its async twin, and the one answer to "may a later identical attempt succeed?" (``is_retryable``).

Object-store clients retry a few times on their own (botocore's standard mode), but a short
outage of the endpoint outlasts those few tries, and botocore's retry quota runs dry under a
burst of failures. Operations that are safe to repeat go through ``call_with_retry`` so such an
outage costs time instead of failing a run whose work is already done.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    InputDataError,
    ManifestValidationError,
    RunRecordError,
    ShardAssignmentError,
    StorageError,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "NO_RETRY", "PERMANENT_ERRORS", "RetryPolicy", "acall_with_retry", "call_with_retry", "is_retryable", "is_storage_error",
]

T = TypeVar("T")
log = logging.getLogger("shardyfusion.retry")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: at most ``attempts`` calls, none started after ``deadline_s``.

    The delay before retry ``n`` (1-based) is ``min(max_delay_s, base_delay_s * 2**(n-1))``, scaled
    by a random factor in [0.5, 1] so many clients failing together do not retry in lockstep.
    """

    attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    deadline_s: float | None = 60.0
    jitter: bool = True  # off where the schedule is a contract (SPEC §6: _CURRENT after 1 s, 2 s, 4 s)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ConfigError(f"retry attempts {self.attempts!r} must be an integer >= 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ConfigError("retry delays must not be negative")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise ConfigError(f"retry deadline_s {self.deadline_s!r} must not be negative")

    def delay(self, retry_number: int, rand: Callable[[], float] = random.random) -> float:
        capped = min(self.max_delay_s, self.base_delay_s * (2 ** (retry_number - 1)))
        return capped * (0.5 + 0.5 * rand()) if self.jitter else capped


NO_RETRY = RetryPolicy(attempts=1, deadline_s=None)


# Errors about what was asked, not about the moment: a bad argument or input row, a row routed
# wrongly, an object that parsed but is malformed or of an unknown future format (objects are
# written atomically, so a bad one does not heal), a run that may not go on. Repeating the same
# request meets them again.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, InputDataError, ShardAssignmentError, ManifestValidationError, RunRecordError,
)


def is_retryable(exc: BaseException) -> bool:
    """Whether a later identical attempt may succeed: everything but ``PERMANENT_ERRORS``.

    Storage outages, lost executors and crashed workers are worth another attempt. (Which raw
    client failures count as transient *inside* one storage call is the store's own business,
    e.g. ``core.storage.s3.is_transient``; what leaves a store is a ``StorageError``.)
    """
    return not isinstance(exc, PERMANENT_ERRORS)


def is_storage_error(exc: BaseException) -> bool:
    """Only what a store raised: for steps whose other failures are decisions, not the moment."""
    return isinstance(exc, StorageError)


def _retry_delay(
    exc: Exception, attempt: int, elapsed: float, *, policy: RetryPolicy, retryable: Callable[[BaseException], bool],
    describe: str, give_up: Callable[[BaseException, int, float], BaseException] | None,
) -> float:
    """The delay before the next attempt; raises what the caller must raise when there is none."""
    if not retryable(exc):
        raise exc
    wait = policy.delay(attempt)
    out_of_time = policy.deadline_s is not None and elapsed + wait > policy.deadline_s
    if attempt >= policy.attempts or out_of_time:
        if give_up is None:
            raise exc
        raise give_up(exc, attempt, elapsed) from exc
    log.warning("%s failed (attempt %d of %d, %s: %s); retrying in %.2fs",
                describe, attempt, policy.attempts, type(exc).__name__, exc, wait)
    return wait


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool] = is_retryable,
    describe: str,
    give_up: Callable[[BaseException, int, float], BaseException] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn`` until it returns, raises a non-retryable error, or the policy is spent.

    ``give_up(last_error, attempts_made, seconds_spent)`` builds the error raised when retries
    run out (default: the last error itself). A non-retryable error is raised as it is, at once.
    """
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            sleep(_retry_delay(exc, attempt, clock() - started, policy=policy, retryable=retryable,
                               describe=describe, give_up=give_up))


async def acall_with_retry(
    fn: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool] = is_retryable,
    describe: str,
    give_up: Callable[[BaseException, int, float], BaseException] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call_with_retry`` for async code: awaits ``fn()`` and sleeps without blocking the loop."""
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except Exception as exc:
            await sleep(_retry_delay(exc, attempt, clock() - started, policy=policy, retryable=retryable,
                                     describe=describe, give_up=give_up))
