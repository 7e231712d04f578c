"""``CurrentSnapshotSensor``: waits until ``_CURRENT`` exists, changes, or names a given run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import PokeReturnValue
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, error_type_by_name
from airflow_provider_shardyfusion.core.model.pointer import PointerWait
from airflow_provider_shardyfusion.sensors._base import PokeThenDeferSensor
from airflow_provider_shardyfusion.triggers.current import CurrentSnapshotTrigger

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from airflow_provider_shardyfusion.core.model.pointer import WaitMode

__all__ = ["CurrentSnapshotSensor"]

_UNSET = object()


class CurrentSnapshotSensor(PokeThenDeferSensor):
    """Wait until the ``_CURRENT`` pointer of ``output_uri`` satisfies ``mode``; return it (XCom).

    * ``mode="exists"``: any valid pointer;
    * ``mode="changed"``: a pointer other than the baseline. The baseline is
      ``previous_manifest_ref`` / ``previous_run_id`` when given (templatable, e.g. from an
      upstream XCom), else what the first poke of this try read (no pointer → any pointer counts).
      The first-poke baseline is handed to the trigger, so a deferral resumes consistently;
      it cannot survive ``sensor_mode="reschedule"``, which therefore needs an explicit baseline;
    * ``mode="run_id"``: a pointer naming ``run_id``.

    ``mode`` here is the snapshot condition; the poke/reschedule choice of
    ``BaseSensorOperator`` is ``sensor_mode``.

    :param output_uri: the snapshot root (``s3://bucket/prefix`` or ``file:///abs/dir``).
    :param mode: the snapshot condition: ``"exists"``, ``"changed"`` or ``"run_id"``.
    :param run_id: the run ``_CURRENT`` must name (``mode="run_id"``).
    :param previous_run_id: baseline for ``mode="changed"``: wait for a pointer naming another run.
    :param previous_manifest_ref: baseline for ``mode="changed"``: wait for a pointer naming another manifest.
    :param sensor_mode: ``BaseSensorOperator``'s ``"poke"`` or ``"reschedule"``.
    :param aws_conn_id: AWS connection for ``s3://`` roots.
    :param deferrable: poke once, then wait in the triggerer (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between reads, in the trigger and (unless ``poke_interval`` is
        given) in the poke loop.
    """

    template_fields: Sequence[str] = ("output_uri", "run_id", "previous_run_id", "previous_manifest_ref", "aws_conn_id")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        output_uri: str,
        mode: WaitMode = "exists",
        run_id: str | None = None,
        previous_run_id: str | None = None,
        previous_manifest_ref: str | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        sensor_mode: Literal["poke", "reschedule"] = "poke",
        **kwargs: Any,
    ):
        kwargs.setdefault("poke_interval", poll_interval)
        # BaseSensorOperator owns ``self.mode`` (poke / reschedule); the snapshot condition is kept apart.
        super().__init__(mode=sensor_mode, **kwargs)
        self.output_uri = output_uri
        self.snapshot_mode = mode
        self.run_id = run_id
        self.previous_run_id = previous_run_id
        self.previous_manifest_ref = previous_manifest_ref
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self._baseline: Any = _UNSET  # manifest_ref seen at the first poke (None: no pointer then)

    def _validate(self) -> str:
        where = f"CurrentSnapshotSensor {self.task_id!r}"
        if self.snapshot_mode in ("poke", "reschedule"):
            raise ConfigError(
                f"{where}: mode={self.snapshot_mode!r} is the snapshot condition here ('exists', 'changed' or "
                f"'run_id'); pass sensor_mode={self.snapshot_mode!r} for the sensor's poke/reschedule behaviour "
                "(a DAG's default_args 'mode' also lands here)"
            )
        try:
            PointerWait(self.snapshot_mode, self.run_id).validate()
            root = layout.normalize_root(self.output_uri)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if (self.snapshot_mode == "changed" and self.reschedule
                and self.previous_manifest_ref is None and self.previous_run_id is None):
            raise ConfigError(
                f"{where}: mode='changed' with sensor_mode='reschedule' needs previous_manifest_ref or "
                "previous_run_id: a baseline read at the first poke does not survive a reschedule"
            )
        return root

    def _has_explicit_baseline(self) -> bool:
        return self.previous_manifest_ref is not None or self.previous_run_id is not None

    def _trigger(self, root: str) -> CurrentSnapshotTrigger:
        previous_manifest_ref, previous_run_id = self.previous_manifest_ref, self.previous_run_id
        if self.snapshot_mode == "changed" and not self._has_explicit_baseline():
            previous_manifest_ref = None if self._baseline is _UNSET else self._baseline
        return CurrentSnapshotTrigger(
            output_uri=root, mode=self.snapshot_mode, run_id=self.run_id, previous_run_id=previous_run_id,
            previous_manifest_ref=previous_manifest_ref, aws_conn_id=self.aws_conn_id,
            poll_interval=self.poll_interval,
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        root = self._validate()
        snapshots = self.hook.get_snapshots(root)
        pointer = snapshots.current()
        if self.snapshot_mode == "changed" and not self._has_explicit_baseline() and self._baseline is _UNSET:
            self._baseline = pointer.manifest_ref if pointer is not None else None
            self.log.info("Baseline for mode='changed': %s", self._baseline or "no _CURRENT yet")
            return False
        if pointer is None:
            self.log.info("%s/%s does not exist yet", root, layout.CURRENT_KEY)
            return False
        baseline_ref = self.previous_manifest_ref if self._has_explicit_baseline() else self._baseline
        if self._baseline is _UNSET and not self._has_explicit_baseline():
            baseline_ref = None
        wait = PointerWait(self.snapshot_mode, self.run_id, self.previous_run_id, baseline_ref)
        if not wait.satisfied_by(pointer):
            self.log.info("_CURRENT names run %r; mode=%r not satisfied yet", pointer.run_id, self.snapshot_mode)
            return False
        snapshots.read_manifest(pointer)  # a pointer to a missing or altered manifest is no snapshot
        self.log.info("_CURRENT names run %r (manifest %s)", pointer.run_id, pointer.manifest_ref)
        return PokeReturnValue(is_done=True, xcom_value=pointer.to_dict())

    def _on_event(self, event: dict[str, Any]) -> Any:
        if event.get("status") != "success":
            # The trigger's own error class (e.g. a refused manifest), so the task fails as a poke would.
            error_cls = error_type_by_name(str(event.get("error_type") or ""))
            raise error_cls(
                f"CurrentSnapshotSensor {self.task_id!r}: {event.get('message') or 'trigger failed without a message'}"
            )
        pointer = event["pointer"]
        self.log.info("_CURRENT names run %r (manifest %s)", pointer.get("run_id"), pointer.get("manifest_ref"))
        return pointer
