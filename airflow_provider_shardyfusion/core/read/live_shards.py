"""The live shards of a reader that ingests refreshes: its private read-write databases, and their pin.

A reader built with ``ingest_refreshes=True`` serves an SST-layout shard from a *live* shard: a
column family of a read-write database in a memory-backed folder, filled by ingesting the shard's
verified files as published (its layers, oldest first, downloaded once into the cache's ``layers/``
folder; the database's SSTs are symbolic links to them). ``refresh()`` ingests the layers a delta
adds into it (``ingest_refresh``) instead of building and opening the shard again, and compacts it
in place once it holds more than ``max_local_layers`` sorted runs; one closed to stay within the
reader's bounds is dropped, and built again from its layers (checked again) on its next read.

Column families share a database's fixed descriptors (LOCK, LOG, WAL, MANIFEST, its folder), but
creating one rewrites the database's OPTIONS file, which lists them all (its cost grows with every
column family already there: docs/benchmarks.md): a live database holds at most
``LIVE_SHARDS_PER_DB`` of them.

The old and the new snapshot of a refresh share the live shards. Before the first ingestion the
refresh pins the old snapshot (``pin``): its live handles become reads through a RocksDB snapshot
taken then, and its ``generation`` moves on, so a read that took a handle before the pin and read
it after an ingestion sees the change of generation and reads again, through the pin.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rocksdict import IngestExternalFileOptions, Rdict

from airflow_provider_shardyfusion.core import scratch
from airflow_provider_shardyfusion.core.errors import ReaderError
from airflow_provider_shardyfusion.core.model.manifest import ShardEntry, ShardLayer
from airflow_provider_shardyfusion.core.model.rocksdb_options import live_shard_options
from airflow_provider_shardyfusion.core.read.local_copy import NUM_LEVELS, sorted_runs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from rocksdict import Snapshot

    from airflow_provider_shardyfusion.core.read.cache_stats import CacheStats
    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot

__all__ = ["LIVE_CF_FILES", "LIVE_DB_FILES", "LIVE_SHARDS_PER_DB", "LiveDb", "LiveJob", "LiveShards", "PinnedShard",
           "live_fixed_files", "out_of_room"]

log = logging.getLogger(__name__)

# Descriptors a live shard's column family holds besides its SSTs: a handle on the database's folder.
LIVE_CF_FILES = 1
# Descriptors a live (read-write) database holds besides its column families' (LIVE_CF_FILES and
# the SSTs of each): LOCK, LOG, WAL, MANIFEST and its folder twice (measured).
LIVE_DB_FILES = 6
# Live shards (column families) per live database: creating one costs more with every column family
# already there (see the module's docstring); 16 keep that cost small while their database's fixed
# descriptors, shared, cost each shard under one.
LIVE_SHARDS_PER_DB = 16
# A new layer of a refresh is copied into the memory-backed folder (small; syncing it costs nothing
# in memory); a shard's files at its first opening are linked (RocksDB syncs the file it links: a
# disk write of a freshly downloaded shard, but its data stays out of memory), the cached file never
# moved away. Either is staged next to the live databases and moved in: a copy cut short by a full
# folder is then a file of ours to remove (RocksDB's own copy left its part in the database's folder).
_MOVE_IN = IngestExternalFileOptions()
_MOVE_IN.set_move_files(True)
# What rocksdict's Snapshot raises (a bare Exception) for a key it does not hold.
_NOT_FOUND = "key not found"
# How RocksDB's IOError (a bare Exception from rocksdict) says its file system is full.
_FULL = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def out_of_room(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it was raised from) says a file system had no room left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(seen) for text in _FULL):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def live_fixed_files(shards: int) -> int:
    """Descriptors the live databases of a reader serving ``shards`` live shards hold besides theirs."""
    return LIVE_DB_FILES * -(-shards // LIVE_SHARDS_PER_DB)


class LiveDb:
    """A reader's private read-write copy of one shard: a column family ``name`` of a live database;
    ``db`` reads and ingests into that column family only.

    ``release`` runs (dropping the column family, which closes its SST files once no read uses it)
    when no snapshot holds this object any more. ``broken``: an ingestion into it failed, so it may
    hold part of a snapshot nobody serves: no refresh ingests into it again.
    """

    __slots__ = ("__weakref__", "broken", "db", "name")

    def __init__(self, db: Rdict, name: str, release: Callable[[], None]):
        self.db = db
        self.name = name
        self.broken = False
        weakref.finalize(self, release)

    def files(self) -> int:
        """Descriptors this shard holds: one per SST file of its column family (RocksDB keeps every
        table open) and the directory handle the column family keeps (measured)."""
        return LIVE_CF_FILES + sum(self.db.property_int_value(f"rocksdb.num-files-at-level{level}") or 0
                                   for level in range(NUM_LEVELS))


class PinnedShard:
    """A live shard read as it was when pinned: ``get`` like an Rdict's (one key or a list)."""

    __slots__ = ("_snapshot",)

    def __init__(self, snapshot: Snapshot):
        self._snapshot = snapshot

    def get(self, key: Any) -> Any:
        if isinstance(key, list):
            return [self._get(k) for k in key]
        return self._get(key)

    def _get(self, key: Any) -> Any:
        try:
            return self._snapshot[key]
        except Exception as exc:
            if str(exc) == _NOT_FOUND:
                return None
            raise


@dataclass(frozen=True)
class LiveJob:
    """A live shard a refresh ingests into: ``added`` layers of ``entry`` after the ``reused`` ones it
    holds, whose verified local ``files`` are ready."""

    live: LiveDb
    entry: ShardEntry
    reused: int
    added: tuple[ShardLayer, ...]
    files: tuple[str, ...] = ()


class _LiveDatabase:
    """One live database and how many live shards it holds now."""

    __slots__ = ("db", "shards")

    def __init__(self, db: Rdict):
        self.db = db
        self.shards = 0


class _LiveBytes:
    """Bytes of the live shards held (shared with their finalizers, which must not hold ``LiveShards``)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class LiveShards:
    """The live shards of one reader's cache, in a memory-backed folder ``root`` (see the module's docstring).

    Built by ``create``, which gives None where the machine has no memory-backed folder.
    """

    def __init__(self, root: str, stats: CacheStats, max_local_layers: int | None):
        self.root = root
        weakref.finalize(self, shutil.rmtree, root, True)
        self._stats = stats
        self._max_local_layers = max_local_layers
        # Guards the live databases' list and their column families' creation and dropping (a
        # dropped shard's finalizer may run in any thread, maybe inside a lock of the cache).
        self._lock = threading.RLock()
        self._dbs: list[_LiveDatabase] = []
        self._seq = 0
        # Merges and compactions rewrite a live shard's data into the memory-backed folder, so the
        # live shards together may hold at most half of what that folder had free (a container's
        # /dev/shm is often 64 MB); past it a shard is served read-only from the cache instead.
        self._budget = _free_bytes(root) // 2
        self._held = _LiveBytes()  # of the live shards held now, as published

    @classmethod
    def create(cls, stats: CacheStats, max_local_layers: int | None) -> LiveShards | None:
        # Live databases need a memory-backed folder: on a disk, opening one and each ingestion cost
        # fsyncs, several times what they cost in memory (docs/benchmarks.md).
        root = scratch.memory_workdir(0, 1, prefix="shardyfusion-live-")
        return cls(root, stats, max_local_layers) if root is not None else None

    def no_room(self, shard: ShardEntry) -> str | None:
        """Why the memory-backed folder has no room for ``shard`` as a new live shard (see ``_budget``),
        or None when it has."""
        with self._lock:
            free = _free_bytes(self.root)
            if self._held.bytes + shard.byte_size <= self._budget and free >= 2 * shard.byte_size:
                return None
            return self.served_read_only(shard.db_id, f"{shard.byte_size} bytes; {self._held.bytes} of "
                                                       f"{self._budget} bytes held, {free} free")

    def _no_room_for_layers(self, job: LiveJob) -> str | None:
        """Why the memory-backed folder cannot take ``job``'s new layers (RocksDB copies them in, and
        may rewrite them in a compaction), or None when it can."""
        added = sum(layer.byte_size for layer in job.added)
        free = self._short_of_room(added)
        if free is None:
            return None
        return self.served_read_only(job.entry.db_id, f"new layers of {added} bytes; {free} bytes free")

    def _short_of_room(self, size: int) -> int | None:
        """The bytes free in the memory-backed folder when fewer than twice ``size`` (RocksDB writes
        what it copies in or compacts before it drops anything), else None."""
        free = _free_bytes(self.root)
        return None if free >= 2 * size else free

    def served_read_only(self, db_id: int, detail: str) -> str:
        """Log and return why shard ``db_id`` is served read-only from the cache: no room for it (``detail``)."""
        reason = f"no room for shard {db_id} in {self.root} ({detail})"
        log.warning("live shards: %s: it is served read-only from the cache, and a refresh tries again", reason)
        return reason

    def open(self, shard: ShardEntry, files: list[str], run_id: str) -> LiveDb:
        """A new live shard holding ``shard``'s verified ``files`` (all its layers, oldest first)."""
        failure = f"cannot open shard {shard.db_id} of run {run_id!r} ({shard.db_url}) as a live shard"
        try:
            live = self._new(shard.db_id, shard.byte_size)
        except Exception as exc:  # e.g. the folder filled since ``no_room``: its options file cannot be written
            raise ReaderError(f"{failure} (in {self.root}): {exc}") from exc
        self._fill(live, files, shard, run_id, link=True, reused_layers=0, failure=failure)
        return live

    def ingest_refresh(self, old: LoadedSnapshot, run_id: str, jobs: Sequence[LiveJob]) -> dict[int, str]:
        """Pin ``old``, then ingest every job's files into its live shard for run ``run_id``; return
        the shards left out for want of room (``db_id`` → why), to be served read-only from the cache.

        A shard is left out when the memory-backed folder, which may have filled since the shard
        opened, lacks room for its new layers, or when its ingestion fails for that reason (its live
        shard is then marked broken). Nothing ``old`` serves changes, also when an ingestion fails
        otherwise: every live shard that took layers is then marked broken (it holds layers of a
        snapshot nobody will serve) and the error propagates.
        """
        self.pin(old)
        done: list[LiveDb] = []
        left_out: dict[int, str] = {}
        try:
            for job in jobs:
                if not job.files:
                    continue
                reason = self._no_room_for_layers(job)
                if reason is None:
                    try:
                        self.ingest(job.live, list(job.files), job.entry, run_id, reused_layers=job.reused)
                        done.append(job.live)
                        continue
                    except ReaderError as exc:
                        if not out_of_room(exc):
                            raise
                        reason = self.served_read_only(job.entry.db_id, str(exc))
                # It holds the old snapshot's layers (maybe part of the new ones): no refresh ingests
                # into it again; ``old`` reads it through its pin.
                job.live.broken = True
                left_out[job.entry.db_id] = reason
        except BaseException:
            for live in done:
                live.broken = True
            raise
        return left_out

    def ingest(self, live: LiveDb, files: list[str], shard: ShardEntry, run_id: str, *, reused_layers: int) -> None:
        """Ingest the verified layer ``files`` into ``live``, oldest first, and compact it in place
        past ``max_local_layers`` sorted runs.

        Each file is copied in (the memory-backed folder is another file system): the cached layer
        stays as verified. A failure marks ``live`` broken: it may hold part of the layers,
        which no snapshot serves.
        """
        self._fill(live, files, shard, run_id, link=False, reused_layers=reused_layers,
                   failure=f"cannot ingest the new layers of shard {shard.db_id} of run {run_id!r} ({shard.db_url}) "
                           "into its live shard")

    def _fill(self, live: LiveDb, files: list[str], shard: ShardEntry, run_id: str, *, link: bool,
              reused_layers: int, failure: str) -> None:
        """Ingest ``files`` into ``live`` and compact it past the bound; a failure is a ``ReaderError`` saying ``failure``."""
        try:
            self._ingest(live, files, link=link)
            self._compact_deep(live, shard, run_id)
        except Exception as exc:
            raise ReaderError(f"{failure} ({live.name} in {self.root}): {exc}") from exc
        self._stats.shard_built(reused_layers=reused_layers)

    @staticmethod
    def pin(snapshot: LoadedSnapshot) -> None:
        """Serve every live shard of ``snapshot`` through a RocksDB snapshot of its database as it is now.

        Called before a refresh ingests into them: ``snapshot`` keeps answering as before until it
        is retired (or, if the refresh fails, for good).
        """
        with snapshot.mutex:
            handles = snapshot.handles
            for db_id, live in snapshot.live.items():
                # One pinned by a refresh that failed keeps that pin: its database may hold more now.
                if db_id in handles and not isinstance(handles[db_id], PinnedShard):
                    handles[db_id] = PinnedShard(live.db.snapshot())
            snapshot.generation += 1

    def close(self) -> None:
        """Remove the memory-backed folder; each live database closes once its last live shard is dropped."""
        with self._lock:
            self._dbs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def _new(self, db_id: int, size: int) -> LiveDb:
        """An empty live shard for shard ``db_id`` of ``size`` bytes, in a live database with room (a new one if none has)."""
        with self._lock:
            home = next((d for d in self._dbs if d.shards < LIVE_SHARDS_PER_DB), None)
            if home is None:
                home = _new_database(self.root)
                self._dbs.append(home)
            self._seq += 1
            # Never a dropped shard's name: a read may still use that column family.
            name = f"db={db_id:05d}.{self._seq}"
            home.db.create_column_family(name, live_shard_options())
            home.shards += 1
            self._held.bytes += size  # only once it holds a shard: its finalizer gives them back
            return LiveDb(home.db.get_column_family(name), name, functools.partial(
                _drop_live, self._lock, self._dbs, self._held, home, name, size))

    def _ingest(self, live: LiveDb, files: list[str], *, link: bool) -> None:
        """Ingest the verified ``files`` into ``live``, oldest first; a failure marks ``live`` broken."""
        try:
            for path in files:  # one at a time: files of one layer may overlap, and the later one wins
                # RocksDB moves what it ingests; a symbolic link moved into the database (a hard link
                # of the link) reads the cached file, which stays where it is.
                incoming = os.path.join(self.root, f".in-{uuid.uuid4().hex}.sst")
                try:
                    if link:
                        os.symlink(os.path.abspath(path), incoming)
                    else:
                        shutil.copyfile(path, incoming)
                    live.db.ingest_external_file([incoming], _MOVE_IN)
                finally:
                    if os.path.lexists(incoming):
                        os.unlink(incoming)
        except Exception:
            live.broken = True
            raise

    def _compact_deep(self, live: LiveDb, shard: ShardEntry, run_id: str) -> None:
        """Compact ``live`` in place once it holds more than ``max_local_layers`` sorted runs.

        A pinned snapshot of it (``pin``) keeps reading what it read: compaction keeps every version
        a RocksDB snapshot still sees. A compaction rewrites the whole shard into the memory-backed
        folder, so it runs only where that folder has room for it (``_no_room_to_compact``); else
        this raises an ``OSError`` (ENOSPC), and the shard is served read-only from the cache, as
        when an ingestion runs out of room: a shard left with ever more sorted runs would read
        slower with every refresh, where the cache's copy is compacted on disk.
        """
        if self._max_local_layers is None or (runs := sorted_runs(live.db)) <= self._max_local_layers:
            return
        reason = self._no_room_to_compact(live, runs)
        if reason is not None:
            live.broken = True  # it holds layers no snapshot will serve from it
            raise OSError(errno.ENOSPC, reason)
        try:
            live.db.compact_range(None, None)
        except Exception:
            live.broken = True
            raise
        # rocksdict's compact_range cannot report RocksDB's error (e.g. a folder full meanwhile):
        # what it did is read back. The shard is exact either way, only slower to read; a later
        # refresh that adds to it compacts it again.
        left = sorted_runs(live.db)
        if left > max(self._max_local_layers, 1):
            log.warning("shard %s of run %s: its live shard still holds %d of its %d sorted runs after a compaction "
                        "(RocksDB reported no error; %s bytes free in %s, %s background errors): served as it is, "
                        "not compacted", shard.db_id, run_id, left, runs, _free_bytes(self.root), self.root,
                        live.db.property_int_value("rocksdb.background-errors"))
            return
        log.info("shard %s of run %s: %d sorted runs of its live shard compacted into one", shard.db_id, run_id, runs)
        self._stats.shard_compacted()

    def _no_room_to_compact(self, live: LiveDb, runs: int) -> str | None:
        """Why the memory-backed folder cannot take a compaction of ``live`` (``runs`` sorted runs),
        or None when it can: it writes about the shard's live bytes (RocksDB's count) again before
        dropping the old files, so it needs room for them as a new layer would (``_short_of_room``)."""
        size = live.db.property_int_value("rocksdb.live-sst-files-size") or 0
        free = self._short_of_room(size)
        if free is None:
            return None
        return f"no room to compact its {runs} sorted runs of {size} bytes: {free} bytes free, {2 * size} needed"

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


def _new_database(root: str) -> _LiveDatabase:
    """A new, empty live database in a folder of its own under ``root`` (removed again if it cannot be made)."""
    folder = tempfile.mkdtemp(prefix="db-", dir=root)
    db: Rdict | None = None
    try:
        db = Rdict(folder, live_shard_options())
        # A RocksDB snapshot at sequence number 0 (a database only ingested into at the bottom level
        # stays there) makes a compaction drop what it should keep for it (a pinned shard's
        # compaction was seen to lose most of its keys): a first write moves the sequence on, so
        # ``pin`` never takes one there.
        db.put(b"sequence", b"")
    except BaseException:
        if db is not None:
            db.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _LiveDatabase(db)


def _free_bytes(folder: str) -> int:
    return scratch.free_bytes(folder)  # a seam for the tests: they cannot mount a small tmpfs
