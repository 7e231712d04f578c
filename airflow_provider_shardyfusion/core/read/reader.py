"""Read a published snapshot: ``_CURRENT`` → manifest → shard (SPEC §9).

The reader locates a key exactly as the writer stored it (``key_locator``), fetches each shard
once on first use into its local cache (``shard_cache``) and reads it there.

Concurrency model: everything one snapshot needs lives in one ``LoadedSnapshot``, and the reader
holds a single reference to it. A read takes that reference once and never locks on the hot path;
``refresh()`` builds a complete new snapshot and swaps the reference, so a read sees either the
old snapshot or the new one, never a mix. Locks are only taken to open a cold shard and to swap.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ManifestValidationError,
    ObjectNotFoundError,
    ReaderError,
    UnusableSnapshotError,
)
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.description import OpenShard, ReaderDescription, describe_snapshot
from airflow_provider_shardyfusion.core.read.follow import Follower, PointerWatch, check_follow_arguments, follower_thread_name
from airflow_provider_shardyfusion.core.read.health import CheckLog, ReaderHealth, reader_health
from airflow_provider_shardyfusion.core.read.key_locator import group_keys
from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot, StaleSnapshot
from airflow_provider_shardyfusion.core.read.metrics import TIMED_GET_MASK, ReaderMetrics
from airflow_provider_shardyfusion.core.read.shard_cache import DEFAULT_MAX_LOCAL_LAYERS, ShardCache
from airflow_provider_shardyfusion.core.read.shard_subset import ShardSubset
from airflow_provider_shardyfusion.core.read.value_decoding import ValueDecoding, located_error, validate_value_decoding
from airflow_provider_shardyfusion.core.storage import ObjectStore, StorageOptions, open_store

if TYPE_CHECKING:
    import os
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.model.manifest import Manifest

__all__ = [
    "OpenShard", "ReaderDescription", "ReaderHealth", "RefreshReport", "ShardedReader", "default_max_open_files",
    "default_max_open_shards",
]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RefreshReport:
    """What the last ``refresh()`` that swapped snapshots cost: layers and bytes downloaded, shards rebuilt
    (and of those, compacted locally past ``max_local_layers``)."""

    run_id: str
    previous_run_id: str
    shards_rebuilt: int
    layers_downloaded: int
    bytes_downloaded: int
    layers_reused: int
    shards_compacted: int = 0


class ShardedReader:
    """Key look-ups over the snapshot an output root's ``_CURRENT`` names.

    :param output_uri: the snapshot root, ``s3://bucket/prefix`` or ``file:///abs/dir``.
    :param cache_dir: where shards are downloaded (``<cache_dir>/run_id=<run>/db=<id>/``), reused across
        readers and kept on close; default: a private temporary folder, removed on ``close()``.
    :param storage_options: a ``StorageOptions`` or its dict; credentials otherwise come from boto3's chain.
    :param manifest_ref: read this manifest (a URI under ``output_uri/manifests/``) instead of the live
        one; the reader is pinned and ``refresh()`` always returns False.
    :param max_local_layers: a chain shard built locally with more layers (sorted runs) than this is
        compacted in the cache once built; None keeps every layer (one more file per look-up each).
    :param max_open_shards: shard databases open at once; past it the least recently opened shard is
        closed and reopened, unchecked, on its next read. None: ``default_max_open_shards()``.
    :param max_open_files: SST files those shards hold open together (one per layer of a chain shard
        kept as it is), bounded the same way. None: ``default_max_open_files()``.
    :param ingest_refreshes: a follower: each SST-layout shard is served from a live shard
        (``live_shards``) into which ``refresh()`` ingests a delta's new layers; not with
        ``manifest_ref``. Otherwise ``refresh()`` builds the changed shards the reader had open and
        opens only as many as fit within the bounds next to the old snapshot's.
    :param live: the former name of ``ingest_refreshes``, refused with a message naming it.
    :param value_decoding: what ``get``/``multi_get`` return for a JSON snapshot (SPEC §18):
        ``"typed"`` (default) a dict of Python values typed by the run's ``value_schema``
        (``core.read.value_decoding``; ``json.loads`` for a manifest without one), ``"json"``
        ``json.loads`` of the stored bytes, ``"raw"`` the stored bytes. Binary snapshots return bytes.
    :param follow_interval_s: a background thread reads ``_CURRENT`` about that often (±10 % jitter;
        a conditional GET on S3) and calls ``refresh()`` when it moved; a failed check (``_CURRENT``
        unreadable, or naming a run the reader cannot serve) waits twice as long as the one before, up
        to ten intervals; ``close()`` stops it and joins it. The thread is named
        ``follow.follower_thread_name(reader.output_uri)``. Not with ``manifest_ref``.
    :param on_refresh: called with ``last_refresh`` after each swap the follower made (its thread).
    :param on_error: called with the exception of each of the follower's failed checks (its thread; one
        that raises is logged); an ``UnusableSnapshotError`` for a run it cannot serve.
    :param max_staleness_s: ``health()`` says ``"degraded"`` once the reader has not confirmed for this
        long that it serves what ``_CURRENT`` names (``ReaderHealth.last_success_at``: the last check
        that succeeded, the follower's, a ``refresh()`` or the load). Not the run's age: a run
        published a day ago that ``_CURRENT`` still names is current. None: never stale.
    :param meter_provider: the OpenTelemetry ``MeterProvider`` of the metrics (meter
        ``shardyfusion.reader``); None: the global one, a no-op until an SDK is configured.
    :param shard_ids: serve only these shards (ints or a ``range``; None: all), one host's part of a
        fleet: no other shard is ever downloaded, also on refresh, and a key routed outside them raises
        ``ShardNotServedError`` (``route(key)`` says where it goes). An id outside ``[0, num_dbs)`` of
        the manifest loaded (also by a refresh, which then keeps the old snapshot) is a ``ConfigError``.

    ``describe()`` says what the reader holds now. Thread-safe: ``get``/``multi_get`` may run from
    many threads, also while ``refresh()`` swaps in a new snapshot.
    """

    def __init__(
        self,
        output_uri: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        storage_options: StorageOptions | Mapping[str, Any] | None = None,
        manifest_ref: str | None = None,
        max_local_layers: int | None = DEFAULT_MAX_LOCAL_LAYERS,
        max_open_shards: int | None = None,
        max_open_files: int | None = None,
        ingest_refreshes: bool = False,
        live: None = None,
        value_decoding: ValueDecoding = "typed",
        follow_interval_s: float | None = None,
        on_refresh: Callable[[RefreshReport], Any] | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
        max_staleness_s: float | None = None,
        meter_provider: Any = None,
        shard_ids: Iterable[int] | None = None,
    ):
        _check_arguments(max_local_layers, max_open_shards, max_open_files, pinned=manifest_ref is not None,
                         ingest_refreshes=ingest_refreshes, live=live)
        check_follow_arguments(follow_interval_s, max_staleness_s, pinned=manifest_ref is not None)
        self._value_decoding = validate_value_decoding(value_decoding)
        self._root = layout.normalize_root(output_uri)
        self._pinned = manifest_ref is not None
        self._subset = ShardSubset(shard_ids) if shard_ids is not None else None
        if storage_options is not None and not isinstance(storage_options, StorageOptions):
            storage_options = dict(storage_options)
        self._store: ObjectStore = open_store(self._root, storage_options)
        self._snapshots = SnapshotRoot(self._store)
        self._swap_lock = threading.Lock()
        self._state: LoadedSnapshot | None = None
        self._max_open_shards = max_open_shards if max_open_shards is not None else default_max_open_shards()
        self._max_open_files = max_open_files if max_open_files is not None \
            else default_max_open_files(ingest_refreshes=ingest_refreshes)
        self._cache = ShardCache(self._store, cache_dir, max_local_layers=max_local_layers,
                                 ingest_refreshes=ingest_refreshes)
        self.last_refresh: RefreshReport | None = None
        self._max_staleness_s = max_staleness_s
        self._checks = CheckLog()
        self._follower: Follower | None = None
        try:
            pointer = self._pinned_pointer(manifest_ref) if manifest_ref is not None else self._snapshots.current()
            if pointer is None:
                raise ReaderError(
                    f"no snapshot is published at {self._root}: {layout.join(self._root, layout.CURRENT_KEY)} "
                    "does not exist (has a write finished publishing there?)"
                )
            self._state = self._load(pointer)
        except BaseException:
            self._cache.close()
            raise
        self._checks.record(None)
        self._metrics = ReaderMetrics(meter_provider, snapshot=lambda: self._state,
                                      bytes_downloaded=lambda: self._cache.stats.bytes_downloaded)
        self._gets, self._misses = self._metrics.gets, self._metrics.misses
        if follow_interval_s is not None:
            self._follower = Follower(
                interval_s=follow_interval_s, watch=PointerWatch(self._snapshots, lambda: self._current().pointer),
                refresh=self._checked_refresh, report=lambda: self.last_refresh, on_check=self._polled,
                on_refresh=on_refresh, on_error=on_error, name=follower_thread_name(self._root),
            )
            self._follower.start()

    # -- public surface ------------------------------------------------------------------------

    @property
    def output_uri(self) -> str:
        return self._root

    @property
    def manifest(self) -> Manifest:
        return self._current().manifest

    @property
    def run_id(self) -> str:
        return self._current().run_id

    @property
    def cache_dir(self) -> str:
        return self._cache.root

    @property
    def cache_stats(self) -> dict[str, int]:
        """What this reader's cache downloaded and built so far: layers, bytes, shards built, layers reused."""
        return self._cache.stats.snapshot()

    def get(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> Any:
        """The decoded value of ``key``, or ``None`` if the snapshot does not hold it.

        ``routing_context`` gives the other column values a multi-column CEL routing needs
        (ignored by hash routing).
        """
        # The metrics' whole cost here: a count (and one on a miss); one get in 64 timed (see metrics.py).
        if next(self._gets) & TIMED_GET_MASK:
            value = self._get(key, routing_context=routing_context)
        else:
            value = self._metrics.timed_get(self._get, key, routing_context)
        if value is None:
            next(self._misses)
        return value

    def _get(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> Any:
        state = self._state
        if state is not None:
            generation = state.generation
            db_id, stored = state.locate(key, routing_context)
            db = state.handles.get(db_id)
            if db is not None:
                data = db.get(stored)
                if state.generation != generation:  # pinned by a refresh meanwhile: read through the pin
                    return self._get_slow(key, routing_context)
                if data is None:
                    return None
                decode = state.decode
                if decode is None:
                    return data
                try:
                    return decode(data)
                except ReaderError as exc:
                    raise located_error(exc, run_id=state.run_id, db_id=db_id, key=key) from exc
            if self._subset is not None:
                self._subset.check(key, db_id)
            if db_id not in state.shards:  # empty shard: left out of the sparse manifest, no I/O
                return None
        return self._get_slow(key, routing_context)

    def multi_get(
        self, keys: Iterable[Any], *, routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> list[Any]:
        """Values of ``keys`` in input order (``None`` where absent), one batched read per shard.

        ``routing_context``: one mapping for every key, or one mapping per key.
        """
        return self.multi_get_with_run_id(keys, routing_context=routing_context)[1]

    def multi_get_with_run_id(
        self, keys: Iterable[Any], *, routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[str, list[Any]]:
        """``(run_id, values)``: ``multi_get(keys)`` and the run every value was read from, in one step.

        All values come from one snapshot (a refresh during the call makes it read again from the new
        one), so the run id names them all: what a server puts beside its answer (``shardyfusion serve``).
        """
        keys = keys if isinstance(keys, list) else list(keys)
        contexts: Sequence[Mapping[str, Any]] | None = None
        if routing_context is not None and not isinstance(routing_context, Mapping):
            contexts = list(routing_context)
            if len(contexts) != len(keys):
                raise ReaderError(
                    f"multi_get: routing_context has {len(contexts)} mappings for {len(keys)} keys; "
                    "give one mapping for all keys or one per key"
                )
        got = self._multi_get_pinned(keys, routing_context, contexts, open_missing=True)
        assert got is not None  # only None when asked not to open shards
        return got

    def multi_get_if_open(self, keys: list[Any]) -> tuple[str, list[Any]] | None:
        """``multi_get_with_run_id(keys)`` when every shard ``keys`` route to is open, else None.

        Never downloads, builds or opens a shard, nor waits on a shard's lock: what an event loop may
        call inline, handing the batch to a thread only on None (``shardyfusion serve`` does, saving a
        thread hop per request once its shards are open). A key outside ``shard_ids`` raises as in
        ``multi_get``.
        """
        return self._multi_get_pinned(keys, None, None, open_missing=False)

    def _multi_get_pinned(
        self, keys: list[Any], routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        contexts: Sequence[Mapping[str, Any]] | None, *, open_missing: bool,
    ) -> tuple[str, list[Any]] | None:
        """``(run_id, values)`` all read from one snapshot (read again if a refresh pinned it meanwhile)."""
        while True:
            state = self._current()
            generation = state.generation
            try:
                shared = routing_context if contexts is None and isinstance(routing_context, Mapping) else None
                values = self._multi_get(state, keys, shared, contexts, open_missing=open_missing)
            except StaleSnapshot:
                self._check_swapped(state)
                continue
            if values is None:
                return None
            if state.generation == generation:  # else a refresh pinned this snapshot meanwhile: read again
                self._metrics.count_batch(len(values), values.count(None))
                return state.run_id, values

    def route(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> int:
        """The shard id ``key`` routes to (the writer's function, SPEC §4), served here or not: a
        fleet's client asks it to pick the host whose ``shard_ids`` hold that shard."""
        return self._current().locate(key, routing_context)[0]

    def shard_for_key(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> int:
        """The shard id ``key`` routes to: ``route(key)``."""
        return self.route(key, routing_context=routing_context)

    @property
    def shard_ids(self) -> frozenset[int] | None:
        """The shard ids this reader serves (None: every shard)."""
        return self._subset.ids if self._subset is not None else None

    def shard_for_token(self, token: Any) -> int:
        """Categorical CEL snapshots: the shard holding rows whose expression yields ``token``."""
        state = self._current()
        router = state.cel_router
        if router is None or router.spec.mode != "categorical":
            raise ReaderError(
                f"shard_for_token needs a categorical CEL snapshot; run {state.run_id!r} at {self._root} uses "
                f"{state.manifest.sharding.strategy} sharding"
                + (f" ({router.spec.mode} mode)" if router is not None else "")
            )
        return router.shard_for_token(token)

    def refresh(self) -> bool:
        """Follow ``_CURRENT`` again. True if a new snapshot was swapped in, False if not.

        A pointer that is malformed or gone, or names a manifest that is missing or malformed,
        keeps the current snapshot and returns False (SPEC §9), but is a failed check as the
        follower's would be: ``health()`` says ``"degraded"`` with the run and why, and the metrics
        count a failed refresh. Other storage errors are raised, also keeping it. Never runs next
        to another ``refresh()`` (the follower's or another thread's): it waits for it.
        """
        try:
            return self._checked_refresh()
        except UnusableSnapshotError as exc:
            log.warning("%s", exc)
            return False

    def _checked_refresh(self) -> bool:
        """``refresh()`` raising ``UnusableSnapshotError`` for a run it declines (the follower's:
        a failed check it backs off from), its outcome recorded for ``health()`` and the metrics."""
        start = time.perf_counter()
        try:
            swapped = self._refresh()
        except Exception as exc:
            self._checks.record(exc)
            self._metrics.refreshed("failed", time.perf_counter() - start)
            raise
        self._checks.record(None)
        self._metrics.refreshed("swapped" if swapped else "unchanged", time.perf_counter() - start)
        return swapped

    def _polled(self, error: BaseException | None, seconds: float) -> None:
        """A follower's round that did not call ``refresh()``: ``_CURRENT`` had not moved, or could not
        be read; the latter is counted as a failed refresh, as ``refresh()`` would have counted it."""
        self._checks.record(error)
        if error is not None:
            self._metrics.refreshed("failed", seconds)

    def health(self) -> ReaderHealth:
        """Whether the reader serves, which run, how old, and how its last check of ``_CURRENT`` went.

        Cheap (no request): fit for a readiness probe. See ``ReaderHealth`` for the statuses."""
        return reader_health(self._state, self._checks, max_staleness_s=self._max_staleness_s)

    def _refresh(self) -> bool:
        with self._swap_lock:
            old = self._current()
            if self._pinned:
                return False
            current_uri = layout.join(self._root, layout.CURRENT_KEY)
            try:
                pointer = self._snapshots.current()
            except ManifestValidationError as exc:
                raise UnusableSnapshotError.malformed_pointer(current_uri, exc, old.run_id) from exc
            if pointer is None:
                raise UnusableSnapshotError.pointer_gone(current_uri, old.run_id)
            if pointer.manifest_ref == old.pointer.manifest_ref and pointer.run_id == old.run_id:
                return False
            try:
                new = self._load(pointer)
            except (ManifestValidationError, ObjectNotFoundError) as exc:
                raise UnusableSnapshotError.run(current_uri, pointer.run_id, pointer.manifest_ref, exc,
                                                old.run_id) from exc
            # Back to a run whose folder awaits deletion (a rollback): keep it. Done before the
            # swap, so no download for ``new`` can start while the folder is still doomed.
            self._cache.keep_run(new.run_id)
            before = self._cache.stats.snapshot()
            rebuilt = self._cache.carry_over(old, new, max_open_shards=self._max_open_shards,
                                             max_open_files=self._max_open_files)
            after = self._cache.stats.snapshot()
            self._state = new
            old.retire()
            if new.run_id != old.run_id:
                self._cache.drop_run(old.run_id)
                self._cache.prune_layers(new.manifest.layer_run_ids())
            self.last_refresh = RefreshReport(
                run_id=new.run_id, previous_run_id=old.run_id, shards_rebuilt=rebuilt,
                layers_downloaded=after["layers_downloaded"] - before["layers_downloaded"],
                bytes_downloaded=after["bytes_downloaded"] - before["bytes_downloaded"],
                layers_reused=after["layers_reused"] - before["layers_reused"],
                shards_compacted=after["shards_compacted"] - before["shards_compacted"],
            )
            log.info("reader %s: now serving run %s (was %s): %s", self._root, new.run_id, old.run_id, self.last_refresh)
            return True

    def describe(self) -> ReaderDescription:
        """What this reader holds now: its run, its open shards (live or read-only), the files they hold, its bounds."""
        return describe_snapshot(self._current(), cache_dir=self._cache.root, max_open_shards=self._max_open_shards,
                                 max_open_files=self._max_open_files, ingest_refreshes=self._cache.ingests_refreshes)

    def open_shard(self, db_id: int) -> Any:
        """The shard's raw-mode, read-only rocksdict database (None for an empty shard), for tools and the writer.

        A reader ingesting refreshes may give its live shard: read it only, and know that a refresh
        ingests into it."""
        if self._subset is not None:
            self._subset.check_shard(db_id)
        while True:
            state = self._current()
            try:
                return self._cache.open_shard(state, db_id)
            except StaleSnapshot:
                self._check_swapped(state)

    def close(self) -> None:
        """Stop the follower, close every shard and, for a private cache, delete the downloads. Idempotent."""
        if self._follower is not None:  # first, and outside the lock its refresh takes
            self._follower.stop()
        self._metrics.close()
        with self._swap_lock:
            state, self._state = self._state, None
            if state is not None:
                state.retire()
            self._cache.close()

    def __enter__(self) -> ShardedReader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self._state
        return f"ShardedReader({self._root!r}, run_id={state.run_id if state else None!r}, cache_dir={self._cache.root!r})"

    # -- reads (slow paths) --------------------------------------------------------------------

    def _current(self) -> LoadedSnapshot:
        state = self._state
        if state is None:
            raise ReaderError(f"the reader of {self._root} is closed")
        return state

    def _check_swapped(self, state: LoadedSnapshot) -> None:
        """After a read found its snapshot retired: go on with the new one, or fail if the reader closed."""
        if self._current() is state:  # retire() always swaps first; anything else is a bug
            raise ReaderError(f"run {state.run_id!r} at {self._root} was retired but is still current")

    def _get_slow(self, key: Any, routing_context: Mapping[str, Any] | None) -> Any:
        while True:
            state = self._current()
            generation = state.generation
            db_id, stored = state.locate(key, routing_context)
            if self._subset is not None:
                self._subset.check(key, db_id)
            try:
                db = self._cache.open_shard(state, db_id)
                if db is None:  # empty shard: left out of the sparse manifest, nothing to read
                    return None
                data = db.get(stored)
            except StaleSnapshot:
                self._check_swapped(state)
                continue
            if state.generation != generation:
                continue
            if data is None or state.decode is None:
                return data
            try:
                return state.decode(data)
            except ReaderError as exc:
                raise located_error(exc, run_id=state.run_id, db_id=db_id, key=key) from exc

    def _multi_get(
        self, state: LoadedSnapshot, keys: list[Any], ctx: Mapping[str, Any] | None,
        contexts: Sequence[Mapping[str, Any]] | None, *, open_missing: bool = True,
    ) -> list[Any] | None:
        """The values of ``keys`` from ``state``; None if ``open_missing`` is False and a shard they
        need is not open (an empty shard, left out of a sparse manifest, needs nothing)."""
        group = state.group
        groups = group(keys) if group is not None else group_keys(state.locate, keys, ctx, contexts)
        if self._subset is not None:  # before any read: a batch is answered whole or not at all
            self._subset.check_groups(groups, keys)
        out: list[Any] = [None] * len(keys)
        decode = state.decode
        handles = state.handles
        for db_id, (positions, stored_keys) in groups.items():
            db = handles.get(db_id)
            if db is None:
                if not open_missing and db_id in state.shards:
                    return None
                db = self._cache.open_shard(state, db_id)
                if db is None:  # empty shard
                    continue
            values: list[Any] = db.get(stored_keys)  # type: ignore[arg-type,assignment]  # rocksdict batch read (MultiGet); its stub wants list[str | int | ...]
            if decode is None:
                for i, value in zip(positions, values, strict=False):
                    out[i] = value
            else:
                _decode_into(out, positions, values, decode, state.run_id, db_id, keys)
        return out

    # -- snapshots -----------------------------------------------------------------------------

    def _pinned_pointer(self, manifest_ref: str) -> CurrentPointer:
        """The pointer ``_CURRENT`` would hold for ``manifest_ref`` (same checks as a real one)."""
        ref = self._snapshots.manifest_ref(manifest_ref)
        pointer = CurrentPointer(manifest_ref=ref.uri, run_id=ref.run_id, updated_at=ref.published_at)
        pointer.check_root(self._root)
        return pointer

    def _load(self, pointer: CurrentPointer) -> LoadedSnapshot:
        """Fetch and validate the manifest ``pointer`` names; refuse anything that leaves its run."""
        manifest = self._snapshots.read_manifest(pointer)
        if self._subset is not None:
            self._subset.check_manifest(manifest)
        max_files = self._cache.files_for_shards(manifest, self._max_open_files, self._max_open_shards)
        return LoadedSnapshot(pointer, manifest, max_open=self._max_open_shards, max_files=max_files,
                              value_decoding=self._value_decoding)


def _decode_into(out: list[Any], positions: list[int], values: list[Any], decode: Callable[[bytes], Any], run_id: str,
                 db_id: int, keys: list[Any]) -> None:
    """``out[positions[n]] = decode(values[n])`` where a value was found; an error names the run, shard and key."""
    try:
        for i, value in zip(positions, values, strict=False):
            if value is not None:
                out[i] = decode(value)
    except ReaderError as exc:
        raise located_error(exc, run_id=run_id, db_id=db_id, key=keys[i]) from exc


def default_max_open_shards() -> int:
    """An eighth of the soft open-files limit: room for the old snapshot's handles during a refresh,
    shard builds, other readers and the rest of the process."""
    return max(16, _soft_nofile() // 8)


def default_max_open_files(*, ingest_refreshes: bool = False) -> int:
    """A quarter of the soft open-files limit: a follower of a 1000-shard chain (up to five files a
    shard with the default ``max_local_layers``) keeps every shard open under a limit of 20000, and
    was several times slower per ``get`` with an eighth (shards reopened); three such readers still fit. A
    third for a reader that ingests refreshes: a live shard holds ~1.4 descriptors more than its SSTs (its column
    family's and its share of its database's), so 1000 shards of up to four sorted runs need ~5400,
    and a refresh opens nothing next to the old snapshot's (which the quarter leaves room for)."""
    return max(16, _soft_nofile() // (3 if ingest_refreshes else 4))


def _check_arguments(max_local_layers: int | None, max_open_shards: int | None, max_open_files: int | None, *,
                     pinned: bool, ingest_refreshes: bool, live: object) -> None:
    """Refuse what ``ShardedReader`` cannot honour, naming the argument."""
    if live is not None:
        raise ReaderError(f"ShardedReader(live={live!r}) is now ShardedReader(ingest_refreshes={live!r}): "
                          "'live' names the run _CURRENT points to")
    if max_local_layers is not None and (isinstance(max_local_layers, bool) or not isinstance(max_local_layers, int)
                                         or max_local_layers < 1):
        raise ReaderError(f"max_local_layers must be a positive integer or None, got {max_local_layers!r}")
    for name, bound in (("max_open_shards", max_open_shards), ("max_open_files", max_open_files)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ReaderError(f"{name} must be a positive integer or None, got {bound!r}")
    if ingest_refreshes and pinned:
        raise ReaderError("ingest_refreshes=True is for a reader that follows _CURRENT; "
                          "a manifest_ref reader never refreshes")


def _soft_nofile() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft
