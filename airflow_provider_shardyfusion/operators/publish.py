"""``PublishSnapshotOperator``: make a staged run live, or roll ``_CURRENT`` back (SPEC §8)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_shardyfusion.assets import emit_snapshot_event, with_snapshot_outlet
from airflow_provider_shardyfusion.hooks.hook_property import WithShardyfusionHook

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

__all__ = ["PublishSnapshotOperator"]


class PublishSnapshotOperator(WithShardyfusionHook, BaseOperator):
    """Move ``_CURRENT`` of ``output_uri`` to a run: publish a staged write, or roll back.

    Before moving anything it checks the run's manifest (structure, every winning shard file
    present with its recorded size) and its run record (``succeeded``, naming that manifest);
    any problem refuses the publish with all of them listed, and ``_CURRENT`` stays as it was.
    The move is a conditional put on the pointer just read: a concurrent publisher makes it
    re-read and decide again. A run that started before the live one is refused unless
    ``allow_older=True`` (a rollback). Publishing the run that is already live is a no-op success.

    On success the run record gets ``published_at``, the new pointer records the run it replaced
    in ``previous_run_id``, and an asset event for ``output_uri`` is emitted when the pointer moved.

    :param output_uri: the snapshot root (``s3://bucket/prefix`` or ``file:///abs/dir``).
    :param run_id: the run to publish (its run record names its manifest) ...
    :param manifest_ref: ... or the manifest's full URI.
    :param allow_older: allow moving ``_CURRENT`` to a run older than the live one (rollback).
    :param aws_conn_id: AWS connection for ``s3://`` roots.

    Returns (XCom) ``{"pointer": {...}, "previous_run_id", "moved", "rollback"}``.
    """

    template_fields: Sequence[str] = ("output_uri", "run_id", "manifest_ref", "allow_older", "aws_conn_id")
    ui_color = "#c8e6c9"

    def __init__(
        self,
        *,
        output_uri: str,
        run_id: str | None = None,
        manifest_ref: str | None = None,
        allow_older: bool = False,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        outlets = list(kwargs.pop("outlets", None) or [])
        # An alias, not the asset itself: the event is added only when the pointer really moved.
        super().__init__(outlets=with_snapshot_outlet(outlets, output_uri, None), **kwargs)
        self.output_uri = output_uri
        self.run_id = run_id
        self.manifest_ref = manifest_ref
        self.allow_older = allow_older
        self.aws_conn_id = aws_conn_id
        self._lineage_result: dict[str, Any] | None = None  # for get_openlineage_facets_on_complete

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core import layout
        from airflow_provider_shardyfusion.core.arguments import as_bool
        from airflow_provider_shardyfusion.core.errors import ConfigError
        from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run

        where = f"PublishSnapshotOperator {self.task_id!r}"
        try:
            root = layout.normalize_root(self.output_uri)
            if self.run_id is None and self.manifest_ref is None:
                raise ConfigError("give run_id or manifest_ref (e.g. the run_id XCom of a staging ShardedWriteOperator)")
            if self.run_id is not None:
                layout.validate_run_id(self.run_id)
            self.allow_older = as_bool("allow_older", self.allow_older)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        snapshots = self.hook.get_snapshots(root)
        result = publish_run(
            snapshots, run_id=self.run_id, manifest_ref=self.manifest_ref, allow_older=self.allow_older,
        )
        pointer = result.pointer
        if result.moved:
            self.log.info("_CURRENT of %s now names run %s (was %s)%s", root, pointer.run_id, result.previous_run_id,
                          "; this is a rollback" if result.rollback else "")
            emit_snapshot_event(context, self.outlets, root, {"run_id": pointer.run_id,
                                                               "manifest_ref": pointer.manifest_ref})
        else:
            self.log.info("Run %s is already live at %s; nothing to do", pointer.run_id, root)
        self._lineage_result = result.to_dict()
        return result.to_dict()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``airflow_provider_shardyfusion.openlineage.publish_lineage``): the snapshot with
        the run now live and the one it replaced; ``None`` without the OpenLineage provider."""
        from airflow_provider_shardyfusion import openlineage as ol

        return ol.publish_lineage(self._lineage_result, self.output_uri)
