"""The poll loop both shardyfusion triggers share: one small object read per poll, backoff on errors.

Subclasses say which object to read and what its bytes mean; this base owns the loop, so the
rules of SPEC §8 (one request per poll, capped exponential backoff on transient errors, exactly
one event) live in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError, RunRecordError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# Errors no retry can fix: a bad argument, or an object that parsed but is malformed / of an
# unknown future format (objects are written atomically, so a bad one will not heal by itself).
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, ManifestValidationError, RunRecordError)


def error_event(message: str, **extra: Any) -> TriggerEvent:
    return TriggerEvent({"status": "error", "message": message, **extra})


class PollingTrigger(BaseTrigger):
    """Base of the shardyfusion triggers; subclasses implement ``_key``, ``_evaluate`` and ``serialize``."""

    def __init__(
        self,
        *,
        output_uri: str,
        aws_conn_id: str | None = "aws_default",
        poll_interval: float = 10.0,
        max_consecutive_failures: int = 5,
        max_backoff: float = 300.0,
    ):
        super().__init__()
        self.output_uri = output_uri
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.max_consecutive_failures = max_consecutive_failures
        self.max_backoff = max_backoff

    # -- what subclasses provide -------------------------------------------------------------

    def _key(self) -> str:
        """Key (relative to the output root) of the one object read per poll."""
        raise NotImplementedError

    def _evaluate(self, data: bytes | None, waited: float) -> TriggerEvent | None:
        """The final event for what was read (``None``: not there / not done yet, poll again)."""
        raise NotImplementedError

    async def _aevaluate(self, reader: Any, data: bytes | None, waited: float) -> TriggerEvent | None:
        """``_evaluate``; a subclass that must read one more object before deciding overrides this."""
        return self._evaluate(data, waited)

    def _describe(self) -> str:
        return f"{self._key()} under {self.output_uri}"

    # -- the loop ----------------------------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        return min(max(self.poll_interval, 1.0) * 2 ** (failures - 1), self.max_backoff)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        started = time.monotonic()
        try:
            key = self._key()
        except PERMANENT_ERRORS as exc:
            yield error_event(f"{type(self).__name__}: {exc}", error_type=type(exc).__name__)
            return
        hook = ShardyfusionHook(aws_conn_id=self.aws_conn_id)
        reader = None
        failures = 0
        try:
            while True:
                try:
                    if reader is None:
                        reader = await hook.aopen_reader(self.output_uri)
                    data = await reader.read(key)
                    event = await self._aevaluate(reader, data, time.monotonic() - started)
                except PERMANENT_ERRORS as exc:
                    yield error_event(f"{type(exc).__name__} reading {self._describe()}: {exc}",
                                      error_type=type(exc).__name__)
                    return
                except Exception as exc:
                    failures += 1
                    if failures >= self.max_consecutive_failures:
                        yield error_event(
                            f"giving up on {self._describe()} after {failures} consecutive failed reads; "
                            f"last error: {type(exc).__name__}: {exc}",
                            error_type=type(exc).__name__,
                        )
                        return
                    delay = self._backoff(failures)
                    self.log.warning(
                        "Reading %s failed (%d/%d): %s: %s; retrying in %.0fs",
                        self._describe(), failures, self.max_consecutive_failures, type(exc).__name__, exc, delay,
                    )
                    # A fresh client next time: the old one may hold a broken connection.
                    if reader is not None:
                        await _close_quietly(reader)
                        reader = None
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                if event is not None:
                    yield event
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            if reader is not None:
                await _close_quietly(reader)


async def _close_quietly(reader: Any) -> None:
    with contextlib.suppress(Exception):  # closing a client must never mask the event or the real error
        await reader.aclose()
