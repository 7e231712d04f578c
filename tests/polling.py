"""Bounded waiting for tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "the condition",
             interval: float = 0.05) -> Any:
    """The first truthy value of ``predicate()``; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class FakeClock:
    """UTC time that moves only when the code under test sleeps (``clock=``/``sleep=`` of
    ``core.lifecycle.run_outcome.wait_for_run``); ``on_sleep(n)`` plays the world after the n-th sleep."""

    def __init__(self, on_sleep: Callable[[int], Any] | None = None):
        from airflow_provider_shardyfusion.core import layout

        self.now = layout.utc_now()
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def __call__(self) -> Any:
        return self.now

    def sleep(self, seconds: float) -> None:
        from datetime import timedelta

        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)
        if self.on_sleep is not None:
            self.on_sleep(len(self.slept))
