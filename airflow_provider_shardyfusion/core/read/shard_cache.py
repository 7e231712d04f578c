"""A reader's local shard cache: each shard fetched once, verified, and opened for reading.

A shard is served from a verified local copy (``local_copy``) opened with rocksdict in raw mode,
read-only, or, for a reader that ingests refreshes, from a live shard (``live_shards``) where the
memory-backed folder has room for it. This module decides which, keeps the snapshot's handles
within its bounds, carries the served shards over to a new snapshot on ``refresh()``, and deletes
what the reader no longer needs.

Cached files are deleted (a retired run's folder on ``refresh()``, a private cache on ``close()``)
only when no shard download of that run is in flight; otherwise the last such download deletes
them when it ends. A download for a retired snapshot stops at its next file and raises
``StaleSnapshot`` (the read retries on the current snapshot, or fails with "closed").
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rocksdict import AccessType, Rdict

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ReaderError
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUT_SST
from airflow_provider_shardyfusion.core.model.rocksdb_options import rocksdb_options
from airflow_provider_shardyfusion.core.read.cache_stats import CacheStats
from airflow_provider_shardyfusion.core.read.live_shards import LiveJob, LiveShards, live_fixed_files, out_of_room
from airflow_provider_shardyfusion.core.read.loaded_snapshot import StaleSnapshot
from airflow_provider_shardyfusion.core.read.local_copy import LocalCopies

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry
    from airflow_provider_shardyfusion.core.read.live_shards import LiveDb, PinnedShard
    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot
    from airflow_provider_shardyfusion.core.storage import ObjectStore

__all__ = ["DEFAULT_MAX_LOCAL_LAYERS", "ShardCache"]

log = logging.getLogger(__name__)

# A look-up visits every sorted run of a database (each ingested layer is one), even when its
# bloom filter says no; past this many runs a built database is compacted locally so a deep chain
# reads about as fast as a compacted snapshot (an uncompacted one reads slower: docs/benchmarks.md).
DEFAULT_MAX_LOCAL_LAYERS = 4
# Layer downloads one refresh runs at once.
_LAYER_DOWNLOADS = 8


class ShardCache:
    """Shards of one reader's snapshots on local disk, and its live shards if it ingests refreshes.

    ``cache_dir``: reused across readers and kept on ``close()``. None: a private temporary folder,
    removed on ``close()`` (or when the cache is garbage-collected unclosed).
    """

    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str] | None, *,
                 max_local_layers: int | None = DEFAULT_MAX_LOCAL_LAYERS, ingest_refreshes: bool = False):
        # Guards the three below: cached files may be deleted only while no download writes there.
        self._lock = threading.Lock()
        self._downloads: collections.Counter[str] = collections.Counter()  # run_id -> shard downloads in flight
        self._doomed_runs: set[str] = set()  # run folders to delete when their last download ends
        self._close_pending = False  # the private cache goes when the last download ends
        self.stats = CacheStats()
        self._cleanup: weakref.finalize[Any, Any] | None
        if cache_dir is None:
            self.root = tempfile.mkdtemp(prefix="shardyfusion-reader-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        else:
            self.root = os.path.abspath(os.fspath(cache_dir))
            os.makedirs(self.root, exist_ok=True)
            self._cleanup = None
        self._copies = LocalCopies(store, self.root, self.stats, max_local_layers)
        self._live = LiveShards.create(self.stats, max_local_layers) if ingest_refreshes else None

    @property
    def ingests_refreshes(self) -> bool:
        """Whether this cache serves SST-layout shards as live shards (asked for, and a memory-backed folder exists)."""
        return self._live is not None

    def files_for_shards(self, manifest: Manifest, max_files: int, max_shards: int) -> int:
        """Of ``max_files`` descriptors, what the shards of ``manifest`` may hold: a live reader's
        databases hold their own, counted once for the old and the new snapshot."""
        if self._live is None or manifest.shard_layout != SHARD_LAYOUT_SST:
            return max_files
        return max(1, max_files - live_fixed_files(min(len(manifest.shards), max_shards)))

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

    def carry_over(self, old: LoadedSnapshot, new: LoadedSnapshot, *, max_open_shards: int, max_open_files: int) -> int:
        """Build in ``new`` every shard ``old`` serves that is part of ``new``'s chain; return how many changed.

        A live shard takes the layers it lacks, shared with ``new``: every such layer is downloaded
        and verified first, then ``old`` is pinned and they are ingested (see ``live_shards``), so
        nothing ``old`` serves changes if a download fails. Otherwise, while the served copy still
        exists, a changed shard is built on it by ingesting only the layers it lacks, and an
        unchanged one is a hard-linked copy of it; shards nobody read stay cold as before. Only as
        many are opened as fit within ``max_open_shards`` next to the handles ``old`` keeps open
        until the swap (over the files bound by one shard's files at most); the others open on
        their first read.
        """
        rebuilt = 0
        jobs: list[LiveJob] = []
        for db_id in list(old.paths.keys() | old.live.keys()):  # every shard it served, open now or not
            entry, before = new.shards.get(db_id), old.shards.get(db_id)
            if entry is None or before is None or not entry.layers:
                continue
            prefix = before.all_layers()
            if entry.layers[:len(prefix)] != prefix:
                continue  # not built on what is served (a rollback, another chain): stays cold
            added = entry.layers[len(prefix):]
            live = old.live.get(db_id)
            if live is not None and not live.broken:
                jobs.append(LiveJob(live, entry, len(prefix), added))
            elif len(old.handles) + len(new.handles) < max_open_shards \
                    and old.open_files + new.open_files < max_open_files:
                self.open_shard(new, db_id)
            else:
                self.build_shard(new, db_id)
            rebuilt += bool(added)
        if jobs:
            self._ingest_refresh(old, new, jobs)
        return rebuilt

    def _ingest_refresh(self, old: LoadedSnapshot, new: LoadedSnapshot, jobs: list[LiveJob]) -> None:
        """Download and verify every job's layers, then have the live shards ingest them; ``new`` serves them."""
        assert self._live is not None  # only a live cache has live shards to carry over
        self._begin_download(new)
        try:
            # Downloads wait on storage (an S3 round trip each): several at once.
            with ThreadPoolExecutor(_LAYER_DOWNLOADS) as pool:
                ready = list(pool.map(
                    lambda job: replace(job, files=tuple(self._copies.layer_files(new, job.entry, job.added))), jobs))
        finally:
            self._end_download(new.run_id)
        left_out = self._live.ingest_refresh(old, new.run_id, ready)
        for job in ready:
            db_id = job.entry.db_id
            if db_id in left_out:
                new.read_only[db_id] = left_out[db_id]
                self.build_shard(new, db_id)  # before the swap, so the refresh fails if it cannot be served
            else:
                self._adopt(new, db_id, job.live)

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
                if self._live is not None and snapshot.manifest.shard_layout == SHARD_LAYOUT_SST \
                        and db_id not in snapshot.read_only:
                    done, db = self._try_live(snapshot, shard, self._live, open_it=open_it)
                    if done:
                        return db
                path = snapshot.paths.get(db_id)
                if path is None or not self._copies.trusted_now(path):
                    path = self._copies.shard(snapshot, shard)
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

    def _try_live(self, snapshot: LoadedSnapshot, shard: ShardEntry, live_shards: LiveShards, *,
                  open_it: bool) -> tuple[bool, Rdict | None]:
        """``_prepare_live`` where the memory-backed folder has room: ``(True, its answer)``; else
        ``(False, None)``, the shard recorded as served read-only from the cache (on disk): the
        folder may have filled since the reader opened, and ``health()`` says so."""
        reason = live_shards.no_room(shard)
        if reason is None:
            try:
                return True, self._prepare_live(snapshot, shard, live_shards, open_it=open_it)
            except ReaderError as exc:
                if not out_of_room(exc):
                    raise
                reason = live_shards.served_read_only(shard.db_id, str(exc))
                snapshot.paths.pop(shard.db_id, None)  # the live shard's folder: not a copy to open
        snapshot.read_only[shard.db_id] = reason
        return False, None

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

    def _prepare_live(self, snapshot: LoadedSnapshot, shard: ShardEntry, live_shards: LiveShards, *,
                      open_it: bool) -> Rdict | None:
        """Download ``shard``'s layers (``open_it``: and serve it from a new live shard)."""
        if not shard.layers and not shard.files:
            raise ReaderError(f"shard {shard.db_id} of run {snapshot.run_id!r} ({shard.db_url}) lists no files in the manifest")
        files = self._copies.layer_files(snapshot, shard, shard.all_layers())
        self._mark_served(snapshot, shard.db_id)
        if not open_it:
            return None
        if snapshot.retired:
            raise StaleSnapshot()
        live = live_shards.open(shard, files, snapshot.run_id)
        self._adopt(snapshot, shard.db_id, live)
        return live.db

    def _adopt(self, snapshot: LoadedSnapshot, db_id: int, live: LiveDb) -> None:
        """Serve shard ``db_id`` of ``snapshot`` from ``live`` (which already holds exactly its layers)."""
        snapshot.register(db_id, live.db, live.files(), live)
        self._mark_served(snapshot, db_id)

    def _mark_served(self, snapshot: LoadedSnapshot, db_id: int) -> None:
        """Record that ``snapshot`` serves live shard ``db_id`` (its newest layer's folder): a refresh
        builds it again though it was closed meanwhile (see ``carry_over``)."""
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
            self._copies.remove_run(run_id)

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
                self._copies.remove_run(run_id)

    def _remove_all(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        if self._live is not None:
            self._live.close()


def _sst_count(folder: str) -> int:
    """Descriptors a read-only open of the database in ``folder`` holds: one per SST file (RocksDB's
    table cache keeps every table open), nothing else once it is open."""
    return max(1, sum(name.endswith(".sst") for name in os.listdir(folder)))
