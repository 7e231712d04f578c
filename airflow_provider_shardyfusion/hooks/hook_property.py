"""The ``hook`` property every operator and sensor of the provider shares."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

__all__ = ["WithShardyfusionHook"]


class WithShardyfusionHook:
    """Mixin: ``self.hook``, the storage hook of ``self.aws_conn_id``, created on first use in the
    worker (the hook module is imported there, never at DAG-parse time)."""

    aws_conn_id: str | None

    @cached_property
    def hook(self) -> ShardyfusionHook:
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        return ShardyfusionHook(aws_conn_id=self.aws_conn_id)
