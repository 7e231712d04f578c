"""A reader's local shard cache: each shard downloaded once, verified, and opened read-only.

Layout: ``<root>/run_id=<run>/db=<id>/``. A shard is downloaded on first use (every file's size
and checksum checked) into a private staging folder and renamed into place; a shard shipped as
SST files only (``shard_layout`` "sst") is first ingested, in the manifest's file order, into a
fresh database there. A marker file records what was verified, and a cached copy is re-checked
against it on every reuse, except that a refresh builds on the database this very cache built or
verified (the one it serves) without hashing it again, and so does the reopening of a shard whose
handle was closed to stay within the reader's ``max_open_shards`` and ``max_open_files``. The copy is opened with rocksdict
in raw mode, read-only.

A reader that follows ``_CURRENT`` (``live``) serves an SST-layout shard instead from a *live*
shard: a column family of a read-write database in a memory-backed folder, filled by ingesting the
shard's verified files as published (its layers, oldest first, downloaded once into the cache's
``layers/`` folder; the database's SSTs are symbolic links to them), into which ``refresh()``
ingests the layers a delta adds (``ingest_live``) instead of building and opening the shard again
(see ``loaded_snapshot``), and which is compacted in place once it holds more than
``max_local_layers`` sorted runs; one closed to stay within the reader's bounds is dropped, and
built again from its layers (checked again) on its next read. Column families share a database's fixed descriptors (LOCK, LOG,
WAL, MANIFEST, its folder), but creating one rewrites the database's OPTIONS file, which lists them
all (measured: 0.25 ms more per column family already there, so one database of 4000 would take
about 1 s per shard): a live database holds at most ``LIVE_SHARDS_PER_DB`` of them.

Cached files are deleted (a retired run's folder on ``refresh()``, a private cache on ``close()``)
only when no shard download of that run is in flight; otherwise the last such download deletes
them when it ends. A download for a retired snapshot stops at its next file and raises
``StaleSnapshot`` (the read retries on the current snapshot, or fails with "closed").
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from rocksdict import AccessType, IngestExternalFileOptions, Rdict

from airflow_provider_shardyfusion.core import layout, scratch
from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError, ReaderError
from airflow_provider_shardyfusion.core.model.checksum import file_checksum, verify_file
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUT_SST, ShardEntry, ShardFile, ShardLayer
from airflow_provider_shardyfusion.core.model.rocksdb_options import live_shard_options, rocksdb_options
from airflow_provider_shardyfusion.core.read.loaded_snapshot import (
    LIVE_CF_FILES,
    NUM_LEVELS,
    LiveDb,
    LoadedSnapshot,
    PinnedShard,
    StaleSnapshot,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from airflow_provider_shardyfusion.core.storage import ObjectStore

__all__ = ["DEFAULT_MAX_LOCAL_LAYERS", "LIVE_CF_FILES", "LIVE_DB_FILES", "LIVE_SHARDS_PER_DB",
           "MEMORY_BUILD_FROM_DISK_MAX_BYTES", "MEMORY_BUILD_MAX_BYTES", "CacheStats", "ShardCache", "live_fixed_files"]

log = logging.getLogger(__name__)

# Written next to the shard files once every file is verified; a cached shard without a matching
# marker (crash mid-download, another manifest) is downloaded again. RocksDB ignores the file.
_MARKER = ".shardyfusion-shard.json"
# "sst" layout: the downloaded SSTs wait here (inside the staging folder) until they are ingested.
_INCOMING = ".incoming"
# Shards up to this size are downloaded straight into a memory-backed folder and built there; only
# the database is copied out, which costs less than a disk's fsyncs (measured: 16 shards of 70 MB
# opened in 1.9 s this way, 3.6 s on the disk).
MEMORY_BUILD_MAX_BYTES = 256 << 20
# A chain's layers are already in the cache on disk: a memory build copies them in and the database
# out, worth it only for small shards (a 70 MB chain shard opened 2x slower that way).
MEMORY_BUILD_FROM_DISK_MAX_BYTES = 16 << 20
# A look-up visits every sorted run of a database (each ingested layer is one), ~0.5-1.5 us each
# even when its bloom filter says no; past this many runs a built database is compacted locally so
# a deep chain reads about as fast as a compacted snapshot (measured: depth 8 read 2.6x slower).
DEFAULT_MAX_LOCAL_LAYERS = 4
# Descriptors a live (read-write) database holds besides its column families' (LIVE_CF_FILES and
# the SSTs of each): LOCK, LOG, WAL, MANIFEST and its folder twice (measured).
LIVE_DB_FILES = 6
# Live shards (column families) per live database: creating one costs ~0.25 ms per column family
# already there (see the module's docstring), so 16 keep opening a shard at ~2 ms while their
# database's fixed descriptors cost each shard ~0.4.
LIVE_SHARDS_PER_DB = 16
# A new layer of a refresh is copied into the memory-backed folder (small, and no fsync); a shard's
# files at its first opening are linked (RocksDB syncs the file it links: a disk write of a freshly
# downloaded shard, but its data stays out of memory), the cached file never moved away.
_COPY_IN = IngestExternalFileOptions()
_LINK_IN = IngestExternalFileOptions()
_LINK_IN.set_move_files(True)


def live_fixed_files(shards: int) -> int:
    """Descriptors the live databases of a reader serving ``shards`` live shards hold besides theirs."""
    return LIVE_DB_FILES * -(-shards // LIVE_SHARDS_PER_DB)


class _LiveDatabase:
    """One live database (see the module's docstring) and how many live shards it holds now."""

    __slots__ = ("db", "shards")

    def __init__(self, db: Rdict):
        self.db = db
        self.shards = 0


class _LiveBytes:
    """Bytes of the live shards a cache holds (shared with their finalizers, which must not hold the cache)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class CacheStats:
    """What a cache downloaded and built; ``ShardedReader.last_refresh`` reports the part one refresh caused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.layers_downloaded = 0
        self.bytes_downloaded = 0
        self.shards_built = 0
        self.layers_reused = 0
        self.shards_compacted = 0

    def layer_downloaded(self, size: int) -> None:
        with self._lock:
            self.layers_downloaded += 1
            self.bytes_downloaded += size

    def shard_built(self, *, reused_layers: int) -> None:
        with self._lock:
            self.shards_built += 1
            self.layers_reused += reused_layers

    def shard_compacted(self) -> None:
        with self._lock:
            self.shards_compacted += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"layers_downloaded": self.layers_downloaded, "bytes_downloaded": self.bytes_downloaded,
                    "shards_built": self.shards_built, "layers_reused": self.layers_reused,
                    "shards_compacted": self.shards_compacted}


class ShardCache:
    """Shards of one reader's snapshots on local disk.

    ``cache_dir``: reused across readers and kept on ``close()``. None: a private temporary folder,
    removed on ``close()`` (or when the cache is garbage-collected unclosed).
    """

    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str] | None, *,
                 max_local_layers: int | None = DEFAULT_MAX_LOCAL_LAYERS, live: bool = False):
        self._store = store
        self._max_local_layers = max_local_layers
        # Guards the three below: cached files may be deleted only while no download writes there.
        self._lock = threading.Lock()
        self._downloads: collections.Counter[str] = collections.Counter()  # run_id -> shard downloads in flight
        self._doomed_runs: set[str] = set()  # run folders to delete when their last download ends
        self._close_pending = False  # the private cache goes when the last download ends
        self.stats = CacheStats()
        # Shard databases this cache built or verified, by folder: their marker's (inode, mtime) then.
        self._trusted: dict[str, tuple[int, int]] = {}
        self._cleanup: weakref.finalize[Any, Any] | None
        if cache_dir is None:
            self.root = tempfile.mkdtemp(prefix="shardyfusion-reader-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        else:
            self.root = os.path.abspath(os.fspath(cache_dir))
            os.makedirs(self.root, exist_ok=True)
            self._cleanup = None
        # Live databases need a memory-backed folder: on a disk, opening one and each ingestion cost
        # fsyncs (measured: 16 ms and 10 ms a shard, against 1.8 ms and 0.1 ms in memory).
        self._live_root = scratch.memory_workdir(0, 1, prefix="shardyfusion-live-") if live else None
        if self._live_root is not None:
            weakref.finalize(self, shutil.rmtree, self._live_root, True)
        # Guards the live databases' list and their column families' creation and dropping (a
        # dropped shard's finalizer may run in any thread, maybe inside a lock of this cache).
        self._live_lock = threading.RLock()
        self._live_dbs: list[_LiveDatabase] = []
        self._live_seq = 0
        # Merges and compactions rewrite a live shard's data into the memory-backed folder, so its
        # live shards together may hold at most half of what that folder had free (a container's
        # /dev/shm is often 64 MB); past it a shard is served read-only from the cache instead.
        self._live_budget = _free_bytes(self._live_root) // 2 if self._live_root is not None else 0
        self._live_held = _LiveBytes()  # of the live shards held now, as published

    @property
    def live(self) -> bool:
        """Whether this cache serves SST-layout shards as live shards."""
        return self._live_root is not None

    def open_shard(self, snapshot: LoadedSnapshot, db_id: int) -> Rdict | PinnedShard | None:
        """The open shard ``db_id`` of ``snapshot``, downloading it on first use; None if empty."""
        db = snapshot.handles.get(db_id)
        if db is not None:
            return db
        return self._prepare(snapshot, db_id, open_it=True)

    def build_shard(self, snapshot: LoadedSnapshot, db_id: int) -> None:
        """Download or build shard ``db_id`` of ``snapshot`` into the cache without opening it (no descriptor held)."""
        if db_id not in snapshot.handles and db_id not in snapshot.paths:
            self._prepare(snapshot, db_id, open_it=False)

    def _prepare(self, snapshot: LoadedSnapshot, db_id: int, *, open_it: bool) -> Rdict | PinnedShard | None:
        shard = snapshot.shards.get(db_id)
        if shard is None:
            return None
        with snapshot.shard_locks[db_id]:
            db = snapshot.handles.get(db_id)
            if db is not None:
                return db
            self._begin_download(snapshot)
            try:
                if self._live_root is not None and snapshot.manifest.shard_layout == SHARD_LAYOUT_SST \
                        and self._live_room(shard):
                    return self._prepare_live(snapshot, shard, open_it=open_it)
                path = snapshot.paths.get(db_id)
                if path is None or not self._trusted_now(path):
                    path = self._layered_copy(snapshot, shard) if shard.layers else self._local_copy(snapshot, shard)
                    snapshot.paths[db_id] = path
                if not open_it:
                    return None
                return self._open(snapshot, shard, path)
            except StaleSnapshot:
                raise
            except Exception as exc:
                # Whatever went wrong for a snapshot nobody serves any more (e.g. its objects were
                # already garbage-collected) is not the caller's problem: retry on the current one,
                # which reports its own errors.
                if snapshot.retired:
                    raise StaleSnapshot() from exc
                raise
            finally:
                self._end_download(snapshot.run_id)

    def _open(self, snapshot: LoadedSnapshot, shard: ShardEntry, path: str) -> Rdict:
        """Open the verified local copy in ``path`` of ``shard`` read-only and register it."""
        try:
            db = Rdict(path, rocksdb_options(), access_type=AccessType.read_only(False))
        except Exception as exc:
            raise ReaderError(
                f"cannot open shard {shard.db_id} of run {snapshot.run_id!r} ({shard.db_url}) from {path}: {exc}"
            ) from exc
        try:
            snapshot.register(shard.db_id, db, _sst_count(path))
        except StaleSnapshot:
            db.close()  # never shared with another thread, so closing it cannot break a read
            raise
        return db

    def _prepare_live(self, snapshot: LoadedSnapshot, shard: ShardEntry, *, open_it: bool) -> Rdict | None:
        """Download ``shard``'s layers (``open_it``: and serve it from a new live shard, see the module's docstring)."""
        if not shard.layers and not shard.files:
            raise ReaderError(f"shard {shard.db_id} of run {snapshot.run_id!r} ({shard.db_url}) lists no files in the manifest")
        files = [path for layer in shard.all_layers() for path in self._layer_files(snapshot, shard, layer)]
        self._mark_served(snapshot, shard.db_id)
        if not open_it:
            return None
        if snapshot.retired:
            raise StaleSnapshot()
        live = self._new_live(shard.db_id, shard.byte_size)
        try:
            self._ingest(live, files, link=True)
            self._compact_deep(live, shard, snapshot.run_id)
        except Exception as exc:
            raise ReaderError(
                f"cannot open shard {shard.db_id} of run {snapshot.run_id!r} ({shard.db_url}) as a live shard "
                f"({live.name} in {self._live_root}): {exc}"
            ) from exc
        self.stats.shard_built(reused_layers=0)
        self.adopt_live(snapshot, shard.db_id, live)
        return live.db

    def _live_room(self, shard: ShardEntry) -> bool:
        """Whether the memory-backed folder has room for ``shard`` as a live shard (see ``_live_budget``)."""
        assert self._live_root is not None
        with self._live_lock:
            if self._live_held.bytes + shard.byte_size <= self._live_budget \
                    and _free_bytes(self._live_root) >= 2 * shard.byte_size:
                return True
        log.warning("live shards in %s: no room for shard %s (%d bytes; %d of %d bytes held): it is served "
                    "read-only from the cache, and a refresh builds it again", self._live_root, shard.db_id,
                    shard.byte_size, self._live_held.bytes, self._live_budget)
        return False

    def _new_live(self, db_id: int, size: int) -> LiveDb:
        """An empty live shard for shard ``db_id`` of ``size`` bytes, in a live database with room (a new one if none has)."""
        assert self._live_root is not None
        with self._live_lock:
            self._live_held.bytes += size
            home = next((d for d in self._live_dbs if d.shards < LIVE_SHARDS_PER_DB), None)
            if home is None:
                folder = tempfile.mkdtemp(prefix="db-", dir=self._live_root)
                home = _LiveDatabase(Rdict(folder, live_shard_options()))
                # A RocksDB snapshot at sequence number 0 (a database only ingested into at the
                # bottom level stays there) makes a compaction drop what it should keep for it
                # (measured: a pinned shard's compaction kept 2 of 189 keys): a first write moves
                # the sequence on, so ``pin_live`` never takes one there.
                home.db.put(b"sequence", b"")
                self._live_dbs.append(home)
            self._live_seq += 1
            # Never a dropped shard's name: a read may still use that column family.
            name = f"db={db_id:05d}.{self._live_seq}"
            home.db.create_column_family(name, live_shard_options())
            home.shards += 1
            return LiveDb(home.db.get_column_family(name), name, functools.partial(
                _drop_live, self._live_lock, self._live_dbs, self._live_held, home, name, size))

    def _ingest(self, live: LiveDb, files: list[str], *, link: bool) -> None:
        """Ingest the verified ``files`` into ``live``, oldest first; a failure marks ``live`` broken."""
        assert self._live_root is not None
        try:
            for path in files:  # one at a time: files of one layer may overlap, and the later one wins
                if not link:
                    live.db.ingest_external_file([path], _COPY_IN)
                    continue
                # RocksDB moves what it ingests; a symbolic link moved into the database (a hard link
                # of the link) reads the cached file, which stays where it is.
                incoming = os.path.join(self._live_root, f".in-{uuid.uuid4().hex}.sst")
                os.symlink(os.path.abspath(path), incoming)
                try:
                    live.db.ingest_external_file([incoming], _LINK_IN)
                finally:
                    if os.path.lexists(incoming):
                        os.unlink(incoming)
        except Exception:
            live.broken = True
            raise

    def _compact_deep(self, live: LiveDb, shard: ShardEntry, run_id: str) -> None:
        """Compact ``live`` in place once it holds more than ``max_local_layers`` sorted runs.

        A pinned snapshot of it (``LoadedSnapshot.pin_live``) keeps reading what it read: compaction
        keeps every version a RocksDB snapshot still sees.
        """
        if self._max_local_layers is None or (runs := _sorted_runs(live.db)) <= self._max_local_layers:
            return
        try:
            live.db.compact_range(None, None)
        except Exception:
            live.broken = True
            raise
        log.info("shard %s of run %s: %d sorted runs of its live shard compacted into one", shard.db_id, run_id, runs)
        self.stats.shard_compacted()

    def layer_files(self, snapshot: LoadedSnapshot, shard: ShardEntry, layers: tuple[ShardLayer, ...]) -> list[str]:
        """The verified local files of ``layers`` of ``shard``, oldest first (downloaded once per cache)."""
        self._begin_download(snapshot)
        try:
            return [path for layer in layers for path in self._layer_files(snapshot, shard, layer)]
        finally:
            self._end_download(snapshot.run_id)

    def ingest_live(self, live: LiveDb, files: list[str], shard: ShardEntry, run_id: str, *, reused_layers: int) -> None:
        """Ingest the verified layer ``files`` (see ``layer_files``) into ``live``, oldest first, and
        compact it in place past ``max_local_layers`` sorted runs.

        RocksDB copies each file in (the memory-backed folder is another file system): the cached
        layer stays as verified. A failure marks ``live`` broken: it may hold part of the layers,
        which no snapshot serves.
        """
        try:
            self._ingest(live, files, link=False)
            self._compact_deep(live, shard, run_id)
        except Exception as exc:
            raise ReaderError(
                f"cannot ingest the new layers of shard {shard.db_id} of run {run_id!r} ({shard.db_url}) into its "
                f"live shard ({live.name} in {self._live_root}): {exc}"
            ) from exc
        self.stats.shard_built(reused_layers=reused_layers)

    def adopt_live(self, snapshot: LoadedSnapshot, db_id: int, live: LiveDb) -> None:
        """Serve shard ``db_id`` of ``snapshot`` from ``live`` (which already holds exactly its layers)."""
        snapshot.register(db_id, live.db, live.files(), live)
        self._mark_served(snapshot, db_id)

    def _mark_served(self, snapshot: LoadedSnapshot, db_id: int) -> None:
        """Record that ``snapshot`` serves live shard ``db_id`` (its newest layer's folder): a refresh
        builds it again though it was closed meanwhile (see ``ShardedReader._carry_over``)."""
        snapshot.paths[db_id] = layout.local_layer_dir(self.root, snapshot.shards[db_id].all_layers()[-1].run_id, db_id)

    def keep_run(self, run_id: str) -> None:
        """Cancel a pending deletion of ``run_id``'s folder (a refresh back to that run)."""
        with self._lock:
            self._doomed_runs.discard(run_id)

    def drop_run(self, run_id: str) -> None:
        """Delete a retired run's folder, now or when its last download ends; call only after retiring it.

        Only a private cache is ours to prune; a shared cache_dir may serve other readers. A read
        still inside a retired handle is unaffected: its files stay open until it closes (POSIX).
        """
        if self._cleanup is None:
            return
        with self._lock:
            busy = self._downloads[run_id] > 0
            if busy:
                self._doomed_runs.add(run_id)  # deleting now would pull files from under it
        # Outside the lock, so cold reads of the new snapshot need not wait for the deletion: only a
        # snapshot of this run could download here, and the reader's refresh() (which holds its swap
        # lock around this call) is the only way one could become current again.
        if not busy:
            self._remove_run(run_id)

    def prune_layers(self, keep_runs: set[str]) -> None:
        """Delete a private cache's layer files of runs outside ``keep_runs`` (the served chain), when no download runs."""
        if self._cleanup is None:
            return
        with self._lock:
            if self._downloads:
                return  # a later refresh prunes them
            base = os.path.join(self.root, "layers")
            for name in os.listdir(base) if os.path.isdir(base) else ():
                if name.startswith("run_id=") and name[len("run_id="):] not in keep_runs:
                    shutil.rmtree(os.path.join(base, name), ignore_errors=True)

    def close(self) -> None:
        """Delete a private cache, now or when the last download ends; call only once every snapshot is retired."""
        with self._lock:
            self._close_pending = bool(self._downloads)
        # Every snapshot is retired now, so no download can start to race this deletion.
        if not self._close_pending:
            self._remove_all()

    def _begin_download(self, snapshot: LoadedSnapshot) -> None:
        with self._lock:
            # Checked under the lock drop_run takes after ``retired`` is set: either this download
            # is counted before a retirement decides what to delete, or it sees the retirement.
            if snapshot.retired:
                raise StaleSnapshot()
            self._downloads[snapshot.run_id] += 1

    def _end_download(self, run_id: str) -> None:
        # Deletes while holding the lock (a rare path): were it released first, a refresh() back
        # to this run could start a download into the folder during the deletion.
        with self._lock:
            self._downloads[run_id] -= 1
            if self._downloads[run_id] > 0:
                return
            del self._downloads[run_id]
            if self._close_pending:
                if not self._downloads:
                    self._remove_all()
            elif run_id in self._doomed_runs:
                self._doomed_runs.discard(run_id)
                self._remove_run(run_id)

    def _download_verified(self, snapshot: LoadedSnapshot, shard: ShardEntry, into: str, db_url: str,
                           files: tuple[ShardFile, ...]) -> list[str]:
        """Download ``files`` of ``db_url`` (a shard or one of its layers) into ``into``, each checked against the manifest."""
        base_key = self._store.key_of(db_url)
        local_files: list[str] = []
        for f in files:
            if snapshot.retired:  # nobody will open it: stop fetching a shard of a retired snapshot
                raise StaleSnapshot()
            local = os.path.join(into, *f.name.split("/"))
            local_files.append(local)
            source = f"{db_url}/{f.name} (shard {shard.db_id} of run {snapshot.run_id!r})"
            self._store.download_file(f"{base_key}/{f.name}", local)
            try:
                verify_file(local, f.size, f.checksum, source=source)
            except ChecksumMismatchError:
                os.unlink(local)  # never leave a bad file where anything could open it
                raise
        return local_files

    def _local_copy(self, snapshot: LoadedSnapshot, shard: ShardEntry) -> str:
        """A verified local copy of ``shard``: reused if already cached, else downloaded."""
        run_id = snapshot.run_id
        final = layout.local_cache_dir(self.root, run_id, shard.db_id)
        ingest = snapshot.manifest.shard_layout == SHARD_LAYOUT_SST
        entry: dict[str, Any] = {"db_url": shard.db_url, "files": [f.to_dict() for f in shard.files]}
        if ingest:
            entry["shard_layout"] = SHARD_LAYOUT_SST
        marker = json.dumps(entry, sort_keys=True)
        if _reusable(final, marker, shard.files, f"shard {shard.db_id} of run {run_id!r}"):
            return self._trust(final)
        if not shard.files:
            raise ReaderError(f"shard {shard.db_id} of run {run_id!r} ({shard.db_url}) lists no files in the manifest")
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        # Download into a private folder and rename it into place: a half-downloaded or unverified
        # shard is never visible under its final name (to this or another process sharing cache_dir).
        staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
        # A small shard to ingest is downloaded and built in memory, then its database copied out.
        memory = scratch.memory_workdir(shard.byte_size, MEMORY_BUILD_MAX_BYTES, prefix="shardyfusion-cache-") \
            if ingest else None
        try:
            local_files = self._download_verified(
                snapshot, shard, os.path.join(memory or staging, _INCOMING) if ingest else staging, shard.db_url,
                shard.files)
            if ingest and snapshot.retired:
                raise StaleSnapshot()
            written = _ingest_into_db(staging, local_files, entry, shard, run_id,
                                      build_dir=os.path.join(memory, "db") if memory else None,
                                      max_runs=self._max_local_layers, on_compact=self.stats.shard_compacted,
                                      ) if ingest else marker
            if snapshot.retired:
                raise StaleSnapshot()
            _install(staging, final, written, marker, shard.files, f"shard {shard.db_id} of run {run_id!r}")
            self._trust(final)
            self.stats.layer_downloaded(shard.byte_size)
            self.stats.shard_built(reused_layers=0)
            log.info("shard %s of run %s: downloaded %d files from %s", shard.db_id, run_id, len(shard.files), shard.db_url)
            return final
        finally:
            _discard(staging, memory)

    # -- shards of a chain (SPEC §13) --------------------------------------------------------------

    def _layer_files(self, snapshot: LoadedSnapshot, shard: ShardEntry, layer: ShardLayer) -> list[str]:
        """The verified local files of one layer, downloaded once per cache and shared by every run that reads it."""
        folder = layout.local_layer_dir(self.root, layer.run_id, shard.db_id)
        marker = json.dumps({"db_url": layer.db_url, "files": [f.to_dict() for f in layer.files]}, sort_keys=True)
        paths = [os.path.join(folder, *f.name.split("/")) for f in layer.files]
        if _reusable(folder, marker, layer.files, f"layer {layer.run_id!r} of shard {shard.db_id}"):
            return paths
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(folder)}-", dir=os.path.dirname(folder))
        try:
            self._download_verified(snapshot, shard, staging, layer.db_url, layer.files)
            _install(staging, folder, marker, marker, layer.files, f"layer {layer.run_id!r} of shard {shard.db_id}")
            self.stats.layer_downloaded(layer.byte_size)
            return paths
        finally:
            _discard(staging)

    def _layered_copy(self, snapshot: LoadedSnapshot, shard: ShardEntry) -> str:
        """A database of the shard's layers ingested oldest first, newer winning and tombstones deleting.

        Built from a cached database of an earlier run of the chain when one holds a prefix of the
        layers (its files are linked: SSTs never change once written, and auto-compaction is off),
        so a refresh ingests only the layers it lacks; else from every layer. A clone is built in
        memory when there is room, its SSTs symbolic links to the source's: opening, ingesting into
        and closing a database on a disk costs fsyncs that made a refresh of a delta touching
        every shard slower than opening the new snapshot fresh (measured on 200 small shards:
        ~13 ms of ~20 ms a shard; in memory ~4 ms); only the new files are copied out.
        """
        run_id = snapshot.run_id
        final = layout.local_cache_dir(self.root, run_id, shard.db_id)
        layers = [_layer_sig(layer) for layer in shard.layers]
        entry = {"layers": layers, "shard_layout": SHARD_LAYOUT_SST}
        marker = json.dumps(entry, sort_keys=True)
        where = f"shard {shard.db_id} of run {run_id!r}"
        if _reusable(final, marker, (), where):
            return self._trust(final)
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
        memory = None
        try:
            source, done = self._clone_source(shard.db_id, layers, exclude=run_id)
            linked: dict[str, tuple[int, int, str]] = {}
            # A new database is built in memory only when small (see MEMORY_BUILD_FROM_DISK_MAX_BYTES);
            # a clone copies in nothing but the layers it lacks, and out only what it writes.
            memory = scratch.memory_workdir(
                shard.byte_size, MEMORY_BUILD_MAX_BYTES if source is not None else MEMORY_BUILD_FROM_DISK_MAX_BYTES,
                prefix="shardyfusion-cache-")
            if source is not None:
                linked = _clone_db(source, os.path.join(memory, "db") if memory else staging)
            todo = [_private_link(path, os.path.join(_incoming_dir(memory or staging, layer.run_id), os.path.basename(path)))
                    for layer in shard.layers[done:] for path in self._layer_files(snapshot, shard, layer)]
            if snapshot.retired:
                raise StaleSnapshot()
            written = _ingest_into_db(staging, todo, entry, shard, run_id,
                                      build_dir=os.path.join(memory, "db") if memory else None,
                                      max_runs=self._max_local_layers, linked=linked,
                                      on_compact=self.stats.shard_compacted)
            _install(staging, final, written, marker, (), where)
            self._trust(final)
            if done < len(shard.layers):
                self.stats.shard_built(reused_layers=done)
            log.info("shard %s of run %s: %d layer(s) ingested%s", shard.db_id, run_id, len(shard.layers) - done,
                     f" on a copy of run {os.path.basename(os.path.dirname(source))[7:]}'s" if source else "")
            return final
        finally:
            _discard(staging, memory)

    def _clone_source(self, db_id: int, layers: list[Any], *, exclude: str) -> tuple[str | None, int]:
        """The cached database of this shard holding the longest prefix of ``layers`` (maybe all), and its length."""
        best: tuple[str | None, int] = (None, 0)
        try:
            runs = os.listdir(self.root)
        except OSError:
            return best
        for name in runs:
            if not name.startswith("run_id=") or name == f"run_id={exclude}":
                continue
            folder = os.path.join(self.root, name, f"db={db_id:05d}")
            try:
                with open(os.path.join(folder, _MARKER), encoding="utf-8") as fh:
                    recorded = json.loads(fh.read())
                have = recorded.get("layers") or [_full_sig(recorded)]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if best[1] < len(have) <= len(layers) and have == layers[:len(have)] \
                    and (self._trusted_now(folder) or _cached_copy_ok(folder, "", (), f"cached {folder}")):
                best = (folder, len(have))
        return best

    def _trust(self, folder: str) -> str:
        """Remember that this cache verified (or built) ``folder`` as its marker is now; returns it."""
        try:
            st = os.stat(os.path.join(folder, _MARKER))
        except OSError:
            return folder
        self._trusted[folder] = (st.st_ino, st.st_mtime_ns)
        return folder

    def _trusted_now(self, folder: str) -> bool:
        """Whether ``folder`` is still what this cache verified: a refresh clones the database it serves
        without hashing the whole shard again (another process replacing it changes its marker)."""
        seen = self._trusted.get(folder)
        try:
            st = os.stat(os.path.join(folder, _MARKER))
        except OSError:
            return False
        return seen == (st.st_ino, st.st_mtime_ns)

    def _remove_run(self, run_id: str) -> None:
        folder = os.path.join(self.root, f"run_id={run_id}")
        for trusted in [f for f in self._trusted if f.startswith(folder + os.sep)]:
            self._trusted.pop(trusted, None)
        shutil.rmtree(folder, ignore_errors=True)

    def _remove_all(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        if self._live_root is not None:
            with self._live_lock:
                # Each live database closes once its last live shard is dropped (see ``_drop_live``).
                self._live_dbs.clear()
            shutil.rmtree(self._live_root, ignore_errors=True)


def _db_file_read(name: str) -> bool:
    """Files of a closed database that a read-only open reads (LOG, LOCK, OPTIONS, WAL: not needed)."""
    return name == "CURRENT" or name.startswith("MANIFEST-") or name.endswith(".sst")


def _ingest_into_db(folder: str, ssts: list[str], entry: dict[str, Any], shard: ShardEntry, run_id: str, *,
                    build_dir: str | None = None, max_runs: int | None = None,
                    linked: Mapping[str, tuple[int, int, str]] | None = None,
                    on_compact: Callable[[], None] | None = None) -> str:
    """Create a database in ``folder`` (or add to the one there) from the verified ``ssts``; return its marker.

    One ingestion per file, in the manifest's order: sort runs of one shard may overlap, and a
    later run must win as it did in the writer. With ``build_dir`` (a memory-backed folder) the
    database is built there and the files it reads copied into ``folder``: creating it on a disk
    costs more fsyncs than the download of a small shard. The marker records every file the
    database reads with its size and checksum as they are after ingestion (RocksDB may rename a
    file and stamp a sequence number into it), so a later reuse re-checks exactly what it will open.
    A database left with more than ``max_runs`` sorted runs is compacted into one (tombstones and
    overwritten values dropped), which the marker then records. ``linked``: files of a clone with
    their inode, size and checksum as verified in its source (see ``_clone_db``).
    """
    opts = rocksdb_options(auto_compactions=False)  # the files must stay as the marker records them
    target = build_dir or folder
    try:
        if ssts or not os.path.exists(os.path.join(target, "CURRENT")):  # a clone that lacks nothing stays as is
            db = Rdict(target, opts)
            try:
                how = IngestExternalFileOptions()
                how.set_move_files(True)
                for path in ssts:
                    db.ingest_external_file([path], how)
                if max_runs is not None and (runs := _sorted_runs(db)) > max_runs:
                    log.info("shard %s of run %s: %d sorted runs compacted into one locally", shard.db_id, run_id, runs)
                    db.compact_range(None, None)
                    if on_compact is not None:
                        on_compact()
            finally:
                db.close()
    except Exception as exc:
        raise ReaderError(
            f"cannot ingest the SST files of shard {shard.db_id} of run {run_id!r} ({shard.db_url}) into a local "
            f"database in {folder}: {exc}"
        ) from exc
    shutil.rmtree(os.path.join(folder, _INCOMING), ignore_errors=True)
    local = []
    for name in sorted(os.listdir(target)):
        path = os.path.join(target, name)
        if _db_file_read(name) and os.path.isfile(path):
            st = os.stat(path)
            known = (linked or {}).get(name)
            same = known is not None and (known[0], known[1]) == (st.st_ino, st.st_size)
            checksum = known[2] if known is not None and same else file_checksum(path)
            local.append({"name": name, "size": st.st_size, "checksum": checksum})
            if build_dir is not None:
                _link_or_copy(path, os.path.join(folder, name))
    return json.dumps(dict(entry, local_files=local), sort_keys=True)


def _sst_count(folder: str) -> int:
    """Descriptors a read-only open of the database in ``folder`` holds: one per SST file (RocksDB's
    table cache keeps every table open), nothing else once it is open."""
    return max(1, sum(name.endswith(".sst") for name in os.listdir(folder)))


def _drop_live(lock: threading.RLock, databases: list[_LiveDatabase], held: _LiveBytes, home: _LiveDatabase,
               name: str, size: int) -> None:
    """Drop a live shard no snapshot holds any more: its SSTs close once no read uses them (RocksDB
    keeps a dropped column family readable through the handles still out); an emptied live database
    closes once nothing refers to it."""
    with lock:
        held.bytes -= size
        home.shards -= 1
        try:
            home.db.drop_column_family(name)
        except Exception as exc:  # a closed reader's folder is gone already: nothing more to release
            log.debug("live shard %s: not dropped: %s", name, exc)
        if home.shards == 0 and home in databases:
            databases.remove(home)


def _free_bytes(folder: str) -> int:
    return scratch.free_bytes(folder)  # a seam for the tests: they cannot mount a small tmpfs


def _sorted_runs(db: Rdict) -> int:
    """How many files a point look-up may visit: each level-0 file, plus one per other non-empty level."""
    runs = 0
    for level in range(NUM_LEVELS):
        files = db.property_int_value(f"rocksdb.num-files-at-level{level}") or 0
        runs += files if level == 0 else min(files, 1)
    return runs


def _discard(*folders: str | None) -> None:
    """Remove what a build left behind (a staging folder not renamed into place, a memory-backed folder)."""
    for folder in folders:
        if folder is not None and os.path.isdir(folder):
            shutil.rmtree(folder, ignore_errors=True)


def _install(staging: str, final: str, written: str, marker: str, files: tuple[ShardFile, ...], where: str) -> None:
    """Mark the verified ``staging`` folder with ``written`` and rename it to ``final``.

    If another reader sharing the cache got there first, its copy is used when it checks out
    against ``marker`` and ``files``; otherwise the rename's error stands.
    """
    with open(os.path.join(staging, _MARKER), "w", encoding="utf-8") as fh:
        fh.write(written)
    try:
        os.rename(staging, final)
    except OSError:
        if not _cached_copy_ok(final, marker, files, where):
            raise


def _reusable(path: str, marker: str, files: tuple[ShardFile, ...], where: str) -> bool:
    """Whether a cached copy at ``path`` can be reused; one that cannot is removed (downloaded again)."""
    if not os.path.isdir(path):
        return False
    if _cached_copy_ok(path, marker, files, where):
        return True
    log.info("%s: cached copy at %s is stale, incomplete or corrupt; downloading again", where, path)
    shutil.rmtree(path, ignore_errors=True)
    return False


def _layer_sig(layer: ShardLayer) -> dict[str, Any]:
    return {"run_id": layer.run_id, "db_url": layer.db_url, "files": [f.to_dict() for f in layer.files]}


def _full_sig(recorded: dict[str, Any]) -> dict[str, Any]:
    """A full shard's marker read as the one layer it is (a chain's first layer may be one)."""
    return {"run_id": layout.run_id_of_shard_url(recorded["db_url"]), "db_url": recorded["db_url"],
            "files": recorded["files"]}


def _incoming_dir(base: str, run_id: str) -> str:
    path = os.path.join(base, _INCOMING, run_id)
    os.makedirs(path, exist_ok=True)
    return path


def _private_link(path: str, target: str) -> str:
    """``target`` naming the cached layer file ``path``, for an ingestion that moves it away.

    A hard link where possible: ingestion with ``move_files`` takes the link and never writes into
    the file (this RocksDB keeps an ingested file's global sequence number in its MANIFEST), and a
    cached layer is re-checked against its checksum on every reuse all the same. Else a copy.
    """
    try:
        os.link(path, target)
    except OSError:  # another file system (a memory-backed build folder)
        shutil.copyfile(path, target)
    return target


def _link_or_copy(path: str, target: str) -> None:
    """Put a built database's file ``path`` at ``target``: a symbolic link into the cache (a clone's
    SST, see ``_clone_db``) becomes a hard link to the file it names; anything else is copied."""
    if os.path.islink(path):
        try:
            os.link(os.path.realpath(path), target)
            return
        except OSError:  # another file system: copy
            pass
    shutil.copyfile(path, target)


def _clone_db(source: str, into: str) -> dict[str, tuple[int, int, str]]:
    """A copy of a closed database that shares its SSTs and copies its small metadata files.

    The SSTs are hard links, or, when ``into`` is on another file system (a memory-backed build
    folder), symbolic links: RocksDB only reads them, and ``_link_or_copy`` hard-links their
    targets when the database is copied out.

    Returns, per linked SST, its inode with the size and checksum the source's marker records (the
    source was verified against them just before): the clone's marker reuses them for the files
    that are still those very inodes after ingestion, instead of hashing the shard again.
    """
    with open(os.path.join(source, _MARKER), encoding="utf-8") as fh:
        marker = json.load(fh)
    # An ingested shard records its local files; a downloaded database ("db" layout) is its manifest
    # entry, whose files were verified one for one.
    listed = marker.get("local_files") if "local_files" in marker else marker.get("files", ())
    recorded = {str(f["name"]): (int(f["size"]), str(f["checksum"])) for f in listed}
    linked: dict[str, tuple[int, int, str]] = {}
    os.makedirs(into, exist_ok=True)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if not os.path.isfile(path) or name == "LOCK" or name.startswith("LOG") or name == _MARKER:
            continue
        target = os.path.join(into, name)
        if name.endswith(".sst"):
            try:
                os.link(path, target)
            except OSError:  # another file system: a symbolic link, else a copy
                try:
                    os.symlink(os.path.abspath(path), target)
                except OSError:
                    pass
                else:
                    if name in recorded:
                        linked[name] = (os.stat(target).st_ino, *recorded[name])
                    continue
            else:
                if name in recorded:
                    linked[name] = (os.stat(target).st_ino, *recorded[name])
                continue
        shutil.copyfile(path, target)
    return linked


def _cached_copy_ok(path: str, marker: str, files: tuple[ShardFile, ...], where: str) -> bool:
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
            expected = [(f.name, f.size, f.checksum) for f in files]
        else:
            recorded = json.loads(text)
            local = recorded.pop("local_files", None) if isinstance(recorded, dict) else None
            # marker "": any database this cache built and verified (a clone source).
            if not local or (marker and json.dumps(recorded, sort_keys=True) != marker):
                return False
            expected = [(str(f["name"]), int(f["size"]), str(f["checksum"])) for f in local]
        for name, size, checksum in expected:
            local_path = os.path.join(path, *name.split("/"))
            verify_file(local_path, size, checksum, source=f"cached {local_path} ({where})")
    except ChecksumMismatchError as exc:
        log.warning("%s", exc)
        return False
    except (OSError, ValueError, KeyError, TypeError):  # unreadable or malformed marker: download again
        return False
    return True
