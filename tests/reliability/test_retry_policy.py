"""The one retry helper: bounded by attempts and by a deadline, never retries what is not transient."""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError
from airflow_provider_shardyfusion.core.retry import RetryPolicy, call_with_retry


class FakeTime:
    """A clock that only moves when the helper sleeps, so backoff is checked without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def flaky(failures: int, exc: Exception):
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise exc
        return f"ok after {calls['n']} calls"

    return fn, calls


def test_transient_failures_are_retried_with_capped_growing_delays():
    t = FakeTime()
    fn, calls = flaky(5, TimeoutError("blip"))
    policy = RetryPolicy(attempts=6, base_delay_s=1.0, max_delay_s=4.0, deadline_s=None)
    assert call_with_retry(fn, policy=policy, retryable=lambda e: isinstance(e, TimeoutError), describe="op",
                           sleep=t.sleep, clock=t.clock) == "ok after 6 calls"
    assert calls["n"] == 6 and len(t.sleeps) == 5
    caps = [1.0, 2.0, 4.0, 4.0, 4.0]  # doubled, then capped; jitter keeps each in [cap/2, cap]
    assert all(cap / 2 <= s <= cap for s, cap in zip(t.sleeps, caps, strict=False)), t.sleeps
    print(f"FIGURE retry-helper: 5 transient failures, {len(t.sleeps)} retries, delays {[round(s, 2) for s in t.sleeps]}")


def test_attempts_run_out_and_give_up_builds_the_error():
    t = FakeTime()
    fn, calls = flaky(100, ConnectionResetError("reset by peer"))

    def give_up(exc: BaseException, attempts: int, elapsed: float) -> StorageError:
        return StorageError(f"gave up after {attempts} attempts over {elapsed:.1f}s: {exc}")

    with pytest.raises(StorageError, match=r"gave up after 3 attempts over .*reset by peer") as info:
        call_with_retry(fn, policy=RetryPolicy(attempts=3, base_delay_s=0.5, deadline_s=None),
                        retryable=lambda e: isinstance(e, OSError), describe="op", give_up=give_up,
                        sleep=t.sleep, clock=t.clock)
    assert calls["n"] == 3 and isinstance(info.value.__cause__, ConnectionResetError)


def test_the_deadline_stops_retries_before_attempts_run_out():
    t = FakeTime()
    fn, calls = flaky(100, TimeoutError("down"))
    with pytest.raises(TimeoutError, match="down"):  # without give_up the last error itself
        call_with_retry(fn, policy=RetryPolicy(attempts=100, base_delay_s=2.0, max_delay_s=2.0, deadline_s=5.0),
                        retryable=lambda e: True, describe="op", sleep=t.sleep, clock=t.clock)
    assert t.now <= 5.0 and 3 <= calls["n"] <= 6, (t.now, calls)


def test_other_errors_are_raised_at_once():
    t = FakeTime()
    fn, calls = flaky(1, KeyError("absent"))
    with pytest.raises(KeyError):
        call_with_retry(fn, policy=RetryPolicy(), retryable=lambda e: isinstance(e, TimeoutError), describe="op",
                        sleep=t.sleep, clock=t.clock)
    assert calls["n"] == 1 and t.sleeps == []


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"attempts": True}, {"base_delay_s": -1}, {"deadline_s": -1}])
def test_bad_policies_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)


def test_one_classifier_says_what_is_worth_another_attempt():
    from airflow_provider_shardyfusion.core.errors import (
        InputDataError,
        KeyEncodingError,
        ManifestValidationError,
        RunKilled,
        RunRecordError,
        ShardAssignmentError,
        ShardWriteError,
    )
    from airflow_provider_shardyfusion.core.retry import is_retryable

    permanent = [ConfigError("bad"), InputDataError("null key"), KeyEncodingError("enc"), ShardAssignmentError("x"),
                 ManifestValidationError("malformed"), RunRecordError("bad record"), RunKilled()]
    transient = [StorageError("endpoint down"), ShardWriteError("executor lost"), TimeoutError(), OSError("disk"),
                 RuntimeError("py4j")]
    assert [is_retryable(e) for e in permanent] == [False] * len(permanent)
    assert [is_retryable(e) for e in transient] == [True] * len(transient)


def test_the_async_twin_follows_the_same_policy_and_classifier():
    import asyncio

    from airflow_provider_shardyfusion.core.retry import acall_with_retry

    t = FakeTime()

    async def sleep(seconds: float) -> None:
        t.sleep(seconds)

    fn, calls = flaky(3, StorageError("blip"))

    async def afn() -> str:
        return fn()

    policy = RetryPolicy(attempts=4, base_delay_s=1.0, max_delay_s=4.0, deadline_s=None, jitter=False)
    assert asyncio.run(acall_with_retry(afn, policy=policy, describe="op", sleep=sleep, clock=t.clock)) \
        == "ok after 4 calls"
    assert t.sleeps == [1.0, 2.0, 4.0]  # the same schedule as the sync helper

    permanent, calls = flaky(5, ConfigError("bad argument"))

    async def apermanent() -> str:
        return permanent()

    with pytest.raises(ConfigError):
        asyncio.run(acall_with_retry(apermanent, policy=policy, describe="op", sleep=sleep, clock=t.clock))
    assert calls["n"] == 1 and t.sleeps == [1.0, 2.0, 4.0]

    spent, calls = flaky(100, StorageError("down"))

    async def aspent() -> str:
        return spent()

    with pytest.raises(RuntimeError, match="gave up after 4") as info:
        asyncio.run(acall_with_retry(aspent, policy=policy, describe="op", sleep=sleep, clock=t.clock,
                                     give_up=lambda e, n, s: RuntimeError(f"gave up after {n}")))
    assert calls["n"] == 4 and isinstance(info.value.__cause__, StorageError)
