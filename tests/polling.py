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
