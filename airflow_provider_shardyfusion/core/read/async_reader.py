"""``AsyncShardedReader``: the reader for asyncio services (FastAPI, aiohttp), SPEC §19.

A look-up may have to download and build a cold shard (seconds) and a refresh reads the store, so
every call runs on a bounded thread pool owned by the reader, never on the event loop. The pool
is bounded so that a burst of requests for cold shards queues instead of starting a thread (and
file descriptors) per request.

Cancellation: ``await reader.get(k)`` cancelled while queued removes the work from the queue;
cancelled while a worker runs it, the worker finishes (a download cannot be interrupted half-way
without leaving a staging folder) and its result is dropped. Nothing is left behind either way:
the shards it opened are the reader's, within its bounds, and ``aclose()`` waits for the workers
before closing the shards and joining the threads.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_shardyfusion.core.errors import ReaderError
from airflow_provider_shardyfusion.core.read.reader import ShardedReader

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.read.description import ReaderDescription
    from airflow_provider_shardyfusion.core.read.health import ReaderHealth

__all__ = ["DEFAULT_MAX_WORKERS", "AsyncShardedReader"]

T = TypeVar("T")

# Look-ups on open shards take microseconds, so a few workers keep up with many callers; more
# only help while cold shards download, and each worker may hold a download's sockets and files.
DEFAULT_MAX_WORKERS = 4
_POOLS = itertools.count(1)


class AsyncShardedReader:
    """``ShardedReader`` with ``async`` methods, for an asyncio event loop.

    Takes ``ShardedReader``'s arguments (``output_uri``, ``cache_dir``, ``storage_options``,
    ``shard_ids``, …) and ``max_workers``: the threads running the blocking work (look-ups,
    downloads, refreshes), 4 by default. The constructor reads ``_CURRENT`` and the manifest
    (blocking): build it at start-up, or ``await AsyncShardedReader.open(…)`` from a coroutine.

    ``await get(key)``, ``await multi_get(keys)``, ``await multi_get_with_run_id(keys)``,
    ``await refresh()`` and ``await aclose()`` (also ``async with``) are ``ShardedReader``'s methods
    run on the pool; ``await health()``, ``route(key)``, ``describe()``, ``run_id`` and ``manifest``
    answer at once, without I/O. A service naming the run beside a value reads both with
    ``multi_get_with_run_id`` (``run_id`` read after the value may already name the next run). A
    cancelled call leaks nothing (see the module's docstring). ``reader`` is the underlying
    ``ShardedReader``, for code that is not async. Its worker threads are named
    ``<thread_name_prefix>_<n>``.
    """

    # ``reader_args`` rather than a copy of ShardedReader's signature: every argument it gains
    # (follow, value decoding, ...) is AsyncShardedReader's too, checked by ShardedReader itself.
    def __init__(self, output_uri: str, *, max_workers: int = DEFAULT_MAX_WORKERS, **reader_args: Any):
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ReaderError(f"max_workers must be a positive integer, got {max_workers!r}")
        self.reader = ShardedReader(output_uri, **reader_args)
        self._thread_name_prefix = f"shardyfusion-async-{next(_POOLS)}"
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=self._thread_name_prefix)
        self._closed = False
        self._close_lock = threading.Lock()

    @classmethod
    async def open(cls, output_uri: str, *, max_workers: int = DEFAULT_MAX_WORKERS,
                   **reader_args: Any) -> AsyncShardedReader:
        """Construct the reader on a thread, so the event loop keeps running while the manifest loads."""
        return await asyncio.to_thread(functools.partial(cls, output_uri, max_workers=max_workers, **reader_args))

    # -- non-blocking answers ------------------------------------------------------------------

    @property
    def output_uri(self) -> str:
        return self.reader.output_uri

    @property
    def run_id(self) -> str:
        return self.reader.run_id

    @property
    def manifest(self) -> Manifest:
        return self.reader.manifest

    @property
    def shard_ids(self) -> frozenset[int] | None:
        return self.reader.shard_ids

    @property
    def thread_name_prefix(self) -> str:
        """Its worker threads are named ``<prefix>_<n>`` (unique per reader): to tell them in a thread dump."""
        return self._thread_name_prefix

    def route(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> int:
        """The shard id ``key`` routes to (pure computation: no thread needed)."""
        return self.reader.route(key, routing_context=routing_context)

    def describe(self) -> ReaderDescription:
        """What the reader holds now (``ShardedReader.describe()``)."""
        return self.reader.describe()

    # -- blocking work, on the pool ------------------------------------------------------------

    async def get(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> Any:
        """The decoded value of ``key``, or ``None`` (``ShardedReader.get``)."""
        return await self._run(functools.partial(self.reader.get, key, routing_context=routing_context))

    async def multi_get(
        self, keys: Iterable[Any], *, routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> list[Any]:
        """Values of ``keys`` in input order (``ShardedReader.multi_get``)."""
        keys = keys if isinstance(keys, list) else list(keys)  # a generator must not be consumed on a worker
        return await self._run(functools.partial(self.reader.multi_get, keys, routing_context=routing_context))

    async def multi_get_with_run_id(
        self, keys: Iterable[Any], *, routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[str, list[Any]]:
        """``(run_id, values)``, every value read from that run (``ShardedReader.multi_get_with_run_id``)."""
        keys = keys if isinstance(keys, list) else list(keys)
        return await self._run(functools.partial(self.reader.multi_get_with_run_id, keys,
                                                 routing_context=routing_context))

    async def refresh(self) -> bool:
        """Follow ``_CURRENT`` again (``ShardedReader.refresh``)."""
        return await self._run(self.reader.refresh)

    async def health(self) -> ReaderHealth:
        """``ShardedReader.health()``: answered on the loop, it makes no request and takes no lock."""
        return self.reader.health()

    async def aclose(self) -> None:
        """Let running calls finish (queued ones are cancelled), join the threads, close the reader. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        # Joining the workers blocks until their current call returns: off the loop, on a thread of
        # its own (the loop's default executor may be busy or already shut down).
        done = asyncio.get_running_loop().create_future()
        threading.Thread(target=self._shutdown, args=(done,), name="shardyfusion-async-close", daemon=True).start()
        await asyncio.shield(done)

    async def __aenter__(self) -> AsyncShardedReader:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"Async{self.reader!r}"

    async def _run(self, call: Callable[[], T]) -> T:
        if self._closed:
            raise ReaderError(f"the reader of {self.reader.output_uri} is closed")
        try:
            # run_in_executor's future cancels the queued work item when the awaiting task is
            # cancelled, and drops the result of one already running.
            future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        except RuntimeError:  # the pool shut down between the check and here: aclose() won the race
            raise ReaderError(f"the reader of {self.reader.output_uri} is closed") from None
        return await future

    def _shutdown(self, done: asyncio.Future[None]) -> None:
        loop = done.get_loop()
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.reader.close()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, done, exc)
        else:
            loop.call_soon_threadsafe(_settle, done, None)


def _settle(done: asyncio.Future[None], exc: BaseException | None) -> None:
    if done.cancelled():
        return
    if exc is None:
        done.set_result(None)
    else:
        done.set_exception(exc)
