"""Token buckets with a fake clock: rates are enforced and big batches never block forever."""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.storage.rate_limit import TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rate_is_enforced_over_many_acquires():
    t = FakeTime()
    bucket = TokenBucket(100, clock=t.clock, sleep=t.sleep)
    for _ in range(50):
        bucket.acquire(10)  # 500 tokens at 100/s with a 100-token burst: ~4 s of waiting
    assert t.now == pytest.approx(4.0, abs=0.01)
    assert bucket.waited_s == pytest.approx(4.0, abs=0.01)


def test_request_larger_than_bucket_is_granted_and_leaves_debt():
    t = FakeTime()
    bucket = TokenBucket(10, clock=t.clock, sleep=t.sleep)
    bucket.acquire(1_000)  # bigger than the bucket: granted at once when full
    assert t.now == 0.0
    bucket.acquire(1)  # the debt of 990 tokens is paid back first
    assert t.now == pytest.approx(99.1, abs=0.01)


def test_rate_must_be_positive():
    with pytest.raises(ConfigError):
        TokenBucket(0)
