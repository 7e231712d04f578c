"""Blocking token buckets for ``max_writes_per_second`` / ``max_write_bytes_per_second``."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["TokenBucket", "WriteLimiter"]


class TokenBucket:
    """``rate`` tokens per second, burst of one second's worth.

    A request larger than the bucket is granted once the bucket is full and leaves it in
    debt, so big batches are slowed to the rate instead of blocking forever.
    """

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if not rate > 0:
            raise ConfigError(f"token bucket rate {rate!r} must be > 0")
        self.rate = float(rate)
        self.capacity = float(rate)
        self._tokens = self.capacity
        self._clock = clock
        self._sleep = sleep
        self._last = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def acquire(self, amount: float) -> None:
        if amount <= 0:
            return
        with self._lock:
            self._refill()
            need = min(amount, self.capacity)
            if self._tokens < need:
                wait = (need - self._tokens) / self.rate
                self.waited_s += wait
                self._sleep(wait)
                self._refill()
                # The sleep paid for exactly the missing tokens; float rounding must not loop.
                self._tokens = max(self._tokens, need)
            self._tokens -= amount


class WriteLimiter:
    """Rows-per-second and bytes-per-second buckets acquired together per batch."""

    def __init__(self, rows_per_s: float | None, bytes_per_s: float | None):
        self.rows = TokenBucket(rows_per_s) if rows_per_s else None
        self.bytes = TokenBucket(bytes_per_s) if bytes_per_s else None

    @property
    def active(self) -> bool:
        return self.rows is not None or self.bytes is not None

    def acquire(self, rows: int, nbytes: int) -> None:
        if self.rows is not None:
            self.rows.acquire(rows)
        if self.bytes is not None:
            self.bytes.acquire(nbytes)

    @property
    def waited_s(self) -> float:
        return sum(b.waited_s for b in (self.rows, self.bytes) if b is not None)
