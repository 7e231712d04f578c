"""The Airflow plugin that serves the snapshot history under ``/shardyfusion`` in the API server.

Declared in ``get_provider_info()["plugins"]``. Roots are the output URIs of the provider's asset
events (events whose extra carries a ``manifest_ref``) plus ``[shardyfusion] history_roots``
(comma-separated); storage credentials come from the connection ``[shardyfusion]
history_aws_conn_id``; ``[shardyfusion] history_spark_ui_url`` (e.g.
``https://spark-history.internal/history/{app_id}/``) links each run to its Spark application.
Every route requires Airflow's own authentication and asset read access.
"""

from __future__ import annotations

import logging
import threading
import time
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


# One hook (its connection looked up once) serves the requests of a minute: a key look-up opens
# a reader per run, and a connection changed in Airflow is seen within that minute.
_HOOK_TTL_S = 60.0
_hook_lock = threading.Lock()
_cached_hook: tuple[str | None, float, Any] | None = None  # (connection id, made at, hook)


def _hook() -> Any:
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

    conn_id = conf.get("shardyfusion", "history_aws_conn_id", fallback=None) or None
    global _cached_hook
    with _hook_lock:
        cached = _cached_hook
        if cached is None or cached[0] != conn_id or time.monotonic() - cached[1] > _HOOK_TTL_S:
            cached = _cached_hook = (conn_id, time.monotonic(), ShardyfusionHook(aws_conn_id=conn_id))
        return cached[2]


app = create_app(
    HistorySource(roots=all_roots, open_root=lambda uri: _hook().get_snapshots(uri),
                  open_reader=lambda uri, manifest_ref: _hook().get_reader(uri, manifest_ref=manifest_ref),
                  spark_ui_template=conf.get("shardyfusion", "history_spark_ui_url", fallback=None) or None),
    auth=requires_access_asset(method="GET"),
)


class ShardyfusionHistoryPlugin(AirflowPlugin):
    """Snapshot history pages (roots, timelines, runs, diffs, key look-ups) in the Airflow UI."""

    name = "shardyfusion"
    # Airflow's own plugins declare these as plain class lists; RUF012 does not know the base class.
    fastapi_apps = [{"app": app, "url_prefix": "/shardyfusion", "name": "shardyfusion snapshot history"}]  # noqa: RUF012
    external_views = [{"name": "Snapshots", "href": "/shardyfusion/", "destination": "nav",  # noqa: RUF012
                       "url_route": "shardyfusion-snapshots", "category": "browse"}]
