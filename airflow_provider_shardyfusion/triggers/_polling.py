"""The poll loop both shardyfusion triggers share: one small object read per poll, backoff on errors.

Subclasses say which object to read and what its bytes mean; this base owns the loop, so the
rules of SPEC §8 (one request per poll, capped exponential backoff on transient errors, exactly
one event) live in one place; the backoff and what counts as transient are ``core.retry``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_shardyfusion.core.retry import PERMANENT_ERRORS, RetryPolicy, acall_with_retry

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class _GaveUp(Exception):
    """Failed reads in a row ran out the retry policy; ``last`` is the final failure."""

    def __init__(self, message: str, last: BaseException):
        super().__init__(message)
        self.last = last


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

    @property
    def retry_policy(self) -> RetryPolicy:
        """Failed reads in a row: waits doubling from the poll interval (at least 1 s), capped at ``max_backoff``."""
        return RetryPolicy(attempts=max(1, self.max_consecutive_failures), base_delay_s=max(self.poll_interval, 1.0),
                           max_delay_s=self.max_backoff, deadline_s=None, jitter=False)

    def _give_up(self, exc: BaseException, attempts: int, elapsed: float) -> _GaveUp:
        return _GaveUp(f"giving up on {self._describe()} after {attempts} consecutive failed reads; "
                       f"last error: {type(exc).__name__}: {exc}", exc)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        started = time.monotonic()
        try:
            key = self._key()
            policy = self.retry_policy
        except PERMANENT_ERRORS as exc:
            yield error_event(f"{type(self).__name__}: {exc}", error_type=type(exc).__name__)
            return
        reader = _ReaderSlot(ShardyfusionHook(aws_conn_id=self.aws_conn_id), self.output_uri)

        async def poll_once() -> TriggerEvent | None:
            try:
                opened = await reader.get()
                return await self._aevaluate(opened, await opened.read(key), time.monotonic() - started)
            except Exception:
                await reader.drop()  # a fresh client next time: the old one may hold a broken connection
                raise

        try:
            while True:
                try:
                    event = await acall_with_retry(poll_once, policy=policy, describe=f"Reading {self._describe()}",
                                                   give_up=self._give_up)
                except _GaveUp as exc:
                    yield error_event(str(exc), error_type=type(exc.last).__name__)
                    return
                except Exception as exc:  # not retryable (core.retry.is_retryable): no poll will fix it
                    yield error_event(f"{type(exc).__name__} reading {self._describe()}: {exc}",
                                      error_type=type(exc).__name__)
                    return
                if event is not None:
                    yield event
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await reader.drop()


class _ReaderSlot:
    """The trigger's object reader: opened on first use, closed (and reopened later) after a failure."""

    def __init__(self, hook: Any, output_uri: str):
        self._hook = hook
        self._output_uri = output_uri
        self._reader: Any = None

    async def get(self) -> Any:
        if self._reader is None:
            self._reader = await self._hook.aopen_reader(self._output_uri)
        return self._reader

    async def drop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):  # closing must never mask the event or the real error
                await reader.aclose()
