"""The HTTP application of ``shardyfusion serve`` (SPEC §19), built from a reader factory.

Routes: ``GET /v1/keys/{key}``, ``POST /v1/multi_get``, ``GET /healthz``, ``GET /readyz``,
``GET /metrics``. Every answer read from a snapshot names its run in the body (``run_id``) and in
the header ``X-Shardyfusion-Run-Id``; the values of one answer come from one snapshot
(``ShardedReader.multi_get_with_run_id``, ``multi_get_if_open``). Values are JSON as msgspec
renders the decoded values: datetimes RFC 3339, ``Decimal`` as a string, bytes base64.

Errors are one JSON object ``{"error": ...}`` (plus what helps: ``key``, ``shard``), never a stack
trace. Nothing from a request is ever used as a path: a key is only ever looked up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_shardyfusion.core.errors import ConfigError, KeyEncodingError, ShardNotServedError, ShardyfusionError
from airflow_provider_shardyfusion.core.model.encoding import KeyText, key_to_show, keys_from_json
from airflow_provider_shardyfusion.serve.metrics import ServeMetrics, render
from airflow_provider_shardyfusion.serve.readiness import unready_reason
from airflow_provider_shardyfusion.serve.worker_metrics import SharedMetrics

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.serve.config import ServeConfig

__all__ = [
    "MAX_BODY_BYTES", "MAX_KEYS", "RUN_ID_HEADER", "ReaderSlot", "SnapshotService", "app_from_environment", "create_app",
    "reader_factory",
]

log = logging.getLogger(__name__)

RUN_ID_HEADER = "X-Shardyfusion-Run-Id"
MAX_KEYS = 10_000
MAX_BODY_BYTES = 4 << 20  # 10,000 keys of ~400 characters each
JSON = "application/json"
# Largest batch read on the event loop, by routing: a read there holds up every other connection,
# so each limit is a batch that reads in about the same short time, far fewer keys under CEL
# (cel-python evaluates the expression for each key; hashing is native). A larger batch goes to the
# thread pool. The times they were set from: docs/benchmarks.md, "Serving".
INLINE_MAX_KEYS: dict[str, int] = {"hash": 1000, "cel": 15}

_encode = msgspec.json.Encoder(decimal_format="string").encode


class _MultiGet(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[str | int]


_decode_multi_get = msgspec.json.Decoder(_MultiGet).decode


class ReaderSlot:
    """The worker's reader, opened at start-up; while it cannot be (nothing published yet, storage
    down), a thread tries again every ``retry_s`` and ``reason`` says what went wrong."""

    def __init__(self, factory: Callable[[], ShardedReader], retry_s: float):
        self._factory = factory
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reader: ShardedReader | None = None
        self.reason = "the snapshot is not loaded yet"

    def open(self) -> None:
        if not self._try_open():
            self._thread = threading.Thread(target=self._retry, name="shardyfusion-serve-open", daemon=True)
            self._thread.start()

    def _try_open(self) -> bool:
        try:
            self.reader = self._factory()
        except Exception as exc:  # kept as the reason /readyz gives; the process stays up and retries
            self.reason = f"cannot open the snapshot: {type(exc).__name__}: {_one_line(exc)}"
            log.warning("serve: %s (retrying every %ss)", self.reason, self._retry_s)
            return False
        return True

    def _retry(self) -> None:
        while not self._stop.wait(self._retry_s):
            if self._try_open():
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._retry_s + 5)
        if self.reader is not None:
            self.reader.close()


def reader_factory(config: ServeConfig) -> Callable[[], ShardedReader]:
    """A ``ShardedReader`` as ``config`` asks: following ``_CURRENT``, on the shared cache."""

    def open_reader() -> ShardedReader:
        from airflow_provider_shardyfusion.core.read.reader import ShardedReader

        return ShardedReader(
            config.root, cache_dir=config.cache_dir, storage_options=config.storage_options or None,
            follow_interval_s=config.follow_interval_s, max_staleness_s=config.max_staleness_s,
            shard_ids=config.shard_ids, value_decoding=config.value_decoding,
        )

    return open_reader


class SnapshotService:
    """What the routes do, apart from HTTP parsing: read from one snapshot, shape answers and errors."""

    def __init__(self, slot: ReaderSlot, *, key_type: KeyText, max_staleness_s: float | None = None,
                 metrics_dir: str | None = None):
        self.slot = slot
        self.max_staleness_s = max_staleness_s
        self.key_type = key_type
        self.metrics = ServeMetrics(max_staleness_s=max_staleness_s)
        # With several workers, a scrape shows them all (serve.worker_metrics); alone, only this one.
        self.shared = SharedMetrics(metrics_dir, self.metrics.pid, lambda: self.metrics.snapshot(self.slot.reader)) \
            if metrics_dir is not None else None

    def open(self) -> None:
        """At start-up: share this worker's metrics from now on, and open the reader (or keep trying)."""
        if self.shared is not None:
            self.shared.start()
        self.slot.open()

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()
        self.slot.close()

    def answer(self, route: str, status: int, body: dict[str, Any], run_id: str | None = None) -> Response:
        self.metrics.request(route, status)
        headers = {RUN_ID_HEADER: run_id} if run_id else None
        return Response(_encode(body), status_code=status, media_type=JSON, headers=headers)

    def failure(self, route: str, status: int, message: str, run_id: str | None = None, **extra: Any) -> Response:
        body = {"error": message, **extra}
        if run_id:
            body["run_id"] = run_id
        return self.answer(route, status, body, run_id)

    def _serving(self, route: str) -> ShardedReader | Response:
        reader = self.slot.reader
        if reader is None:
            return self.failure(route, 503, self.slot.reason)
        return reader

    def _keys(self, route: str, reader: ShardedReader, asked: list[str | int]) -> list[Any] | Response:
        """The keys ``asked`` (JSON strings and integers) stand for, or the 400 answer."""
        try:
            return keys_from_json(asked, reader.manifest.key_encoding, self.key_type)
        except (KeyEncodingError, ConfigError) as exc:
            return self.failure(route, 400, _one_line(exc), reader.run_id)

    def _read(self, route: str, reader: ShardedReader, keys: list[Any],
              inline: bool) -> tuple[str, list[Any]] | Response | None:
        """``(run_id, values)`` of ``keys`` from one snapshot, or the error answer (400, 421, 503); with
        ``inline``, None when a shard must be opened first (not on the event loop: it may download)."""
        try:
            return reader.multi_get_if_open(keys) if inline else reader.multi_get_with_run_id(keys)
        except ShardNotServedError as exc:
            return self.failure(route, 421, _one_line(exc), reader.run_id, key=_shown(exc.key), shard=exc.db_id,
                                served=exc.served)
        except (KeyEncodingError, ConfigError) as exc:  # e.g. text for an integer key, an int out of range
            return self.failure(route, 400, _one_line(exc), reader.run_id)
        except ShardyfusionError as exc:  # storage unreachable for a shard not cached yet, ...
            log.warning("serve: %s failed: %s", route, exc)
            return self.failure(route, 503, f"{type(exc).__name__}: {_one_line(exc)}", reader.run_id)

    def get_key(self, text: str) -> Response:
        """The answer to ``GET /v1/keys/{text}`` (opens the key's shard if needed: in a thread)."""
        answer = self._get_key(text, inline=False)
        assert answer is not None  # None only inline
        return answer

    def get_key_if_open(self, text: str) -> Response | None:
        """``get_key(text)``, or None when the key's shard is not open yet (what the event loop calls)."""
        return self._get_key(text, inline=True)

    def _get_key(self, text: str, *, inline: bool) -> Response | None:
        reader = self._serving("get")
        if isinstance(reader, Response):
            return reader
        keys = self._keys("get", reader, [text])
        if isinstance(keys, Response):
            return keys
        got = self._read("get", reader, keys, inline)
        if got is None or isinstance(got, Response):
            return got
        run_id, (value,) = got
        found = value is not None
        self.metrics.keys(1, int(found))
        return self.answer("get", 200 if found else 404,
                           {"run_id": run_id, "key": key_to_show(keys[0]), "found": found, "value": value}, run_id)

    def multi_get(self, asked: list[str | int]) -> Response:
        """The answer to ``POST /v1/multi_get`` of the keys ``asked`` (opens shards if needed: in a thread)."""
        answer = self._multi_get(asked, inline=False)
        assert answer is not None  # None only inline
        return answer

    def multi_get_if_open(self, asked: list[str | int]) -> Response | None:
        """``multi_get(asked)``, or None when a shard the keys need is not open yet or the batch is
        larger than ``INLINE_MAX_KEYS`` allows (what the event loop calls)."""
        return self._multi_get(asked, inline=True)

    def _multi_get(self, asked: list[str | int], *, inline: bool) -> Response | None:
        reader = self._serving("multi_get")
        if isinstance(reader, Response):
            return reader
        if inline and len(asked) > INLINE_MAX_KEYS.get(reader.manifest.sharding.strategy, 0):
            return None
        keys = self._keys("multi_get", reader, asked)
        if isinstance(keys, Response):
            return keys
        got = self._read("multi_get", reader, keys, inline)
        if got is None or isinstance(got, Response):
            return got
        run_id, values = got
        self.metrics.keys(len(values), len(values) - values.count(None))
        return self.answer("multi_get", 200, {"run_id": run_id, "values": values}, run_id)

    def multi_get_body(self, content_type: str, body: bytes | None) -> list[str | int] | Response:
        """The keys of a ``POST /v1/multi_get`` body, or the error answer (415, 413, 400)."""
        media = content_type.split(";", 1)[0].strip().lower()
        if media != JSON:
            return self.failure("multi_get", 415, f"POST /v1/multi_get takes {JSON}, got {media or 'no content type'!r}")
        if body is None:
            return self.failure("multi_get", 413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        try:
            asked = _decode_multi_get(body)
        except msgspec.DecodeError as exc:
            return self.failure("multi_get", 400, f'the body must be {{"keys": [KEY, ...]}} (strings or integers): {exc}')
        if len(asked.keys) > MAX_KEYS:
            return self.failure("multi_get", 413, f"{len(asked.keys)} keys asked; at most {MAX_KEYS} per request")
        return asked.keys

    def readyz(self) -> Response:
        """200 while a snapshot is loaded and confirmed current within ``max_staleness_s`` (a failed
        check shows in ``status`` and ``last_error``), else 503 with ``reason`` (``serve.readiness``)."""
        reader = self.slot.reader
        if reader is None:
            return self.answer("readyz", 503, {"ready": False, "reason": self.slot.reason})
        health = reader.health()
        reason = unready_reason(health, self.max_staleness_s)
        body: dict[str, Any] = {
            "ready": reason is None, "status": health.status, "run_id": health.run_id, "age_s": health.age_s,
            "last_success_at": health.last_success_at, "last_error": health.last_error,
            "shards_open": health.shards_open,
        }
        if reason is not None:
            body["reason"] = reason
        return self.answer("readyz", 200 if reason is None else 503, body, health.run_id)

    def metrics_text(self) -> Response:
        """The answer to ``GET /metrics``: every worker's series (one file each to read: in a thread)."""
        workers = self.shared.scrape() if self.shared is not None else [self.metrics.snapshot(self.slot.reader)]
        text = render(workers)
        self.metrics.request("metrics", 200)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def create_app(factory: Callable[[], ShardedReader], *, key_type: KeyText = "auto", retry_s: float = 5.0,
               max_staleness_s: float | None = None, metrics_dir: str | None = None) -> FastAPI:
    """The FastAPI app serving the reader ``factory`` opens (once, at start-up; closed at shutdown).

    A read that needs a shard not open yet (which may download it) runs in the server's thread pool,
    never on the event loop; one from open shards only, of up to ``INLINE_MAX_KEYS`` keys, runs on the
    loop (``ShardedReader.multi_get_if_open``). ``metrics_dir``: the folder the workers of one server
    share their metrics through (``serve.worker_metrics``), None for a single worker."""
    service = SnapshotService(ReaderSlot(factory, retry_s), key_type=key_type, max_staleness_s=max_staleness_s,
                              metrics_dir=metrics_dir)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.open)
        try:
            yield
        finally:
            await run_in_threadpool(service.close)

    app = FastAPI(title="shardyfusion serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    app.state.service = service

    # The two read routes are plain Starlette routes taking the request: FastAPI's parameter solving
    # was a large share of a small request's time. A read whose shards are all open runs on the event
    # loop (no I/O; the hop to a thread and back cost about as much as reading 100 keys); the first
    # read of a shard, which may download it, and batches over INLINE_MAX_KEYS run in the thread
    # pool. The figures: docs/benchmarks.md, "Serving".

    # A path parameter: "/" inside a key (sent as %2F) is part of the key, never a path on disk.
    async def get_route(request: Request) -> Response:
        key: str = request.path_params["key"]
        answer = service.get_key_if_open(key)
        return answer if answer is not None else await run_in_threadpool(service.get_key, key)

    async def multi_get_route(request: Request) -> Response:
        content_type = request.headers.get("content-type", "")
        is_json = content_type.split(";", 1)[0].strip().lower() == JSON
        asked = service.multi_get_body(content_type, await _read_body(request) if is_json else b"")
        if isinstance(asked, Response):
            return asked
        answer = service.multi_get_if_open(asked)
        return answer if answer is not None else await run_in_threadpool(service.multi_get, asked)

    app.add_route("/v1/keys/{key:path}", get_route, methods=["GET"])
    app.add_route("/v1/multi_get", multi_get_route, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return service.answer("healthz", 200, {"status": "alive"})

    @app.get("/readyz")
    async def readyz() -> Response:
        return service.readyz()

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return await run_in_threadpool(service.metrics_text)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:  # 404/405 of the router
        return service.failure("other", exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:  # logged here, never in a body
        log.error("serve: unexpected error", exc_info=exc)
        return service.failure("other", 500, f"internal error ({type(exc).__name__}); see the server's log")

    return app


def app_from_environment() -> FastAPI:
    """The app of one uvicorn worker, from the ``ServeConfig`` in the environment (``serve.server``)."""
    from airflow_provider_shardyfusion.serve.config import ServeConfig

    config = ServeConfig.from_environment()
    return create_app(reader_factory(config), key_type=config.key_type, retry_s=config.follow_interval_s or 5.0,
                      max_staleness_s=config.max_staleness_s, metrics_dir=config.metrics_dir)


async def _read_body(request: Request) -> bytes | None:
    """The request body, or None once it passes ``MAX_BODY_BYTES`` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _shown(key: Any) -> Any:
    try:
        return key_to_show(key)
    except Exception:
        return repr(key)


def _one_line(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or repr(exc)
