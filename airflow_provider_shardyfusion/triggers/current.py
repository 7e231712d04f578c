"""``CurrentSnapshotTrigger``: waits until ``_CURRENT`` exists, changes, or names a run (SPEC §8)."""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.pointer import PointerWait, WaitMode
from airflow_provider_shardyfusion.triggers._polling import PollingTrigger

__all__ = ["CurrentSnapshotTrigger"]


class CurrentSnapshotTrigger(PollingTrigger):
    """Poll ``<output_uri>/_CURRENT`` until it satisfies ``mode``.

    * ``exists``: any valid pointer;
    * ``changed``: a pointer other than the baseline: ``previous_manifest_ref`` if given, else
      ``previous_run_id`` if given, else (no baseline: there was no pointer) any pointer;
    * ``run_id``: a pointer naming ``run_id``.

    Yields exactly one event: ``{"status": "success", "pointer": {...}}`` or
    ``{"status": "error", "message": ..., "error_type": ...}``. A pointer whose manifest lies
    outside ``output_uri`` (tampered or copied) is an error, not a match; so is a pointer whose
    manifest is missing or no longer matches the checksum recorded in the pointer.

    :param output_uri: the snapshot root, ``s3://bucket/prefix`` or ``file:///abs/dir``.
    :param mode: ``"exists"``, ``"changed"`` or ``"run_id"``.
    :param run_id: the run the pointer must name (``mode="run_id"``).
    :param previous_run_id: baseline run for ``mode="changed"``.
    :param previous_manifest_ref: baseline manifest for ``mode="changed"`` (wins over ``previous_run_id``).
    :param aws_conn_id: AWS connection for ``s3://`` roots; looked up asynchronously in the triggerer.
    :param poll_interval: seconds between reads (one request each).
    :param max_consecutive_failures: failed reads in a row before the trigger gives up.
    :param max_backoff: cap, in seconds, of the exponential backoff after a failed read.
    """

    def __init__(
        self,
        output_uri: str,
        mode: WaitMode = "exists",
        run_id: str | None = None,
        previous_run_id: str | None = None,
        previous_manifest_ref: str | None = None,
        aws_conn_id: str | None = "aws_default",
        poll_interval: float = 10.0,
        max_consecutive_failures: int = 5,
        max_backoff: float = 300.0,
    ):
        super().__init__(
            output_uri=output_uri, aws_conn_id=aws_conn_id, poll_interval=poll_interval,
            max_consecutive_failures=max_consecutive_failures, max_backoff=max_backoff,
        )
        self.mode = mode
        self.run_id = run_id
        self.previous_run_id = previous_run_id
        self.previous_manifest_ref = previous_manifest_ref

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "output_uri": self.output_uri,
                "mode": self.mode,
                "run_id": self.run_id,
                "previous_run_id": self.previous_run_id,
                "previous_manifest_ref": self.previous_manifest_ref,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "max_consecutive_failures": self.max_consecutive_failures,
                "max_backoff": self.max_backoff,
            },
        )

    def _wait(self) -> PointerWait:
        return PointerWait(self.mode, self.run_id, self.previous_run_id, self.previous_manifest_ref)

    def _key(self) -> str:
        self._wait().validate()
        return layout.CURRENT_KEY

    def _describe(self) -> str:
        return f"{layout.CURRENT_KEY} under {self.output_uri}"

    async def _aevaluate(self, reader: Any, data: bytes | None, waited: float) -> TriggerEvent | None:
        from airflow_provider_shardyfusion.core.model import chain
        from airflow_provider_shardyfusion.core.model.pointer import parse_pointer

        if data is None:
            self.log.info("%s does not exist yet; polling again in %ss", self._describe(), self.poll_interval)
            return None
        root = layout.normalize_root(self.output_uri)
        pointer = parse_pointer(data, root)
        if not self._wait().satisfied_by(pointer):
            self.log.info("%s names run %r (mode=%s not satisfied yet); polling again in %ss",
                          self._describe(), pointer.run_id, self.mode, self.poll_interval)
            return None
        # A pointer to a missing or altered manifest is not a snapshot anyone can read, nor is a delta
        # missing a manifest of its chain: the chain walk (core.model.chain) checks every one.
        walk = chain.walk_pointer(pointer, layout.relative_key(root, pointer.manifest_ref), root)
        await chain.adrive(walk, lambda wanted: reader.read(wanted.key))
        return TriggerEvent({"status": "success", "pointer": pointer.to_dict()})
