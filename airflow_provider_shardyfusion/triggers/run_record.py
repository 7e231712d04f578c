"""``RunRecordTrigger``: waits until a writer's run record is terminal (SPEC §7, §8)."""

from __future__ import annotations

import contextlib
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.triggers._polling import PollingTrigger

__all__ = ["RunRecordTrigger"]


class RunRecordTrigger(PollingTrigger):
    """Poll ``<output_uri>/runs/run_id=<run_id>/run.json`` until the run is over.

    Yields exactly one event:

    * ``{"status": "success", "run_record": {...}, "live_state", "live_run_id"}`` when the record
      says ``succeeded`` and, for a run its writer was to publish, ``_CURRENT`` settled
      (``core.lifecycle.run_outcome``: live, or superseded by a later run);
    * ``{"status": "error", "message", "error_type", "reason", "run_id", "run_record"}`` when the
      writer failed (``reason="failed"``, ``error_type`` / message are the writer's own), when a
      ``running`` record's lease expired (``reason="writer_lost"``), when the record stayed missing
      longer than ``missing_timeout`` (``reason="missing"``), when a run meant to go live did
      not within 30 s (``reason="not_live"``), or when reads kept failing.

    :param output_uri: the snapshot root, ``s3://bucket/prefix`` or ``file:///abs/dir``.
    :param run_id: the run to wait for.
    :param aws_conn_id: AWS connection for ``s3://`` roots; looked up asynchronously in the triggerer.
    :param poll_interval: seconds between reads (one request each).
    :param missing_timeout: give up if the record does not exist this many seconds after the
        trigger started (``None``: wait for it; the task's own ``timeout`` still applies).
    :param max_consecutive_failures: failed reads in a row before the trigger gives up.
    :param max_backoff: cap, in seconds, of the exponential backoff after a failed read.
    :param fail_run_on_kill: when a user stops the deferred task (mark failed / clear), mark the
        run ``failed`` ("killed") so the writer publishes nothing (it re-reads its run record
        before moving ``_CURRENT``). Set by ``ShardedWriteOperator``, which owns the run; a sensor
        that only watches someone else's run leaves it off.
    """

    def __init__(
        self,
        output_uri: str,
        run_id: str,
        aws_conn_id: str | None = "aws_default",
        poll_interval: float = 10.0,
        missing_timeout: float | None = None,
        max_consecutive_failures: int = 5,
        max_backoff: float = 300.0,
        fail_run_on_kill: bool = False,
    ):
        super().__init__(
            output_uri=output_uri, aws_conn_id=aws_conn_id, poll_interval=poll_interval,
            max_consecutive_failures=max_consecutive_failures, max_backoff=max_backoff,
        )
        self.run_id = run_id
        self.missing_timeout = missing_timeout
        self.fail_run_on_kill = fail_run_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "output_uri": self.output_uri,
                "run_id": self.run_id,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "missing_timeout": self.missing_timeout,
                "max_consecutive_failures": self.max_consecutive_failures,
                "max_backoff": self.max_backoff,
                "fail_run_on_kill": self.fail_run_on_kill,
            },
        )

    async def on_kill(self) -> None:
        if not self.fail_run_on_kill:
            return
        from airflow_provider_shardyfusion.core.errors import RunKilled
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        record = await ShardyfusionHook(aws_conn_id=self.aws_conn_id).amark_failed(
            self.output_uri, self.run_id, RunKilled()
        )
        self.log.info("Run %r after the kill: %s", self.run_id, record.status if record else "no run record yet")

    def _key(self) -> str:
        return layout.run_record_key(self.run_id)

    def _describe(self) -> str:
        return f"the run record of run {self.run_id!r} under {self.output_uri}"

    async def _aevaluate(self, reader: Any, data: bytes | None, waited: float) -> TriggerEvent | None:
        from airflow_provider_shardyfusion.core.lifecycle.run_outcome import RunOutcome
        from airflow_provider_shardyfusion.core.model.run_record import RunRecord

        if data is None:
            if self.missing_timeout is not None and waited > self.missing_timeout:
                return TriggerEvent(RunOutcome.missing(self.run_id, self.output_uri, waited, self.missing_timeout).to_event())
            self.log.info("Run record of run %r not written yet; polling again in %ss", self.run_id, self.poll_interval)
            return None
        record = RunRecord.from_bytes(data)
        pointer = await self._alive_state(reader, record) if RunOutcome.awaits_pointer(record) else None
        outcome = RunOutcome.from_record(record, self.run_id, layout.utc_now(), pointer=pointer)
        if not outcome.is_final:
            self.log.info("%s; polling again in %ss", outcome.message, self.poll_interval)
            return None
        return TriggerEvent(outcome.to_event())

    async def _alive_state(self, reader: Any, record: Any) -> Any:
        """``core.lifecycle.run_outcome.LiveState`` of the succeeded ``record``, read with the async reader."""
        from airflow_provider_shardyfusion.core.lifecycle.run_outcome import LiveState
        from airflow_provider_shardyfusion.core.model.chain import parse_manifest_bytes
        from airflow_provider_shardyfusion.core.model.pointer import parse_pointer

        root = layout.normalize_root(self.output_uri)
        data = await reader.read(layout.CURRENT_KEY)
        live = parse_pointer(data, root) if data is not None else None
        if live is None or live.run_id == record.run_id or not record.manifest_ref:
            return LiveState.of(record, live)
        own = await reader.read(layout.relative_key(root, record.manifest_ref))
        theirs = await reader.read(layout.relative_key(root, live.manifest_ref))
        live_started = None  # an unreadable live manifest counts as older, as the pointer move treats it
        with contextlib.suppress(ManifestValidationError):
            live_started = parse_manifest_bytes(live.manifest_ref, theirs).run_started_at if theirs else None
        own_started = parse_manifest_bytes(record.manifest_ref, own).run_started_at if own else None
        return LiveState.of(record, live, live_started_at=live_started, own_started_at=own_started)
