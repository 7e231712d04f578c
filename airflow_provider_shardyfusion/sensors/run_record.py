"""``RunRecordSensor``: waits until a shardyfusion write run is over; fails with the writer's error.

"Over" is ``core.lifecycle.run_outcome``'s rule, the one ``ShardedWriteOperator`` follows too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.lifecycle.run_outcome import RunOutcome, read_outcome
from airflow_provider_shardyfusion.sensors._base import PokeThenDeferSensor
from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

__all__ = ["RunRecordSensor"]


class RunRecordSensor(PokeThenDeferSensor):
    """Wait until the run record of a shardyfusion write is terminal.

    Succeeds when the run ``succeeded`` and returns the run record as a dict (XCom). A run whose
    writer was to publish it counts as running until ``_CURRENT`` names it, a later run is live
    (superseded), or 30 s passed since it finished (then it fails: not live), so the sensor and
    ``ShardedWriteOperator`` agree on when a run is over.

    Fails with ``RunFailedError`` (a ``RunRecordError``) as the writer's own error class and
    message when the run ``failed`` (``error_type``, ``reason``, ``run_id`` and
    ``writer_message`` on the exception), and with "writer lost" when a ``running`` record's
    lease expired (the writer died).

    :param run_id: the run to wait for (with ``output_uri``) ...
    :param run_record_ref: ... or the record's full URI, e.g. ``ShardedWriteOperator``'s
        ``run_record_ref`` XCom: ``<output_uri>/runs/run_id=<run_id>/run.json``.
    :param output_uri: the snapshot root (``s3://bucket/prefix`` or ``file:///abs/dir``).
    :param aws_conn_id: AWS connection for ``s3://`` roots.
    :param deferrable: poke once, then wait in the triggerer (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between reads, in the trigger and (unless ``poke_interval`` is
        given) in the poke loop.
    :param missing_timeout: fail if the record still does not exist this many seconds after the
        first poke (``None``: keep waiting until the sensor's ``timeout``).
    """

    template_fields: Sequence[str] = ("run_id", "run_record_ref", "output_uri", "aws_conn_id")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        run_id: str | None = None,
        run_record_ref: str | None = None,
        output_uri: str | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        missing_timeout: float | None = None,
        **kwargs: Any,
    ):
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.run_id = run_id
        self.run_record_ref = run_record_ref
        self.output_uri = output_uri
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.missing_timeout = missing_timeout
        self._first_poke: float | None = None

    def _validate(self) -> str:
        root, _ = self._target()
        if self.missing_timeout is not None and self.missing_timeout < 0:
            raise ConfigError(f"RunRecordSensor {self.task_id!r}: missing_timeout must be >= 0, got {self.missing_timeout!r}")
        return root

    def _trigger(self, root: str) -> RunRecordTrigger:
        _, run_id = self._target()
        return RunRecordTrigger(
            output_uri=root, run_id=run_id, aws_conn_id=self.aws_conn_id, poll_interval=self.poll_interval,
            missing_timeout=self.missing_timeout,
        )

    def _target(self) -> tuple[str, str]:
        """Validated ``(root, run_id)`` from the rendered arguments."""
        where = f"RunRecordSensor {self.task_id!r}"
        try:
            if self.run_record_ref:
                root, run_id = layout.split_run_record_ref(self.run_record_ref)
                if self.run_id and self.run_id != run_id:
                    raise ConfigError(f"run_id {self.run_id!r} disagrees with run_record_ref {self.run_record_ref!r}")
                if self.output_uri and layout.normalize_root(self.output_uri) != root:
                    raise ConfigError(f"output_uri {self.output_uri!r} disagrees with run_record_ref {self.run_record_ref!r}")
                return root, run_id
            if not self.run_id or not self.output_uri:
                raise ConfigError("give run_record_ref, or both run_id and output_uri")
            return layout.normalize_root(self.output_uri), layout.validate_run_id(self.run_id)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def poke(self, context: Context) -> bool | PokeReturnValue:
        root, run_id = self._target()
        if self._first_poke is None:
            self._first_poke = time.monotonic()
        outcome = read_outcome(self.hook.get_snapshots(root), run_id, layout.utc_now())
        if outcome.kind == "absent":
            waited = time.monotonic() - self._first_poke
            if self.missing_timeout is not None and waited > self.missing_timeout:
                outcome = RunOutcome.missing(run_id, root, waited, self.missing_timeout)
        if not outcome.is_final or outcome.transient:  # a storage blip: the sensor's timeout bounds the wait
            self.log.info("%s", outcome.message)
            return False
        return self._finish(outcome)

    def _on_event(self, event: dict[str, Any]) -> Any:
        return self._finish(RunOutcome.from_event(event)).xcom_value

    def _finish(self, outcome: RunOutcome) -> PokeReturnValue:
        if not outcome.succeeded or outcome.record is None:
            self.log.error("%s", outcome.message)
            raise outcome.to_exception()
        self.log.info("%s; manifest %s", outcome.message, outcome.record.manifest_ref)
        return PokeReturnValue(is_done=True, xcom_value=outcome.record.to_dict())
