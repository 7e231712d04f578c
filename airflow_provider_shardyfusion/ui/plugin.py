"""The Airflow plugin that serves the snapshot history under ``/shardyfusion`` in the API server.

Declared in ``get_provider_info()["plugins"]``. Roots are the output URIs of the provider's asset
events (events whose extra carries a ``manifest_ref``) plus ``[shardyfusion] history_roots``
(comma-separated); storage credentials come from the connection ``[shardyfusion]
history_aws_conn_id``. Every route requires Airflow's own authentication and asset read access.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.api_fastapi.core_api.security import requires_access_asset
from airflow.plugins_manager import AirflowPlugin
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.ui.app import HistorySource, create_app

log = logging.getLogger(__name__)


def configured_roots() -> list[str]:
    text = conf.get("shardyfusion", "history_roots", fallback="") or ""
    return [r.strip() for r in text.split(",") if r.strip()]


def event_roots() -> list[str]:
    """Roots the provider's operators emitted asset events for (their extra names a manifest)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(AssetModel.uri, AssetEvent.extra).join(AssetEvent, AssetEvent.asset_id == AssetModel.id))
        return sorted({uri for uri, extra in rows if isinstance(extra, dict) and extra.get("manifest_ref")})


def all_roots() -> list[str]:
    found = list(configured_roots())
    try:
        found += [r for r in event_roots() if r not in found]
    except Exception as exc:  # the page still lists the configured roots
        log.warning("shardyfusion history: asset events not readable: %s", exc)
    return found


def _hook() -> Any:
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

    return ShardyfusionHook(aws_conn_id=conf.get("shardyfusion", "history_aws_conn_id", fallback=None) or None)


app = create_app(
    HistorySource(roots=all_roots, open_root=lambda uri: _hook().get_snapshots(uri),
                  open_reader=lambda uri, manifest_ref: _hook().get_reader(uri, manifest_ref=manifest_ref)),
    auth=requires_access_asset(method="GET"),
)


class ShardyfusionHistoryPlugin(AirflowPlugin):
    """Snapshot history pages (roots, timelines, runs, diffs, key look-ups) in the Airflow UI."""

    name = "shardyfusion"
    # Airflow's own plugins declare these as plain class lists; RUF012 does not know the base class.
    fastapi_apps = [{"app": app, "url_prefix": "/shardyfusion", "name": "shardyfusion snapshot history"}]  # noqa: RUF012
    external_views = [{"name": "Snapshots", "href": "/shardyfusion/", "destination": "nav",  # noqa: RUF012
                       "url_route": "shardyfusion-snapshots", "category": "browse"}]
