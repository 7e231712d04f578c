"""The snapshot history app (SPEC §16): FastAPI routes, each an HTML page with a JSON twin.

``create_app`` takes where roots come from and how a root is opened, so the Airflow plugin
(``ui/plugin.py``) wires in the metadata DB, ``[shardyfusion]`` settings and Airflow's own auth,
and tests wire in real stores. Only listed roots are served: a URI in a query string never makes
the API server read a place nobody published to. Read-only: nothing here writes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError, ObjectNotFoundError, ShardyfusionError
from airflow_provider_shardyfusion.core.lifecycle.history import (
    CHANGE_KINDS,
    ChangeKind,
    RootHistory,
    ShardSample,
    comparison_between,
    diff_runs,
    json_value,
    key_fates,
    rank_fields,
    root_history,
    sample_changes,
    schema_columns,
    shown_values,
    spread,
    typed_comparison,
)
from airflow_provider_shardyfusion.core.model.encoding import KeyText, key_from_text
from airflow_provider_shardyfusion.core.write.job_contract import WriterIdentity
from airflow_provider_shardyfusion.ui import render

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.responses import Response

    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

__all__ = [
    "CHANGES_PAGE_KEYS", "CHANGES_PAGE_SCAN_KEYS", "KEY_LOOKUP_BYTE_BUDGET", "KEY_LOOKUP_RUNS", "MAX_KEY_LOOKUP_RUNS",
    "ROOT_DEADLINE_S", "SAMPLE_KIND_KEYS", "SAMPLE_SHARDS", "HistorySource", "Unanswered", "create_app", "within",
]

T = TypeVar("T")

# The key look-up opens one shard per run: the newest runs by default, more on request.
KEY_LOOKUP_RUNS = 20
MAX_KEY_LOOKUP_RUNS = 500
# Shard bytes one key look-up may download; shards already in the cache cost nothing, so asking
# again goes further. The last shard read may pass the budget by its own size.
KEY_LOOKUP_BYTE_BUDGET = 256 * 1024 * 1024
# A run or diff page samples changed keys of each kind from up to SAMPLE_SHARDS shards spread over
# the changed ones, and shows up to SAMPLE_KIND_KEYS keys of each kind.
SAMPLE_SHARDS = 8
SAMPLE_KIND_KEYS = 20
# A "more" page lists CHANGES_PAGE_KEYS keys of one kind, walking at most CHANGES_PAGE_SCAN_KEYS
# stored keys; where it stopped is the next page's start.
CHANGES_PAGE_KEYS = 50
CHANGES_PAGE_SCAN_KEYS = 100_000
# How long a page waits for the storage of a root: an unreachable store (no answer, refused
# connections) costs the page this much, not the storage client's own minutes of retries.
ROOT_DEADLINE_S = 5.0


class Unanswered(Exception):
    """A root's storage did not answer within the page's deadline."""


def within(deadline_s: float, calls: dict[str, Callable[[], T]]) -> dict[str, T | Exception]:
    """Each call's result or exception, all run at once; ``Unanswered`` for those still running at
    the deadline. Those are left to finish on their own (a thread blocked on a socket cannot be
    stopped) and their results are dropped."""
    results: dict[str, T | Exception] = {}
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def run(name: str, call: Callable[[], T]) -> None:
        try:
            outcome: T | Exception = call()
        except Exception as exc:
            outcome = exc
        with lock:
            results[name] = outcome
        done.release()

    for name, call in calls.items():
        threading.Thread(target=run, args=(name, call), name=f"shardyfusion-history {name}", daemon=True).start()
    end = time.monotonic() + deadline_s
    for _ in calls:
        if not done.acquire(timeout=max(0.0, end - time.monotonic())):
            break
    with lock:
        return {name: results.get(name, Unanswered(f"no answer within {deadline_s:g} s")) for name in calls}


class HistorySource:
    """Where the pages' data comes from: the listed roots, how to open a root and a pinned reader."""

    def __init__(self, roots: Callable[[], list[str]], open_root: Callable[[str], SnapshotRoot],
                 open_reader: Callable[[str, str], Any], spark_ui_template: str | None = None, *,
                 deadline_s: float = ROOT_DEADLINE_S, key_byte_budget: int = KEY_LOOKUP_BYTE_BUDGET):
        self.roots, self.open_root, self.open_reader = roots, open_root, open_reader
        # e.g. "https://spark-history.internal/history/{app_id}/": the link for runs whose writer
        # recorded no UI address (Spark Connect clients, drivers with the UI off, finished apps).
        self.spark_ui_template = spark_ui_template
        self.deadline_s, self.key_byte_budget = deadline_s, key_byte_budget

    def bounded(self, uri: str, call: Callable[[], T]) -> T:
        """``call()`` (reads of root ``uri``) within the deadline: 504 naming the root if its storage
        does not answer, 502 with the reason if it fails."""
        outcome = within(self.deadline_s, {uri: call})[uri]
        if isinstance(outcome, Unanswered):
            raise HTTPException(status_code=504, detail=f"{uri}: storage unreachable ({outcome})")
        if isinstance(outcome, ShardyfusionError):
            raise HTTPException(status_code=502, detail=f"{uri}: {outcome}")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def known(self, uri: str) -> str:
        listed = {r.rstrip("/"): r for r in self.roots()}
        if uri.rstrip("/") not in listed:
            raise HTTPException(status_code=404, detail=f"{uri!r} is not a known snapshot root")
        return listed[uri.rstrip("/")]

    def history(self, uri: str) -> RootHistory:
        """The root's history: one listing of its runs, each record read once, ``_CURRENT`` once."""
        return self.bounded(uri, lambda: root_history(self.open_root(uri)))

    def roots_data(self) -> dict[str, Any]:
        """Every root's summary, read all at once within one deadline; a root that failed or did not
        answer says so in its row, and the others still show."""
        roots = self.roots()
        summaries = within(self.deadline_s, {uri: functools.partial(self._root_summary, uri) for uri in roots})
        out: list[dict[str, Any]] = []
        for uri in roots:
            summary = summaries[uri]
            if isinstance(summary, Unanswered):
                out.append({"root": uri, "error": f"storage unreachable ({summary})"})
            elif isinstance(summary, ShardyfusionError):
                out.append({"root": uri, "error": str(summary)})
            elif isinstance(summary, Exception):
                raise summary
            else:
                out.append(summary)
        return {"roots": out}

    def _root_summary(self, uri: str) -> dict[str, Any]:
        """The live run of a root at a glance: since when, rows, bytes, chain depth, the live run's last
        validation, the latest failed run; or that nothing of a snapshot root is there."""
        snapshots = self.open_root(uri)
        h = root_history(snapshots)
        live = next((r for r in h.runs if r.state == "live"), None)
        summary: dict[str, Any] = {"root": uri, "exists": h.exists, "live_run_id": h.live_run_id,
                                   "live_since": _ts_text(h.live_since), "runs": len(h.runs),
                                   "rows": live.rows if live else None, "bytes": live.bytes if live else None,
                                   "chain_depth": h.live_manifest.chain_depth if h.live_manifest else None,
                                   "age_s": None, "last_validation": None, "latest_failure": None}
        if not h.exists:
            summary["error"] = "nothing here: no run records and no _CURRENT (a wrong URI, or nothing written yet)"
        elif h.live_manifest_error:
            summary["error"] = f"the live run's manifest cannot be read: {h.live_manifest_error}"
        if h.live_since is not None:
            summary["age_s"] = round((layout.utc_now() - h.live_since).total_seconds())
        if live is not None and live.validation:
            summary["last_validation"] = {"run_id": live.run_id, "ok": live.validation.get("ok"),
                                          "validated_at": live.validation.get("validated_at")}
        failed = next((r for r in h.runs if r.state == "failed"), None)  # runs are newest first
        if failed is not None:
            summary["latest_failure"] = {"run_id": failed.run_id, "at": _ts_text(failed.finished_at or failed.started_at),
                                         "error_type": (failed.error or "").split(":", 1)[0] or None}
        return summary

    def run_data(self, uri: str, run_id: str) -> dict[str, Any]:
        data, sample = self.bounded(uri, lambda: self._run_data(uri, run_id))
        if sample is not None:  # under a deadline of its own: a slow download never costs the page
            data["samples"] = self.samples(uri, *sample)
        return data

    def _run_data(self, uri: str, run_id: str) -> tuple[dict[str, Any], tuple[str, str, Changed] | None]:
        """The run page, and what to sample its changed keys from (base manifest, own manifest, shards)."""
        snapshots = self.open_root(uri)
        runs = {r.run_id: r for r in root_history(snapshots).runs}
        entry = runs.get(run_id)
        if entry is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r} under {uri}")
        data: dict[str, Any] = {"root": uri, "run": entry.to_dict(), "shards": [], "links": {}}
        if entry.manifest_ref is None or entry.state in ("deleted", "unreadable"):
            return data, None
        try:
            manifest = snapshots.read_manifest(entry.manifest_ref)  # the one its record names: no listing
        except ObjectNotFoundError as exc:
            raise HTTPException(status_code=404, detail=f"run {run_id!r} of {uri}: its manifest is missing: {exc}") from None
        except ManifestValidationError as exc:  # outside the root, corrupt, or of another run
            raise HTTPException(status_code=502, detail=f"run {run_id!r} of {uri}: its manifest is refused: {exc}") from None
        shards: list[dict[str, Any]] = [{"db_id": s.db_id, "rows": s.row_count, "bytes": s.byte_size,
                   "files": sum(len(x.files) for x in s.all_layers()),
                   "layers": [{"run_id": x.run_id, "kind": x.kind, "bytes": x.byte_size, "inserted": x.inserted,
                               "updated": x.updated, "deleted": x.deleted, "deleted_absent": x.deleted_absent}
                              for x in s.layers]}
                  for s in manifest.shards]
        mean = manifest.row_count / manifest.num_dbs if manifest.num_dbs else 0
        writer = WriterIdentity.from_dict(manifest.writer)
        data.update(shards=shards, num_dbs=manifest.num_dbs, spark_app_id=writer.spark_app_id,
                    write_mode=manifest.write_mode, base_run_id=manifest.base_run_id, chain_depth=manifest.chain_depth,
                    value_schema=schema_columns(manifest.value_schema),
                    skew=round(max(s.row_count for s in manifest.shards) / mean, 3) if shards and mean else None)
        if self.spark_ui_template and writer.spark_app_id:
            data["links"]["Spark application (history server)"] = self.spark_ui_template.format(
                app_id=quote(writer.spark_app_id))
        if writer.spark_ui_url:
            data["links"]["Spark application UI"] = writer.spark_ui_url
        task = entry.airflow
        if task.get("dag_id") and task.get("run_id") and task.get("task_id"):
            parts = [quote(str(task[k]), safe="") for k in ("dag_id", "run_id", "task_id")]
            data["links"]["Airflow task"] = "/dags/{}/runs/{}/tasks/{}".format(*parts)
        base = runs.get(manifest.base_run_id) if manifest.base_run_id is not None else None
        if base is not None and base.manifest_ref and base.state != "deleted":
            # The run's own changes: the shards where it wrote a layer, against its base's, with the
            # counts its layers stored (a full layer stored none).
            own = {s.db_id: _layer_counts([x for x in s.all_layers() if x.run_id == run_id]) for s in manifest.shards
                   if any(x.run_id == run_id for x in s.all_layers())}
            return data, (base.manifest_ref, entry.manifest_ref, own)
        return data, None

    def samples(self, uri: str, ref_a: str, ref_b: str, changed: Changed) -> dict[str, Any]:
        """Changed keys of each kind, run ``b`` against run ``a``, from up to ``SAMPLE_SHARDS`` of the
        ``changed`` shards spread over them: bounded by keys per kind, keys walked, the byte budget of
        a request and the deadline."""
        return self._walk_within(uri, {"changes": {k: [] for k in CHANGE_KINDS}, "counts": _total_counts(changed),
                                       "more": dict.fromkeys(CHANGE_KINDS, False), "shards": [], "fields": [],
                                       "kind_keys": SAMPLE_KIND_KEYS, "changed_shards": len(changed)},
                                 functools.partial(self._samples, uri, ref_a, ref_b, changed))

    def _walk_within(self, uri: str, empty: dict[str, Any], walk: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``walk()`` within the deadline; on no answer or a storage error, ``empty`` saying why it stopped."""
        result = within(self.deadline_s, {"walk": walk})["walk"]
        if isinstance(result, Unanswered):
            return {**empty, "stopped": f"the storage of {uri} did not answer ({result})"}
        if isinstance(result, ShardyfusionError):
            return {**empty, "stopped": f"{type(result).__name__}: {result}"}
        if isinstance(result, Exception):
            raise result
        return result

    def _samples(self, uri: str, ref_a: str, ref_b: str, changed: Changed) -> dict[str, Any]:
        ids = sorted(changed)
        # Shards that may hold each kind (all, where the writer stored no counts), spread over the
        # key space; taken in turns, so that every kind has shards before any has its eighth.
        holding = {k: [d for d in ids if (changed[d] or {}).get(k, 1) > 0] for k in CHANGE_KINDS}
        spread_of = {k: spread(holding[k], SAMPLE_SHARDS) for k in CHANGE_KINDS}
        picks: list[int] = []
        for i in range(SAMPLE_SHARDS):
            for k in CHANGE_KINDS:
                if i < len(spread_of[k]) and spread_of[k][i] not in picks and len(picks) < SAMPLE_SHARDS:
                    picks.append(spread_of[k][i])
        # Keys of a kind each picked shard keeps: the kind's share of the page.
        share = {k: math.ceil(SAMPLE_KIND_KEYS / max(1, sum(d in holding[k] for d in picks))) for k in CHANGE_KINDS}
        found: list[ShardSample] = []
        stopped = None
        with self.open_reader(uri, ref_a) as before, self.open_reader(uri, ref_b) as after:
            typed = comparison_between(before.manifest, after.manifest)
            for db_id in sorted(picks):
                if before.cache_stats["bytes_downloaded"] + after.cache_stats["bytes_downloaded"] >= self.key_byte_budget:
                    stopped = f"stopped after {len(found)} shards: the byte budget of one request is spent"
                    break
                counts = changed[db_id] or {}
                caps: dict[str, int] = {k: min(share[k], counts.get(k, share[k])) for k in CHANGE_KINDS}
                old, new = before.open_shard(db_id), after.open_shard(db_id)
                found.append(sample_changes(db_id, _items(old), _items(new), key_encoding=after.manifest.key_encoding,
                                            value_format=after.manifest.value_format, typed=typed,
                                            limit=max(caps.values()), expected=caps,
                                            shown=shown_values(after.manifest)))
        totals = _total_counts(changed)
        by_kind: dict[str, list[dict[str, Any]]] = {}
        more: dict[str, bool] = {}
        for k in CHANGE_KINDS:
            every = [{**c, "db_id": s.db_id} for s in found for c in s.of_kind(k)]
            by_kind[k] = every[:SAMPLE_KIND_KEYS]
            total = totals[k]
            more[k] = total > len(by_kind[k]) if total is not None else bool(every) or len(picks) < len(ids) or any(
                not s.complete for s in found)
        return {"changes": by_kind, "counts": totals, "more": more, "fields": rank_fields(by_kind["updated"]), "stopped": stopped,
                "kind_keys": SAMPLE_KIND_KEYS,
                "shards": [{"db_id": s.db_id, "scanned": s.scanned, "complete": s.complete} for s in found],
                "changed_shards": len(ids)}

    def changes_data(self, uri: str, a: str, b: str, kind: ChangeKind, start: str | None) -> dict[str, Any]:
        """A page of the keys of one kind run ``b`` changed against run ``a``, walked shard by shard in
        key order from ``start`` (``SHARD``, or ``SHARD:HEXKEY:LISTED``: go on after that key, LISTED
        keys of the kind already listed from that shard)."""
        db_from, after_key, listed = _cursor(start)
        diff = self.diff_runs(uri, a, b)
        if not diff["same_routing"]:
            raise HTTPException(status_code=404, detail=f"runs {a!r} and {b!r} of {uri} route keys differently: their "
                                                        "shards hold other keys, so no key is compared")
        changed: Changed = {s["db_id"]: s.get("changes") for s in diff["shards"] if not s["same_files"]}
        empty: dict[str, Any] = {"keys": [], "next": None, "scanned": 0}
        page = self._walk_within(uri, empty, functools.partial(
            self._changes_page, uri, diff["manifest_a"], diff["manifest_b"], changed, kind, (db_from, after_key, listed)))
        return {"root": uri, "run_a": a, "run_b": b, "kind": kind, "start": start, "count": _total_counts(changed)[kind],
                "page_keys": CHANGES_PAGE_KEYS, **page}

    def _changes_page(self, uri: str, ref_a: str, ref_b: str, changed: Changed, kind: ChangeKind,
                      start: tuple[int, bytes | None, int]) -> dict[str, Any]:
        db_from, after_key, listed = start
        keys: list[dict[str, Any]] = []
        scanned, nxt, stopped = 0, None, None
        with self.open_reader(uri, ref_a) as before, self.open_reader(uri, ref_b) as after:
            typed = comparison_between(before.manifest, after.manifest)
            for db_id in (d for d in sorted(changed) if d >= db_from):
                counts = changed[db_id]
                if counts is not None and counts.get(kind, 1) == 0:
                    continue  # the writer stored none of this kind here
                resume = after_key if db_id == db_from else None
                if len(keys) >= CHANGES_PAGE_KEYS or scanned >= CHANGES_PAGE_SCAN_KEYS:
                    nxt = str(db_id)
                    break
                if before.cache_stats["bytes_downloaded"] + after.cache_stats["bytes_downloaded"] >= self.key_byte_budget:
                    nxt, stopped = str(db_id), "the byte budget of one request is spent: the next page goes on"
                    break
                old, new = before.open_shard(db_id), after.open_shard(db_id)
                # What the writer counted, less what pages before listed of this shard: the walk
                # stops at the last one, so no page after it comes out empty.
                done = listed if db_id == db_from else 0
                expected: dict[str, int] | None = {kind: counts.get(kind, 0) - done} if counts is not None else None
                s = sample_changes(db_id, _items(old, resume), _items(new, resume),
                                   key_encoding=after.manifest.key_encoding, value_format=after.manifest.value_format,
                                   typed=typed, limit=CHANGES_PAGE_KEYS - len(keys),
                                   scan_limit=CHANGES_PAGE_SCAN_KEYS - scanned, kinds=(kind,), expected=expected,
                                   after_key=resume, shown=shown_values(after.manifest))
                keys += [{**c, "db_id": db_id} for c in s.changes]
                scanned += s.scanned
                every_one = expected is not None and len(s.changes) >= expected[kind]
                if not s.complete and not every_one and s.last_key is not None:
                    nxt = f"{db_id}:{s.last_key.hex()}:{done + len(s.changes)}"
                    break
        return {"keys": keys, "next": nxt, "scanned": scanned, "stopped": stopped}

    def diff_runs(self, uri: str, a: str, b: str) -> dict[str, Any]:
        """``diff_runs`` of ``a`` and ``b`` as a dict, within the deadline; 404 naming a run without a manifest."""
        def diff() -> dict[str, Any]:
            try:
                return diff_runs(self.open_root(uri), a, b).to_dict()
            except ShardyfusionError as exc:
                raise HTTPException(status_code=404, detail=str(exc)) from None

        return self.bounded(uri, diff)

    def diff_data(self, uri: str, a: str, b: str) -> dict[str, Any]:
        data = {"root": uri, **self.diff_runs(uri, a, b)}
        if data["same_routing"]:
            changed: Changed = {s["db_id"]: s.get("changes") for s in data["shards"] if not s["same_files"]}
            data["samples"] = self.samples(uri, data["manifest_a"], data["manifest_b"], changed)
        return data

    def key_data(self, uri: str, key: str, limit: int = KEY_LOOKUP_RUNS, key_type: KeyText = "auto") -> dict[str, Any]:
        """``key`` in the newest ``limit`` retained runs (not deleted, failed or running), until the
        shards downloaded for it reach ``key_byte_budget``."""
        # Each run's manifest is the one its record names: no listing of manifests per run.
        runs = [r for r in self.history(uri).runs if r.manifest_ref and r.state not in ("deleted", "running", "failed")]
        found: list[dict[str, Any]] = []
        downloaded, stopped = 0, None
        for r in runs[:limit]:
            if downloaded >= self.key_byte_budget:
                stopped = (f"stopped after {len(found)} runs: this look-up downloaded {render.fmt_bytes(downloaded)} "
                           f"of shards, the budget of one request is {render.fmt_bytes(self.key_byte_budget)}; "
                           "ask again to go on (downloaded shards are cached) or lower &limit")
                break
            looked = within(self.deadline_s, {r.run_id: functools.partial(_look_up, self.open_reader, uri,
                                                                          str(r.manifest_ref), key, key_type)})
            result = looked[r.run_id]
            if isinstance(result, Exception):
                if not isinstance(result, Unanswered):
                    raise result
                found.append({"run_id": r.run_id, "state": r.state, "found": None,
                              "error": f"storage unreachable ({result})"})
                stopped = f"stopped after {len(found)} runs: the storage of {uri} did not answer"
                break
            hit, cost = result
            downloaded += cost
            found.append({"run_id": r.run_id, "state": r.state, **hit})
        return {"root": uri, "key": key, "runs": key_fates(found), "retained_runs": len(runs), "limit": limit,
                "max_limit": MAX_KEY_LOOKUP_RUNS, "bytes_downloaded": downloaded, "stopped": stopped}


def create_app(source: HistorySource, *, auth: Callable[..., Any] | None = None) -> FastAPI:
    """The app over ``source``; ``auth`` is the dependency every route requires (Airflow's asset
    read access in the plugin). ``?format=json`` gives each page's JSON twin."""
    app = FastAPI(title="shardyfusion snapshot history", dependencies=[Depends(auth)] if auth else [],
                  docs_url=None, redoc_url=None, openapi_url=None)

    def respond(data: dict[str, Any], fmt: str, html: Callable[[dict[str, Any]], str]) -> Any:
        return JSONResponse(data) if fmt == "json" else HTMLResponse(html(data))

    _answer_as_pages(app)

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

    @app.get("/changes")
    def changes_view(uri: str, a: str, b: str, kind: ChangeKind, start: str | None = Query(None, alias="from"),
                     format: str = Query("html")) -> Any:
        return respond(source.changes_data(source.known(uri), a, b, kind, start), format, render.changes_page)

    @app.get("/key")
    def key_view(uri: str, key: str, format: str = Query("html"),
                 limit: int = Query(KEY_LOOKUP_RUNS, ge=1, le=MAX_KEY_LOOKUP_RUNS),
                 key_type: KeyText = "auto") -> Any:
        return respond(source.key_data(source.known(uri), key, limit, key_type), format, render.key_page)

    return app


def _answer_as_pages(app: FastAPI) -> None:
    """Errors as pages in the layout, and the security headers on every answer."""

    @app.exception_handler(StarletteHTTPException)
    async def error_page(request: Request, exc: StarletteHTTPException) -> Response:
        # A person in a browser gets the page layout with the reason; ?format=json keeps the JSON twin.
        if request.query_params.get("format") == "json":
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        return HTMLResponse(render.error_page(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=exc.headers)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        # Every answer, errors included: a value that slipped past escaping still cannot run.
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = render.CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def _look_up(open_reader: Callable[[str, str], Any], root: str, manifest_ref: str,
             text: str, key_type: KeyText) -> tuple[dict[str, Any], int]:
    """What run ``manifest_ref`` holds for ``text`` read as ``key_type``, and the shard bytes its reader downloaded."""
    downloaded = 0
    try:
        with open_reader(root, manifest_ref) as reader:
            manifest = reader.manifest
            key = key_from_text(text, manifest.key_encoding, key_type)
            try:
                value = reader.get(key)
            finally:
                downloaded = reader.cache_stats["bytes_downloaded"]
    except (ShardyfusionError, ValueError, TypeError) as exc:
        return {"found": None, "error": f"{type(exc).__name__}: {exc}"}, downloaded
    if value is None:
        return {"found": False, "value": None}, downloaded
    hit: dict[str, Any] = {"found": True}
    typed = typed_comparison(manifest.value_format, manifest.value_schema)
    if typed is not None:  # key_fates compares runs by typed values (SPEC §18), then drops them
        with contextlib.suppress(ShardyfusionError):  # then compared and shown as stored
            hit["typed"] = typed(json.dumps(value).encode("utf-8"))
    # Shown typed where it decodes: a timestamp stored as epoch microseconds reads as RFC 3339 text.
    hit["value"] = json_value(hit.get("typed", value))
    return hit, downloaded


# Per changed shard, what its writer stored it did: inserted / updated / deleted (None: not stored,
# as for a full run or a diff of runs not on one chain).
Changed = dict[int, dict[str, int] | None]


def _layer_counts(layers: list[Any]) -> dict[str, int] | None:
    """What ``layers`` of a shard did together; None when one is a full layer (it stored no counts)."""
    if not layers or any(x.kind != "delta" for x in layers):
        return None
    return {k: sum(getattr(x, k) for x in layers) for k in CHANGE_KINDS}


def _total_counts(changed: Changed) -> dict[str, int | None]:
    """Keys of each kind over every changed shard; None for a kind some shard did not count."""
    known = [c for c in changed.values() if c is not None]
    return {k: sum(c.get(k, 0) for c in known) if len(known) == len(changed) else None for k in CHANGE_KINDS}


def _items(db: Any, from_key: bytes | None = None) -> Any:
    """A shard's stored items in key order (from ``from_key`` on), none for an empty shard."""
    if db is None:
        return ()
    return db.items(from_key=from_key) if from_key is not None else db.items()


def _cursor(start: str | None) -> tuple[int, bytes | None, int]:
    """A changes page's ``from`` (``SHARD`` or ``SHARD:HEXKEY:LISTED``): the shard to start in, the
    key after which, and how many keys of the kind pages before listed from that shard."""
    if not start:
        return 0, None, 0
    parts = start.split(":")
    try:
        if len(parts) not in (1, 3):
            raise ValueError(start)
        db_id = int(parts[0])
        key = bytes.fromhex(parts[1]) if len(parts) == 3 else None
        listed = int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise HTTPException(status_code=422, detail=f"from={start!r}: expected SHARD or SHARD:HEXKEY:LISTED, as a "
                                                    "page's next link gives it") from None
    if db_id < 0 or listed < 0:
        raise HTTPException(status_code=422, detail=f"from={start!r}: a shard id and a count are 0 or more")
    return db_id, key, listed


def _ts_text(value: Any) -> str | None:
    return layout.format_ts(value) if value is not None else None
