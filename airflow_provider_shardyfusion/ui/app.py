"""The snapshot history app (SPEC §16): FastAPI routes, each an HTML page with a JSON twin.

``create_app`` takes where roots come from and how a root is opened, so the Airflow plugin
(``ui/plugin.py``) wires in the metadata DB, ``[shardyfusion]`` settings and Airflow's own auth,
and tests wire in real stores. Only listed roots are served: a URI in a query string never makes
the API server read a place nobody published to. Read-only: nothing here writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardyfusionError
from airflow_provider_shardyfusion.core.history import RootHistory, diff_runs, root_history
from airflow_provider_shardyfusion.ui import render

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.snapshot import SnapshotRoot

# The key look-up opens one shard per run: the newest runs by default, more on request.
KEY_LOOKUP_RUNS = 20
MAX_KEY_LOOKUP_RUNS = 500
_VALUE_PREVIEW_CHARS = 200


class HistorySource:
    """Where the pages' data comes from: the listed roots, how to open a root and a pinned reader."""

    def __init__(self, roots: Callable[[], list[str]], open_root: Callable[[str], SnapshotRoot],
                 open_reader: Callable[[str, str], Any], spark_ui_template: str | None = None):
        self.roots, self.open_root, self.open_reader = roots, open_root, open_reader
        # e.g. "https://spark-history.internal/history/{app_id}/": the link for runs whose writer
        # recorded no UI address (Spark Connect clients, drivers with the UI off, finished apps).
        self.spark_ui_template = spark_ui_template

    def known(self, uri: str) -> str:
        listed = {r.rstrip("/"): r for r in self.roots()}
        if uri.rstrip("/") not in listed:
            raise HTTPException(status_code=404, detail=f"{uri!r} is not a known snapshot root")
        return listed[uri.rstrip("/")]

    def history(self, uri: str, snapshots: SnapshotRoot | None = None) -> RootHistory:
        """The root's history: one listing of its runs, each record read once, ``_CURRENT`` once."""
        try:
            return root_history(snapshots if snapshots is not None else self.open_root(uri))
        except ShardyfusionError as exc:
            raise HTTPException(status_code=502, detail=f"{uri}: {exc}") from None

    def roots_data(self) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for uri in self.roots():
            try:
                out.append(self._root_summary(uri))
            except ShardyfusionError as exc:
                out.append({"root": uri, "error": str(exc)})
        return {"roots": out}

    def _root_summary(self, uri: str) -> dict[str, Any]:
        """The live run of a root at a glance: since when, rows, bytes, chain depth, last validation."""
        snapshots = self.open_root(uri)
        h = root_history(snapshots)
        live = next((r for r in h.runs if r.state == "live"), None)
        summary: dict[str, Any] = {"root": uri, "live_run_id": h.live_run_id, "live_since": _ts_text(h.live_since),
                                   "runs": len(h.runs), "rows": live.rows if live else None,
                                   "bytes": live.bytes if live else None, "chain_depth": None, "age_s": None,
                                   "last_validation": None}
        if h.live_since is not None:
            summary["age_s"] = round((layout.utc_now() - h.live_since).total_seconds())
        if h.pointer is not None:
            summary["chain_depth"] = snapshots.load_manifest(h.pointer).chain_depth
        validated = [r for r in h.runs if r.validation]
        if validated:
            last = max(validated, key=lambda r: str((r.validation or {}).get("validated_at") or ""))
            report = last.validation or {}
            summary["last_validation"] = {"run_id": last.run_id, "ok": report.get("ok"),
                                          "validated_at": report.get("validated_at")}
        return summary

    def run_data(self, uri: str, run_id: str) -> dict[str, Any]:
        snapshots = self.open_root(uri)
        entry = next((r for r in self.history(uri, snapshots).runs if r.run_id == run_id), None)
        if entry is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r} under {uri}")
        data: dict[str, Any] = {"root": uri, "run": entry.to_dict(), "shards": [], "links": {}}
        if entry.manifest_ref is None or entry.state in ("deleted", "unreadable"):
            return data
        manifest = snapshots.read_manifest(entry.manifest_ref)  # the one its record names: no listing
        shards: list[dict[str, Any]] = [{"db_id": s.db_id, "rows": s.row_count, "bytes": s.byte_size, "files": len(s.files),
                   "layers": [{"run_id": x.run_id, "kind": x.kind, "bytes": x.byte_size, "inserted": x.inserted,
                               "updated": x.updated, "deleted": x.deleted, "deleted_absent": x.deleted_absent}
                              for x in s.layers]}
                  for s in manifest.shards]
        mean = manifest.row_count / manifest.num_dbs if manifest.num_dbs else 0
        data.update(shards=shards, num_dbs=manifest.num_dbs, spark_app_id=manifest.writer.get("spark_app_id"),
                    write_mode=manifest.write_mode, base_run_id=manifest.base_run_id, chain_depth=manifest.chain_depth,
                    skew=round(max(s.row_count for s in manifest.shards) / mean, 3) if shards and mean else None)
        app_id = manifest.writer.get("spark_app_id")
        if self.spark_ui_template and app_id:
            data["links"]["Spark application (history server)"] = self.spark_ui_template.format(app_id=quote(str(app_id)))
        if manifest.writer.get("spark_ui_url"):
            data["links"]["Spark application UI"] = str(manifest.writer["spark_ui_url"])
        task = entry.airflow
        if task.get("dag_id") and task.get("run_id") and task.get("task_id"):
            parts = [quote(str(task[k]), safe="") for k in ("dag_id", "run_id", "task_id")]
            data["links"]["Airflow task"] = "/dags/{}/runs/{}/tasks/{}".format(*parts)
        return data

    def diff_data(self, uri: str, a: str, b: str) -> dict[str, Any]:
        try:
            return diff_runs(self.open_root(uri), a, b).to_dict()
        except ShardyfusionError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    def key_data(self, uri: str, key: str, limit: int = KEY_LOOKUP_RUNS) -> dict[str, Any]:
        """``key`` in the newest ``limit`` retained runs (not deleted, failed or running)."""
        # Each run's manifest is the one its record names: no listing of manifests per run.
        runs = [r for r in self.history(uri).runs if r.manifest_ref and r.state not in ("deleted", "running", "failed")]
        found = [{"run_id": r.run_id, "state": r.state, **_look_up(self.open_reader, uri, str(r.manifest_ref), key)}
                 for r in runs[:limit]]
        return {"root": uri, "key": key, "runs": found, "retained_runs": len(runs), "limit": limit,
                "max_limit": MAX_KEY_LOOKUP_RUNS}


def create_app(source: HistorySource, *, auth: Callable[..., Any] | None = None) -> FastAPI:
    """The app over ``source``; ``auth`` is the dependency every route requires (Airflow's asset
    read access in the plugin). ``?format=json`` gives each page's JSON twin."""
    app = FastAPI(title="shardyfusion snapshot history", dependencies=[Depends(auth)] if auth else [],
                  docs_url=None, redoc_url=None, openapi_url=None)

    def respond(data: dict[str, Any], fmt: str, html: Callable[[dict[str, Any]], str]) -> Any:
        return JSONResponse(data) if fmt == "json" else HTMLResponse(html(data))

    @app.get("/")
    def roots_view(format: str = Query("html")) -> Any:
        return respond(source.roots_data(), format, render.roots_page)

    @app.get("/root")
    def timeline(uri: str, format: str = Query("html")) -> Any:
        return respond(source.history(source.known(uri)).to_dict(), format, render.timeline_page)

    @app.get("/run")
    def run_view(uri: str, run_id: str, format: str = Query("html")) -> Any:
        return respond(source.run_data(source.known(uri), run_id), format, render.run_page)

    @app.get("/diff")
    def diff_view(uri: str, a: str, b: str, format: str = Query("html")) -> Any:
        return respond(source.diff_data(source.known(uri), a, b), format, render.diff_page)

    @app.get("/key")
    def key_view(uri: str, key: str, format: str = Query("html"),
                 limit: int = Query(KEY_LOOKUP_RUNS, ge=1, le=MAX_KEY_LOOKUP_RUNS)) -> Any:
        return respond(source.key_data(source.known(uri), key, limit), format, render.key_page)

    return app


def _look_up(open_reader: Callable[[str, str], Any], root: str, manifest_ref: str, text: str) -> dict[str, Any]:
    try:
        with open_reader(root, manifest_ref) as reader:
            key: Any = text
            if reader.manifest.key_encoding in ("u64be", "u32be") and text.lstrip("-").isdigit():
                key = int(text)
            elif reader.manifest.key_encoding == "raw":
                key = text.encode()
            value = reader.get(key)
    except (ShardyfusionError, ValueError, TypeError) as exc:
        return {"found": None, "error": f"{type(exc).__name__}: {exc}"}
    if value is None:
        return {"found": False, "value": None}
    shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return {"found": True, "value": shown[:_VALUE_PREVIEW_CHARS]}


def _ts_text(value: Any) -> str | None:
    return layout.format_ts(value) if value is not None else None
