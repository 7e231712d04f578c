"""The asset policy of a snapshot: which outlet a task declares, and which event it emits.

A snapshot's asset is its normalized output root. An event means "a new snapshot went live", so:

- ``ShardedWriteOperator(publish=True)`` declares the ``Asset`` itself (Airflow emits its event
  on every success; a superseded run's event says ``published: false`` in its extra);
- ``publish=False`` declares nothing: a staged run is not live, ``PublishSnapshotOperator``
  emits the event when it goes live;
- a templated ``publish`` (known only in ``execute``) and ``PublishSnapshotOperator`` declare an
  ``AssetAlias``, and add the event through it only when the run really went live.

Both operators import these functions; importing them is light (no Spark, no boto3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

from airflow_provider_shardyfusion.core import layout

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow.sdk import Context

__all__ = ["ALIAS_PREFIX", "emit_snapshot_event", "snapshot_alias", "snapshot_asset", "with_snapshot_outlet"]

ALIAS_PREFIX = "shardyfusion-snapshot:"


def snapshot_asset(output_uri: Any) -> Asset | None:
    """Asset for a concrete output URI; templated or invalid URIs get none (validated in execute)."""
    if not isinstance(output_uri, str) or "{{" in output_uri or "{%" in output_uri:
        return None
    try:
        return Asset(layout.normalize_root(output_uri))
    except Exception:
        return None


def snapshot_alias(asset: Asset) -> AssetAlias:
    """The alias that carries the event of ``asset`` when only ``execute`` knows whether it went live."""
    return AssetAlias(name=f"{ALIAS_PREFIX}{asset.uri}")


def with_snapshot_outlet(outlets: list[Any], output_uri: Any, publish: Any) -> list[Any]:
    """``outlets`` plus the snapshot's outlet for a task whose run goes live when ``publish`` is True.

    ``publish=False``: none (nothing goes live). ``publish=True``: the ``Asset``. Anything else
    (a template, or ``None`` for a publish operator): the ``AssetAlias``.
    """
    asset = snapshot_asset(output_uri)
    if asset is None or publish is False:
        return outlets
    if publish is True:
        if all(getattr(o, "uri", None) != asset.uri for o in outlets):
            outlets.append(asset)
        return outlets
    return [*outlets, snapshot_alias(asset)]


def emit_snapshot_event(context: Context, outlets: Sequence[Any], output_uri: str, summary: Mapping[str, Any], *,
                        live: bool = True) -> None:
    """Attach ``summary`` as the event's extra. A declared ``Asset`` outlet's event is emitted on
    every success, so a superseded run's event cannot be withheld: its extra says ``published:
    false`` and ``superseded_by``. Through the alias, only a run that went ``live`` emits."""
    asset = snapshot_asset(output_uri)
    if asset is None:
        return
    alias = snapshot_alias(asset)
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri == asset.uri:
            context["outlet_events"][outlet].extra = dict(summary)
        elif isinstance(outlet, AssetAlias) and outlet.name == alias.name and live:
            context["outlet_events"][outlet].add(asset, extra=dict(summary))
