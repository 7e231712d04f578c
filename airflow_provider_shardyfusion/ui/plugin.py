"""The Airflow plugin that serves the snapshot history under ``/shardyfusion`` in the API server.

Declared in ``get_provider_info()["plugins"]``. Roots are ``[shardyfusion] history_roots``
(comma-separated) plus the output roots of asset events this provider's operators emitted (see
``event_roots``); storage credentials come from the connection ``[shardyfusion]
history_aws_conn_id``; ``[shardyfusion] history_spark_ui_url`` (e.g.
``https://spark-history.internal/history/{app_id}/``) links each run to its Spark application;
key look-ups keep downloaded shards in ``[shardyfusion] history_cache_dir``.
Every route requires Airflow's own authentication and asset read access.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.core_api.security import requires_access_asset
from airflow.plugins_manager import AirflowPlugin
from airflow.sdk.configuration import conf

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import StorageError
from airflow_provider_shardyfusion.core.lifecycle.history import run_claim_holds
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.storage.s3 import S3Store, make_s3_client
from airflow_provider_shardyfusion.ui.app import ROOT_DEADLINE_S, HistorySource, Unanswered, create_app, within

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

__all__ = [
    "CLAIM_CHECK_DEADLINE_S", "HISTORY_S3_RETRY", "HISTORY_S3_TIMEOUTS_S", "SNAPSHOT_OPERATORS", "ShardyfusionHistoryPlugin",
    "all_roots", "app", "cache_dir", "configured_roots", "event_claims", "event_roots", "open_reader", "open_root",
]

log = logging.getLogger(__name__)

# How long the roots list waits to check new events against their roots: with the page's own
# deadline for reading the roots, an unreachable store keeps the roots page well under 10 s.
CLAIM_CHECK_DEADLINE_S = 2.0
# The operators whose asset events describe a snapshot (``assets.emit_snapshot_event``): class
# name -> the module defining it (tests check these against the classes).
SNAPSHOT_OPERATORS = {
    "ShardedWriteOperator": "airflow_provider_shardyfusion.operators.sharded_write",
    "PublishSnapshotOperator": "airflow_provider_shardyfusion.operators.publish",
    "StreamingSnapshotOperator": "airflow_provider_shardyfusion.operators.streaming_snapshot",
}


def configured_roots() -> list[str]:
    text = conf.get("shardyfusion", "history_roots", fallback="") or ""
    return [r.strip() for r in text.split(",") if r.strip()]


def event_claims() -> dict[str, tuple[str, str]]:
    """Per asset URI, the newest ``(run_id, manifest_ref)`` an event emitted by a task of this
    provider's operators says of it. Events posted through the REST API have no source task and
    never count: anyone allowed to post one could otherwise point the API server, with the
    history connection's credentials, at any place. Nor does a task of another class that merely
    has an operator's name: the module its DAG version records for the task must be ours too."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import and_, select

    source_task = and_(TaskInstance.dag_id == AssetEvent.source_dag_id, TaskInstance.run_id == AssetEvent.source_run_id,
                       TaskInstance.task_id == AssetEvent.source_task_id,
                       TaskInstance.map_index == AssetEvent.source_map_index)
    query = (select(AssetModel.uri, AssetEvent.extra, TaskInstance.operator, TaskInstance.dag_version_id,
                    TaskInstance.task_id)
             .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
             .join(TaskInstance, source_task).where(TaskInstance.operator.in_(list(SNAPSHOT_OPERATORS)))
             .order_by(AssetEvent.timestamp))
    claims: dict[str, tuple[str, str]] = {}
    with create_session() as session:
        for uri, extra, operator, dag_version_id, task_id in session.execute(query):
            if not (isinstance(extra, dict) and isinstance(extra.get("run_id"), str)
                    and isinstance(extra.get("manifest_ref"), str)):
                continue
            if _ours(session, operator, dag_version_id, task_id, uri):
                claims[uri] = (extra["run_id"], extra["manifest_ref"])
    return claims


def _ours(session: Any, operator: str, dag_version_id: Any, task_id: str, uri: str) -> bool:
    """Whether the task named ``operator`` is this provider's class of that name (its module as
    recorded by the task's DAG version)."""
    module = _task_module(session, dag_version_id, task_id)
    if module == SNAPSHOT_OPERATORS[operator]:
        return True
    log.warning("shardyfusion history: an event on %s is not counted: its task %s is a %s of module %s, not this "
                "provider's", uri, task_id, operator, module)
    return False


# (DAG version, task id) -> the module of the task's class, as that DAG version recorded it: a
# version's serialized DAG never changes, so an answer holds for the life of the process.
_task_modules: dict[tuple[str, str], str | None] = {}


def _task_module(session: Any, dag_version_id: Any, task_id: str) -> str | None:
    """The module of task ``task_id``'s class in the serialized DAG of ``dag_version_id`` (what
    Airflow's REST API shows as the task's ``class_ref.module_path``), None when not recorded."""
    from airflow.models.serialized_dag import SerializedDagModel
    from sqlalchemy import select

    if dag_version_id is None:
        return None
    key = (str(dag_version_id), task_id)
    if key not in _task_modules:
        row = session.scalar(select(SerializedDagModel).where(SerializedDagModel.dag_version_id == dag_version_id))
        tasks = ((row.data if row is not None else None) or {}).get("dag", {}).get("tasks", [])
        found = None
        for task in tasks:
            fields = task.get("__var", task) if isinstance(task, dict) else {}
            if isinstance(fields, dict) and fields.get("task_id") == task_id:
                found = fields.get("_task_module")
                break
        _task_modules[key] = found if isinstance(found, str) else None
    return _task_modules[key]


# (root, run_id, manifest_ref) -> whether the root's record of the run names that manifest: a
# record's manifest never changes, so an answer holds for the life of the process.
_checked_claims: dict[tuple[str, str, str], bool] = {}


def event_roots() -> list[str]:
    """Roots of ``event_claims`` whose own run record confirms the event. A root whose storage
    does not answer stays listed (a task of ours emitted its event) and is checked again later."""
    claims = event_claims()
    unchecked = {uri: claim for uri, claim in claims.items() if (uri, *claim) not in _checked_claims}
    outcomes = within(CLAIM_CHECK_DEADLINE_S, {uri: functools.partial(_claim_holds, uri, *c) for uri, c in unchecked.items()})
    for uri, outcome in outcomes.items():
        if isinstance(outcome, bool):
            _checked_claims[(uri, *claims[uri])] = outcome
            if not outcome:
                log.warning("shardyfusion history: %s is not listed: its record of run %s does not name %s",
                            uri, *claims[uri])
        elif not isinstance(outcome, StorageError | Unanswered):
            raise outcome
    return sorted(uri for uri, claim in claims.items() if _checked_claims.get((uri, *claim), True))


def _claim_holds(uri: str, run_id: str, manifest_ref: str) -> bool:
    return run_claim_holds(open_root(uri), run_id, manifest_ref)


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


# S3 calls of the history give up about when the page does (ROOT_DEADLINE_S): 2 s to connect, 3 s
# for each read of the answer, one attempt and no retry past the deadline; otherwise a store that
# does not answer keeps a thread of the API server for botocore's minutes of timeouts and retries.
HISTORY_S3_TIMEOUTS_S = (2.0, 3.0)
HISTORY_S3_RETRY = RetryPolicy(attempts=2, base_delay_s=0.2, max_delay_s=0.5, deadline_s=ROOT_DEADLINE_S)

def open_root(uri: str) -> SnapshotRoot:
    """The root read with the history connection's credentials; on S3 with short timeouts."""
    if not layout.normalize_root(uri).startswith("s3://"):
        return _hook().get_snapshots(uri)
    options = dataclasses.replace(_hook().storage_options(uri), max_attempts=1)
    client = make_s3_client(options, timeouts_s=HISTORY_S3_TIMEOUTS_S)
    return SnapshotRoot(S3Store(uri, options, client=client, retry=HISTORY_S3_RETRY))


def cache_dir() -> str:
    """Where key look-ups keep downloaded shards: one place for every request, so a shard is
    downloaded once, not once per request."""
    return conf.get("shardyfusion", "history_cache_dir", fallback=None) or os.path.join(
        tempfile.gettempdir(), "shardyfusion-history-cache")


def open_reader(uri: str, manifest_ref: str) -> ShardedReader:
    # The pages show values as JSON: as stored, not typed Python values.
    return _hook().get_reader(uri, manifest_ref=manifest_ref, cache_dir=cache_dir(), value_decoding="json")


app = create_app(
    HistorySource(roots=all_roots, open_root=open_root, open_reader=open_reader,
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
