"""The poke-then-defer shape both shardyfusion sensors share.

``execute`` validates the rendered arguments, pokes once (a finished run or a present pointer
answers at once, without a trip through the triggerer), and only then defers; a sensor that is
not deferrable runs the ordinary poke loop of ``BaseSensorOperator``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_shardyfusion.hooks.hook_property import WithShardyfusionHook

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger



class PokeThenDeferSensor(WithShardyfusionHook, BaseSensorOperator):
    """Subclasses provide ``_validate`` (returns the normalized root), ``_trigger`` and ``_on_event``."""

    deferrable: bool
    aws_conn_id: str | None

    def _validate(self) -> str:
        raise NotImplementedError

    def _trigger(self, root: str) -> BaseTrigger:
        raise NotImplementedError

    def _on_event(self, event: dict[str, Any]) -> Any:
        """The XCom value for a trigger event; raises for an error event."""
        raise NotImplementedError

    def execute(self, context: Context) -> Any:
        root = self._validate()
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first:
            return first.xcom_value if isinstance(first, PokeReturnValue) else None
        self.defer(trigger=self._trigger(root), method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not event:
            from airflow_provider_shardyfusion.core.errors import ShardyfusionError

            raise ShardyfusionError(f"{type(self).__name__} {self.task_id!r} resumed without a trigger event")
        return self._on_event(event)
