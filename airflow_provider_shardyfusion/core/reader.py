"""Read a published snapshot: ``_CURRENT`` → manifest → shard (SPEC §9).

The reader routes a key exactly as the writer did (SPEC §4), encodes it exactly as it was stored
(SPEC §5), downloads each shard once on first use into a local cache (checking every file's size
and checksum), and opens it read-only with rocksdict in raw mode. A shard shipped as SST files
only (``shard_layout`` "sst") is first ingested, in the manifest's file order, into a fresh
database in the cache.

Concurrency model: everything one snapshot needs lives in one ``_Snapshot`` object, and the
reader holds a single reference to it. A read takes that reference once and never locks on the
hot path; ``refresh()`` builds a complete new ``_Snapshot`` and swaps the reference, so a read sees
either the old snapshot or the new one, never a mix. Locks are only taken to open a cold shard
(one lock per shard, so a shard is downloaded once however many threads want it) and to swap.

Retired shard handles are never closed explicitly: rocksdict refuses ``close()`` while another
thread is inside a read of the same handle ("Already borrowed"), and the read would then fail.
Instead the retired snapshot drops its handles and each one closes (rocksdict closes on
deallocation) as soon as the last read still using it returns.

Cached files are deleted (a retired run's folder on ``refresh()``, a private cache on ``close()``)
only when no shard download of that run is in flight; otherwise the last such download deletes
them when it ends. A download of a retired snapshot stops at its next file and the read retries
on the current snapshot (or fails with "closed").
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import struct
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rocksdict import AccessType, IngestExternalFileOptions, Options, Rdict

from . import layout
from .checksum import file_checksum, verify_file
from .encoding import PACK_INT_KEY, decode_value, encode_key
from .errors import (
    ChecksumMismatchError,
    ConfigError,
    ManifestValidationError,
    ObjectNotFoundError,
    ReaderError,
)
from .manifest import SHARD_LAYOUT_SST, SHARD_LAYOUTS, Manifest, ShardEntry
from .pointer import CurrentPointer
from .routing import CelRouter, CelSpec, hash64, pack_int_key, route_key
from .snapshot import SnapshotRoot
from .storage import ObjectStore, StorageOptions, open_store

log = logging.getLogger(__name__)

# Written next to the shard files once every file is verified; a cached shard without a matching
# marker (crash mid-download, another manifest) is downloaded again. RocksDB ignores the file.
_MARKER = ".shardyfusion-shard.json"
# "sst" layout: the downloaded SSTs wait here (inside the staging folder) until they are ingested.
_INCOMING = ".incoming"



# (key, routing_context) -> (db_id, stored key bytes)
_Prep = Callable[[Any, "Mapping[str, Any] | None"], "tuple[int, bytes]"]
# keys -> {db_id: (positions in keys, stored key bytes)}
_Groups = dict[int, tuple[list[int], list[bytes]]]
_Group = Callable[[list[Any]], _Groups]


class _StaleSnapshot(Exception):
    """Internal: the snapshot a read started on was swapped out by ``refresh()``/``close()``."""


class _Snapshot:
    """One followed snapshot: manifest, routing, and the shard handles opened so far.

    Not a frozen dataclass on purpose: ``handles`` fills lazily. Everything else is fixed at
    construction. ``handles`` is read without a lock (a dict lookup is atomic in CPython) and
    written only under the shard's lock and ``mutex``.
    """

    __slots__ = (
        "cel_lock",
        "cel_router",
        "decode",
        "group",
        "handles",
        "manifest",
        "mutex",
        "pointer",
        "prep",
        "retired",
        "run_id",
        "shard_locks",
        "shards",
    )

    def __init__(self, pointer: CurrentPointer, manifest: Manifest):
        self.pointer = pointer
        self.manifest = manifest
        self.run_id = manifest.run_id
        if manifest.shard_layout not in SHARD_LAYOUTS:
            raise ManifestValidationError(
                f"manifest of run {self.run_id!r}: shard_layout {manifest.shard_layout!r} is unknown to this reader "
                f"(expected one of {list(SHARD_LAYOUTS)}); upgrade the reader"
            )
        self.shards: dict[int, ShardEntry] = {s.db_id: s for s in manifest.shards}
        self.handles: dict[int, Rdict] = {}
        self.shard_locks = {db_id: threading.Lock() for db_id in self.shards}
        self.mutex = threading.Lock()
        self.retired = False
        self.cel_router: CelRouter | None = None
        self.cel_lock = threading.Lock()
        # Binary values are stored as is: skipping the decode call keeps get() close to raw rocksdict.
        fmt = manifest.value_format
        self.decode: Callable[[bytes], Any] | None = None if fmt == "binary" else (lambda data: decode_value(data, fmt))
        self.prep: _Prep = self._build_prep()
        self.group: _Group | None = (
            _int_grouper(manifest.num_dbs, manifest.key_encoding, manifest.sharding.key_column)
            if manifest.sharding.strategy == "hash" and manifest.key_encoding in ("u64be", "u32be") else None
        )

    # -- routing -------------------------------------------------------------------------------

    def _build_prep(self) -> _Prep:
        m = self.manifest
        sharding = m.sharding
        if sharding.strategy == "hash":
            return _hash_prep(m.num_dbs, m.key_encoding, sharding.key_column)
        columns = dict(sharding.cel_columns or {})
        unresolved = sorted(c for c, t in columns.items() if t is None)
        if unresolved:
            raise ManifestValidationError(
                f"manifest of run {self.run_id!r}: cel_columns {unresolved} have no CEL type; "
                "the writer must record resolved types"
            )
        try:
            self.cel_router = CelRouter(CelSpec(
                expr=sharding.cel_expr or "", columns=columns, mode=sharding.cel_mode or "direct",
                num_dbs=m.num_dbs, routing_values=sharding.routing_values,
            ))
        except ConfigError as exc:
            raise ManifestValidationError(f"manifest of run {self.run_id!r}: CEL routing cannot be rebuilt: {exc}") from None
        return _cel_prep(self.cel_router, self.cel_lock, self.run_id, m.key_encoding, sharding.key_column,
                         sharding.cel_expr or "")

    # -- shard handles -------------------------------------------------------------------------

    def register(self, db_id: int, db: Rdict) -> None:
        with self.mutex:
            if self.retired:
                raise _StaleSnapshot()
            self.handles[db_id] = db

    def retire(self) -> None:
        """Stop serving: later reads retry on the new snapshot; handles close once unused."""
        with self.mutex:
            self.retired = True
            self.handles.clear()


def _hash_prep(num_dbs: int, key_encoding: str, key_column: str) -> _Prep:
    """Routing + key encoding for the hash strategy, with a fast path for the key's usual type.

    The fast paths compute exactly ``routing.route_key`` and ``encoding.encode_key`` (struct raises
    on the same out-of-range keys); anything unusual falls back to those functions, which also
    produce the clear error messages.
    """
    n = num_dbs
    xxh3 = hash64

    def generic(key: Any) -> tuple[int, bytes]:
        stored = encode_key(key, key_encoding, column=key_column)
        return route_key(key, n), stored

    if key_encoding in ("u64be", "u32be"):
        pack = PACK_INT_KEY[key_encoding]

        def prep(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is int:
                try:
                    return xxh3(pack_int_key(key)) % n, pack(key)
                except struct.error:
                    pass
            return generic(key)

    elif key_encoding == "utf8":

        def prep(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is str:
                try:
                    data = key.encode("utf-8")
                except UnicodeEncodeError:
                    return generic(key)
                return xxh3(data) % n, data
            return generic(key)

    else:  # raw

        def prep(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is bytes:
                return xxh3(key) % n, key
            return generic(key)

    return prep


def _int_grouper(num_dbs: int, key_encoding: str, key_column: str) -> _Group:
    """``multi_get``'s routing loop for integer keys, inlined: no call per key (SPEC §4/§5 as above)."""
    n = num_dbs
    xxh3 = hash64
    pack_le = pack_int_key
    pack = PACK_INT_KEY[key_encoding]
    slow = _hash_prep(num_dbs, key_encoding, key_column)

    def group(keys: list[Any]) -> _Groups:
        groups: _Groups = {}
        for i, key in enumerate(keys):
            if type(key) is int:
                try:
                    db_id = xxh3(pack_le(key)) % n
                    stored = pack(key)
                except struct.error:
                    db_id, stored = slow(key, None)
            else:
                db_id, stored = slow(key, None)
            found = groups.get(db_id)
            if found is None:
                groups[db_id] = ([i], [stored])
            else:
                found[0].append(i)
                found[1].append(stored)
        return groups

    return group


def _cel_prep(
    router: CelRouter, lock: threading.Lock, run_id: str, key_encoding: str, key_column: str, expr: str
) -> _Prep:
    columns = tuple(router.spec.columns)
    key_only = set(columns) == {key_column}
    key_in_columns = key_column in columns
    others = [c for c in columns if c != key_column]

    def prep(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
        stored = encode_key(key, key_encoding, column=key_column)
        if key_only:
            row: Mapping[str, Any] = {key_column: key}
        else:
            if ctx is None:
                raise ReaderError(
                    f"snapshot {run_id!r} routes with CEL expression {expr!r} over columns {list(columns)}, "
                    f"which the key alone does not give: pass routing_context={{...}} with values for {others}"
                )
            missing = [c for c in others if ctx.get(c) is None]
            if missing:
                raise ReaderError(
                    f"routing_context {dict(ctx)!r} lacks values for CEL columns {missing} "
                    f"(expression {expr!r} of snapshot {run_id!r})"
                )
            row = dict(ctx)
            if key_in_columns:
                row[key_column] = key
        # cel-python walks a shared parse tree; serialize evaluations rather than trust it to be re-entrant.
        with lock:
            return router.route(row), stored

    return prep


class ShardedReader:
    """Key look-ups over the snapshot an output root's ``_CURRENT`` names.

    ``cache_dir``: where shards are downloaded (``<cache_dir>/run_id=<run>/db=<id>/``); reused across
    readers and kept on close. By default the reader uses a private temporary folder and removes
    it on ``close()``. ``storage_options``: a ``StorageOptions`` or its dict (endpoint_url,
    region_name, addressing_style, ...); credentials otherwise come from boto3's default chain.
    ``manifest_ref``: read this manifest (a URI under ``output_uri/manifests/``) instead of the one
    ``_CURRENT`` names, e.g. to check a snapshot that is not live; such a reader is pinned and
    ``refresh()`` always returns False.

    Thread-safe: ``get``/``multi_get`` may run from many threads, also while ``refresh()`` swaps
    in a new snapshot.
    """

    def __init__(
        self,
        output_uri: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        storage_options: StorageOptions | Mapping[str, Any] | None = None,
        manifest_ref: str | None = None,
    ):
        self._root = layout.normalize_root(output_uri)
        self._pinned = manifest_ref is not None
        if storage_options is not None and not isinstance(storage_options, StorageOptions):
            storage_options = dict(storage_options)
        self._store: ObjectStore = open_store(self._root, storage_options)
        self._snapshots = SnapshotRoot(self._store)
        self._swap_lock = threading.Lock()
        self._state: _Snapshot | None = None
        # Guards the three below: cached files may be deleted only while no download writes there.
        self._cache_lock = threading.Lock()
        self._downloads: collections.Counter[str] = collections.Counter()  # run_id -> shard downloads in flight
        self._doomed_runs: set[str] = set()  # run folders to delete when their last download ends
        self._close_pending = False  # the private cache goes when the last download ends
        if cache_dir is None:
            self._cache_root = tempfile.mkdtemp(prefix="shardyfusion-reader-")
            self._owns_cache = True
            # A reader dropped without close() must not leave its downloads behind.
            self._cleanup: weakref.finalize[Any, Any] | None = weakref.finalize(
                self, shutil.rmtree, self._cache_root, True)
        else:
            self._cache_root = os.path.abspath(os.fspath(cache_dir))
            os.makedirs(self._cache_root, exist_ok=True)
            self._owns_cache = False
            self._cleanup = None
        try:
            pointer = self._pinned_pointer(manifest_ref) if manifest_ref is not None else self._read_pointer()
            if pointer is None:
                raise ReaderError(
                    f"no snapshot is published at {self._root}: {layout.join(self._root, layout.CURRENT_KEY)} "
                    "does not exist (has a write finished publishing there?)"
                )
            self._state = self._load(pointer)
        except BaseException:
            self._remove_owned_cache()
            raise

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
        return self._cache_root

    def get(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> Any:
        """The decoded value of ``key``, or ``None`` if the snapshot does not hold it.

        ``routing_context`` gives the other column values a multi-column CEL routing needs
        (ignored by hash routing).
        """
        state = self._state
        if state is not None:
            db_id, stored = state.prep(key, routing_context)
            db = state.handles.get(db_id)
            if db is not None:
                data = db.get(stored)
                if data is None:
                    return None
                decode = state.decode
                return data if decode is None else decode(data)
            if db_id not in state.shards:  # empty shard: left out of the sparse manifest, no I/O
                return None
        return self._get_slow(key, routing_context)

    def multi_get(
        self, keys: Iterable[Any], *, routing_context: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> list[Any]:
        """Values of ``keys`` in input order (``None`` where absent), one batched read per shard.

        ``routing_context``: one mapping for every key, or one mapping per key.
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
        while True:
            state = self._current()
            try:
                shared = routing_context if contexts is None and isinstance(routing_context, Mapping) else None
                return self._multi_get(state, keys, shared, contexts)
            except _StaleSnapshot:
                self._check_swapped(state)

    def shard_for_key(self, key: Any, *, routing_context: Mapping[str, Any] | None = None) -> int:
        """The shard id ``key`` routes to (the writer's function, SPEC §4)."""
        return self._current().prep(key, routing_context)[0]

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
        """Follow ``_CURRENT`` again. True if a new snapshot was swapped in, False if unchanged.

        A new pointer or manifest that is missing or malformed keeps the current snapshot
        (logged, returns False). Other storage errors are raised, also keeping it.
        """
        with self._swap_lock:
            old = self._current()
            if self._pinned:
                return False
            try:
                pointer = self._read_pointer()
            except ManifestValidationError as exc:
                log.warning("reader %s: keeping run %s: _CURRENT is malformed: %s", self._root, old.run_id, exc)
                return False
            if pointer is None:
                log.warning("reader %s: keeping run %s: _CURRENT has disappeared", self._root, old.run_id)
                return False
            if pointer.manifest_ref == old.pointer.manifest_ref and pointer.run_id == old.run_id:
                return False
            try:
                new = self._load(pointer)
            except (ManifestValidationError, ObjectNotFoundError) as exc:
                log.warning(
                    "reader %s: keeping run %s: the new snapshot (run %s, %s) is unusable: %s",
                    self._root, old.run_id, pointer.run_id, pointer.manifest_ref, exc,
                )
                return False
            with self._cache_lock:
                # Back to a run whose folder awaits deletion (a rollback): keep it. Done before
                # the swap, so no download for ``new`` can start while the folder is still doomed.
                self._doomed_runs.discard(new.run_id)
            self._state = new
            self._retire(old, drop_cache=new.run_id != old.run_id)
            log.info("reader %s: now serving run %s (was %s)", self._root, new.run_id, old.run_id)
            return True

    def close(self) -> None:
        """Close every shard and, for a private cache, delete the downloads. Idempotent."""
        with self._swap_lock:
            state, self._state = self._state, None
            if state is not None:
                self._retire(state, drop_cache=False)
            with self._cache_lock:
                self._close_pending = bool(self._downloads)
            # Every snapshot is retired now, so no download can start to race this deletion.
            if not self._close_pending:
                self._remove_owned_cache()

    def __enter__(self) -> ShardedReader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self._state
        return f"ShardedReader({self._root!r}, run_id={state.run_id if state else None!r}, cache_dir={self._cache_root!r})"

    # -- reads (slow paths) --------------------------------------------------------------------

    def _current(self) -> _Snapshot:
        state = self._state
        if state is None:
            raise ReaderError(f"the reader of {self._root} is closed")
        return state

    def _check_swapped(self, state: _Snapshot) -> None:
        """After a read found its snapshot retired: go on with the new one, or fail if the reader closed."""
        if self._current() is state:  # retire() always swaps first; anything else is a bug
            raise ReaderError(f"run {state.run_id!r} at {self._root} was retired but is still current")

    def _get_slow(self, key: Any, routing_context: Mapping[str, Any] | None) -> Any:
        while True:
            state = self._current()
            db_id, stored = state.prep(key, routing_context)
            try:
                db = self._handle(state, db_id)
                if db is None:  # empty shard: left out of the sparse manifest, nothing to read
                    return None
                data = db.get(stored)
            except _StaleSnapshot:
                self._check_swapped(state)
                continue
            if data is None:
                return None
            return data if state.decode is None else state.decode(data)

    def _multi_get(
        self, state: _Snapshot, keys: list[Any], ctx: Mapping[str, Any] | None,
        contexts: Sequence[Mapping[str, Any]] | None,
    ) -> list[Any]:
        prep = state.prep
        groups: _Groups = {}
        if state.group is not None:
            groups = state.group(keys)
        elif contexts is None:
            for i, key in enumerate(keys):
                db_id, stored = prep(key, ctx)
                group = groups.get(db_id)
                if group is None:
                    groups[db_id] = ([i], [stored])
                else:
                    group[0].append(i)
                    group[1].append(stored)
        else:
            for i, (key, one_ctx) in enumerate(zip(keys, contexts, strict=False)):
                db_id, stored = prep(key, one_ctx)
                positions, stored_keys = groups.setdefault(db_id, ([], []))
                positions.append(i)
                stored_keys.append(stored)
        out: list[Any] = [None] * len(keys)
        decode = state.decode
        handles = state.handles
        for db_id, (positions, stored_keys) in groups.items():
            db = handles.get(db_id)
            if db is None:
                db = self._handle(state, db_id)
                if db is None:  # empty shard
                    continue
            values: list[Any] = db.get(stored_keys)  # type: ignore[arg-type,assignment]  # rocksdict batch read (MultiGet); its stub wants list[str | int | ...]
            if decode is None:
                for i, value in zip(positions, values, strict=False):
                    out[i] = value
            else:
                for i, value in zip(positions, values, strict=False):
                    if value is not None:
                        out[i] = decode(value)
        return out

    # -- shards --------------------------------------------------------------------------------

    def _handle(self, state: _Snapshot, db_id: int) -> Rdict | None:
        """The open shard ``db_id`` of ``state``, downloading it on first use; None if empty."""
        db = state.handles.get(db_id)
        if db is not None:
            return db
        shard = state.shards.get(db_id)
        if shard is None:
            return None
        with state.shard_locks[db_id]:
            db = state.handles.get(db_id)
            if db is not None:
                return db
            self._begin_download(state)
            try:
                path = self._ensure_local(state, shard)
                try:
                    db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only(False))
                except Exception as exc:
                    raise ReaderError(
                        f"cannot open shard {db_id} of run {state.run_id!r} ({shard.db_url}) from {path}: {exc}"
                    ) from exc
                try:
                    state.register(db_id, db)
                except _StaleSnapshot:
                    db.close()  # never shared with another thread, so closing it cannot break a read
                    raise
                return db
            except _StaleSnapshot:
                raise
            except Exception as exc:
                # Whatever went wrong for a snapshot nobody serves any more (e.g. its objects were
                # already garbage-collected) is not the caller's problem: retry on the current one,
                # which reports its own errors.
                if state.retired:
                    raise _StaleSnapshot() from exc
                raise
            finally:
                self._end_download(state.run_id)

    def _begin_download(self, state: _Snapshot) -> None:
        with self._cache_lock:
            # Checked under the lock _retire takes after setting ``retired``: either this download
            # is counted before a retirement decides what to delete, or it sees the retirement.
            if state.retired:
                raise _StaleSnapshot()
            self._downloads[state.run_id] += 1

    def _end_download(self, run_id: str) -> None:
        # Deletes while holding the lock (a rare path): were it released first, a refresh() back
        # to this run could start a download into the folder during the deletion.
        with self._cache_lock:
            self._downloads[run_id] -= 1
            if self._downloads[run_id] > 0:
                return
            del self._downloads[run_id]
            if self._close_pending:
                if not self._downloads:
                    self._remove_owned_cache()
            elif run_id in self._doomed_runs:
                self._doomed_runs.discard(run_id)
                self._remove_run_cache(run_id)

    def _ensure_local(self, state: _Snapshot, shard: ShardEntry) -> str:
        """A verified local copy of ``shard``: reused if already cached, else downloaded."""
        run_id = state.run_id
        final = layout.local_cache_dir(self._cache_root, run_id, shard.db_id)
        ingest = state.manifest.shard_layout == SHARD_LAYOUT_SST
        entry: dict[str, Any] = {"db_url": shard.db_url, "files": [f.to_dict() for f in shard.files]}
        if ingest:
            entry["shard_layout"] = SHARD_LAYOUT_SST
        marker = json.dumps(entry, sort_keys=True)
        if os.path.isdir(final):
            if _cached_copy_ok(final, marker, shard, run_id):
                return final
            log.info("shard %s of run %s: cached copy at %s is stale, incomplete or corrupt; downloading again",
                     shard.db_id, run_id, final)
            shutil.rmtree(final, ignore_errors=True)
        if not shard.files:
            raise ReaderError(f"shard {shard.db_id} of run {run_id!r} ({shard.db_url}) lists no files in the manifest")
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        # Download into a private folder and rename it into place: a half-downloaded or unverified
        # shard is never visible under its final name (to this or another process sharing cache_dir).
        staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
        try:
            base_key = self._store.key_of(shard.db_url)
            fetched = os.path.join(staging, _INCOMING) if ingest else staging
            local_files: list[str] = []
            for f in shard.files:
                if state.retired:  # nobody will open it: stop fetching a shard of a retired snapshot
                    raise _StaleSnapshot()
                local = os.path.join(fetched, *f.name.split("/"))
                local_files.append(local)
                source = f"{shard.db_url}/{f.name} (shard {shard.db_id} of run {run_id!r})"
                self._store.download_file(f"{base_key}/{f.name}", local)
                try:
                    verify_file(local, f.size, f.checksum, source=source)
                except ChecksumMismatchError:
                    os.unlink(local)  # never leave a bad file where anything could open it
                    raise
            if ingest and state.retired:
                raise _StaleSnapshot()
            written = _ingest_into_db(staging, local_files, entry, shard, run_id) if ingest else marker
            with open(os.path.join(staging, _MARKER), "w", encoding="utf-8") as fh:
                fh.write(written)
            if state.retired:
                raise _StaleSnapshot()
            try:
                os.rename(staging, final)
            except OSError:
                # Another reader sharing cache_dir won the race; use its copy if it is sound.
                if not _cached_copy_ok(final, marker, shard, run_id):
                    raise
            log.info("shard %s of run %s: downloaded %d files from %s", shard.db_id, run_id, len(shard.files), shard.db_url)
            return final
        finally:
            if os.path.isdir(staging):
                shutil.rmtree(staging, ignore_errors=True)

    # -- snapshots -----------------------------------------------------------------------------

    def _read_pointer(self) -> CurrentPointer | None:
        return self._snapshots.current()

    def _pinned_pointer(self, manifest_ref: str) -> CurrentPointer:
        """The pointer ``_CURRENT`` would hold for ``manifest_ref`` (same checks as a real one)."""
        ref = self._snapshots.manifest_ref(manifest_ref)
        pointer = CurrentPointer(manifest_ref=ref.uri, run_id=ref.run_id, updated_at=ref.published_at)
        pointer.check_root(self._root)
        return pointer

    def _load(self, pointer: CurrentPointer) -> _Snapshot:
        """Fetch and validate the manifest ``pointer`` names; refuse anything that leaves its run."""
        return _Snapshot(pointer, self._snapshots.load_manifest(pointer))

    def _retire(self, state: _Snapshot, *, drop_cache: bool) -> None:
        state.retire()
        # Only a private cache is ours to prune; a shared cache_dir may serve other readers. A read
        # still inside a retired handle is unaffected: its files stay open until it closes (POSIX).
        if drop_cache and self._owns_cache:
            with self._cache_lock:
                busy = self._downloads[state.run_id] > 0
                if busy:
                    self._doomed_runs.add(state.run_id)  # deleting now would pull files from under it
            # Outside the lock, so cold reads of the new snapshot need not wait for the deletion:
            # only a snapshot of this run could download here, and refresh() (which holds the swap
            # lock we run under) is the only way one could become current again.
            if not busy:
                self._remove_run_cache(state.run_id)

    def _remove_run_cache(self, run_id: str) -> None:
        shutil.rmtree(os.path.join(self._cache_root, f"run_id={run_id}"), ignore_errors=True)

    def _remove_owned_cache(self) -> None:
        if self._cleanup is not None:
            self._cleanup()


def _db_file_read(name: str) -> bool:
    """Files of a closed database that a read-only open reads (LOG, LOCK, OPTIONS, WAL: not needed)."""
    return name == "CURRENT" or name.startswith("MANIFEST-") or name.endswith(".sst")


def _ingest_into_db(folder: str, ssts: list[str], entry: dict[str, Any], shard: ShardEntry, run_id: str) -> str:
    """Create a database in ``folder`` from the verified ``ssts`` (moved in); return its marker.

    One ingestion per file, in the manifest's order: sort runs of one shard may overlap, and a
    later run must win as it did in the writer. The marker records every file the database reads
    with its size and checksum as they are after ingestion (RocksDB may rename a file and stamp a
    sequence number into it), so a later reuse re-checks exactly what it will open.
    """
    opts = Options(raw_mode=True)
    opts.set_disable_auto_compactions(True)  # the files must stay as the marker records them
    try:
        db = Rdict(folder, opts)
        try:
            how = IngestExternalFileOptions()
            how.set_move_files(True)
            for path in ssts:
                db.ingest_external_file([path], how)
        finally:
            db.close()
    except Exception as exc:
        raise ReaderError(
            f"cannot ingest the SST files of shard {shard.db_id} of run {run_id!r} ({shard.db_url}) into a local "
            f"database in {folder}: {exc}"
        ) from exc
    shutil.rmtree(os.path.join(folder, _INCOMING), ignore_errors=True)
    local = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if _db_file_read(name) and os.path.isfile(path):
            local.append({"name": name, "size": os.path.getsize(path), "checksum": file_checksum(path)})
    return json.dumps(dict(entry, local_files=local), sort_keys=True)


def _cached_copy_ok(path: str, marker: str, shard: ShardEntry, run_id: str) -> bool:
    """A cached copy is reused only if it was verified for this very shard entry and still checks out.

    The marker says a download was verified once, maybe by another process; the files may have
    rotted or been edited since, so sizes and checksums are checked again on every reuse (hashing
    runs at disk speed, far cheaper than the download it saves). An ingested shard ("sst") is
    checked against the files its marker recorded after ingestion.
    """
    try:
        with open(os.path.join(path, _MARKER), encoding="utf-8") as fh:
            text = fh.read()
        if text == marker:
            expected = [(f.name, f.size, f.checksum) for f in shard.files]
        else:
            recorded = json.loads(text)
            local = recorded.pop("local_files", None) if isinstance(recorded, dict) else None
            if not local or json.dumps(recorded, sort_keys=True) != marker:
                return False
            expected = [(str(f["name"]), int(f["size"]), str(f["checksum"])) for f in local]
        for name, size, checksum in expected:
            local_path = os.path.join(path, *name.split("/"))
            verify_file(local_path, size, checksum, source=f"cached {local_path} (shard {shard.db_id} of run {run_id!r})")
    except ChecksumMismatchError as exc:
        log.warning("%s", exc)
        return False
    except (OSError, ValueError, KeyError, TypeError):  # unreadable or malformed marker: download again
        return False
    return True
