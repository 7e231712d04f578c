"""``DeferredCleanupOperator``: remove what no reader can need any more under an output root (SPEC §8)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_shardyfusion.hooks.hook_property import WithShardyfusionHook

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

__all__ = ["DeferredCleanupOperator"]


class DeferredCleanupOperator(WithShardyfusionHook, BaseOperator):
    """Delete failed, abandoned, orphaned and expired snapshot data under ``output_uri``.

    The plan is a pure function in ``core.lifecycle.cleanup_plan`` of the listing, the run records, ``_CURRENT``
    and the time; this operator reads, plans and executes it. Never touched: the run ``_CURRENT``
    names (re-read before deleting; if it moved, the cleanup stops and deletes nothing more), runs
    in ``keep_run_ids``, anything younger than ``grace_period``, and a ``running`` run whose lease
    is valid. Deleted: losing attempts of kept runs; all data of ``failed`` runs, of ``running``
    runs whose lease expired more than ``grace_period`` ago (marked failed, "abandoned", first)
    and of shard folders without a run record; data and manifests of succeeded (or staged) runs
    beyond the newest ``keep_runs``. Run records stay, with ``deleted_at`` set.

    :param output_uri: the snapshot root (``s3://bucket/prefix`` or ``file:///abs/dir``).
    :param keep_runs: how many of the newest succeeded runs (by start) keep their data; the live
        run and pinned runs are kept in addition.
    :param grace_period: a ``timedelta`` (or seconds), at most 100 years: nothing younger is touched.
    :param keep_run_ids: runs readers are pinned to.
    :param dry_run: plan and report only; nothing is written or deleted.
    :param aws_conn_id: AWS connection for ``s3://`` roots.

    Returns (XCom) the report: objects and bytes deleted per category, errors, whether the
    cleanup was abandoned, and the plan (the same plan a dry run returns).
    """

    template_fields: Sequence[str] = ("output_uri", "keep_runs", "grace_period", "keep_run_ids", "dry_run",
                                      "aws_conn_id")
    ui_color = "#ffe0b2"

    def __init__(
        self,
        *,
        output_uri: str,
        keep_runs: int = 3,
        grace_period: timedelta = timedelta(hours=1),
        keep_run_ids: Sequence[str] = (),
        dry_run: bool = False,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_uri = output_uri
        self.keep_runs = keep_runs
        self.grace_period = grace_period
        self.keep_run_ids = keep_run_ids
        # SPEC §8.1 names the argument dry_run, which shadows BaseOperator.dry_run() (a template
        # rendering preview); the argument must stay an attribute of that name to be templated.
        self.dry_run = dry_run  # type: ignore[method-assign,assignment]
        self.aws_conn_id = aws_conn_id
        self._lineage_report: dict[str, Any] | None = None  # for get_openlineage_facets_on_complete

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core import layout
        from airflow_provider_shardyfusion.core.arguments import as_bool
        from airflow_provider_shardyfusion.core.errors import ConfigError
        from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
        from airflow_provider_shardyfusion.core.lifecycle.cleanup_plan import check_settings

        try:
            root = layout.normalize_root(self.output_uri)
            keep_runs, grace, pinned = check_settings(self.keep_runs, self.grace_period, self.keep_run_ids)
            dry_run = as_bool("dry_run", self.dry_run)
        except ConfigError as exc:
            raise ConfigError(f"DeferredCleanupOperator {self.task_id!r}: {exc}") from None
        snapshots = self.hook.get_snapshots(root)
        plan = make_plan(snapshots, keep_runs=keep_runs, grace_period=grace, keep_run_ids=pinned)
        report = execute_cleanup(snapshots, plan, dry_run=dry_run)
        out = report.to_dict()
        self.log.info(
            "Cleanup of %s%s: %d object(s), %d bytes %s; %d error(s)%s", root, " (dry run)" if dry_run else "",
            out["plan"]["objects"] if dry_run else out["deleted_objects"],
            out["plan"]["bytes"] if dry_run else out["deleted_bytes"],
            "would be deleted" if dry_run else "deleted", len(out["errors"]),
            f"; abandoned: {report.abandon_reason}" if report.abandoned else "",
        )
        self._lineage_report = out
        report.raise_if_nothing_deleted()
        return out

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``airflow_provider_shardyfusion.openlineage.cleanup_lineage``): each run whose
        data went, dropped (``lifecycleStateChange: DROP``); ``None`` without the OpenLineage provider."""
        from airflow_provider_shardyfusion import openlineage as ol

        return ol.cleanup_lineage(self._lineage_report)
