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
