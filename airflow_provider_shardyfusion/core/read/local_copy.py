"""Verified local copies of shards and their layers: download, verify, build, install, reuse.

Layout: ``<root>/run_id=<run>/db=<id>/`` for a shard, ``<root>/layers/run_id=<run>/db=<id>/`` for
one layer of a chain shard. A shard is downloaded (every file's size and checksum checked) into a
private staging folder and renamed into place; a shard shipped as SST files only (``shard_layout``
"sst") is first ingested, in the manifest's file order, into a fresh database there. A marker file
records what was verified, and a cached copy is re-checked against it on every reuse, except that a
refresh builds on the database this very cache built or verified (the one it serves) without
hashing it again, and so does the reopening of a shard whose handle was closed to stay within the
reader's bounds (``trusted_now``). A shard of a delta chain is its layers ingested oldest first,
built on a cached database of an earlier run of the chain when one holds a prefix of them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

from rocksdict import IngestExternalFileOptions, Rdict

from airflow_provider_shardyfusion.core import layout, scratch
from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError, ReaderError
from airflow_provider_shardyfusion.core.model.checksum import download_verified, file_checksum, verify_file
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUT_SST
from airflow_provider_shardyfusion.core.model.rocksdb_options import rocksdb_options
from airflow_provider_shardyfusion.core.read.cache_lock import build_lock, staging_path
from airflow_provider_shardyfusion.core.read.loaded_snapshot import StaleSnapshot

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from airflow_provider_shardyfusion.core.model.manifest import ShardEntry, ShardFile, ShardLayer
    from airflow_provider_shardyfusion.core.read.cache_stats import CacheStats
    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot
    from airflow_provider_shardyfusion.core.storage import ObjectStore

__all__ = ["INCOMING", "MARKER", "MEMORY_BUILD_FROM_DISK_MAX_BYTES", "MEMORY_BUILD_MAX_BYTES", "NUM_LEVELS", "LocalCopies",
           "sorted_runs"]

log = logging.getLogger(__name__)

# Written next to the shard files once every file is verified; a cached shard without a matching
# marker (crash mid-download, another manifest) is downloaded again. RocksDB ignores the file.
MARKER = ".shardyfusion-shard.json"
# "sst" layout: the downloaded SSTs wait here (inside the staging folder) until they are ingested.
INCOMING = ".incoming"
# Shards up to this size are downloaded straight into a memory-backed folder and built there; only
# the database is copied out, which costs less than a disk's fsyncs (docs/benchmarks.md).
MEMORY_BUILD_MAX_BYTES = 256 << 20
# A chain's layers are already in the cache on disk: a memory build copies them in and the database
# out, worth it only for small shards (a large chain shard opened slower that way).
MEMORY_BUILD_FROM_DISK_MAX_BYTES = 16 << 20
# RocksDB's default number of levels (every database here uses it).
NUM_LEVELS = 7


class LocalCopies:
    """The verified local copies under a cache's ``root`` (see the module's docstring).

    ``max_local_layers``: a database built with more sorted runs than this is compacted into one.
    """

    def __init__(self, store: ObjectStore, root: str, stats: CacheStats, max_local_layers: int | None):
        self._store = store
        self.root = root
        self._stats = stats
        self._max_local_layers = max_local_layers
        # Shard databases this cache built or verified, by folder: their marker's (inode, mtime) then.
        self._trusted: dict[str, tuple[int, int]] = {}

    def shard(self, snapshot: LoadedSnapshot, shard: ShardEntry) -> str:
        """The folder of a verified local database of ``shard``: reused, built from its layers, or downloaded.

        Under the shard's build lock (``cache_lock``): of the processes sharing this cache, one
        builds it and the others, once it is installed, reuse it after checking it.
        """
        with build_lock(layout.local_cache_dir(self.root, snapshot.run_id, shard.db_id), give_up=_giving_up(snapshot)):
            return self._layered_copy(snapshot, shard) if shard.layers else self._shard_copy(snapshot, shard)

    def layer_files(self, snapshot: LoadedSnapshot, shard: ShardEntry, layers: tuple[ShardLayer, ...]) -> list[str]:
        """The verified local files of ``layers`` of ``shard``, oldest first (downloaded once per cache)."""
        return [path for layer in layers for path in self._layer_files(snapshot, shard, layer)]

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
            download_verified(self._store, f"{base_key}/{f.name}", local, f.size, f.checksum, source=source)
        return local_files

    def _shard_copy(self, snapshot: LoadedSnapshot, shard: ShardEntry) -> str:
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
        staging = _new_staging(final)
        # A small shard to ingest is downloaded and built in memory, then its database copied out.
        memory = scratch.memory_workdir(shard.byte_size, MEMORY_BUILD_MAX_BYTES, prefix="shardyfusion-cache-") \
            if ingest else None
        try:
            local_files = self._download_verified(
                snapshot, shard, os.path.join(memory or staging, INCOMING) if ingest else staging, shard.db_url,
                shard.files)
            if ingest and snapshot.retired:
                raise StaleSnapshot()
            written = _ingest_into_db(staging, local_files, entry, shard, run_id,
                                      build_dir=os.path.join(memory, "db") if memory else None,
                                      max_runs=self._max_local_layers, on_compact=self._stats.shard_compacted,
                                      ) if ingest else marker
            if snapshot.retired:
                raise StaleSnapshot()
            _install(staging, final, written, marker, shard.files, f"shard {shard.db_id} of run {run_id!r}")
            self._trust(final)
            self._stats.layer_downloaded(shard.byte_size)
            self._stats.shard_built(reused_layers=0)
            log.info("shard %s of run %s: downloaded %d files from %s", shard.db_id, run_id, len(shard.files), shard.db_url)
            return final
        finally:
            _discard(staging, memory)

    # -- shards of a chain (SPEC §13) --------------------------------------------------------------

    def _layer_files(self, snapshot: LoadedSnapshot, shard: ShardEntry, layer: ShardLayer) -> list[str]:
        """The verified local files of one layer, downloaded once per cache (under its build lock, as a
        shard) and shared by every run that reads it."""
        folder = layout.local_layer_dir(self.root, layer.run_id, shard.db_id)
        with build_lock(folder, give_up=_giving_up(snapshot)):
            return self._layer_copy(snapshot, shard, layer, folder)

    def _layer_copy(self, snapshot: LoadedSnapshot, shard: ShardEntry, layer: ShardLayer, folder: str) -> list[str]:
        marker = json.dumps({"db_url": layer.db_url, "files": [f.to_dict() for f in layer.files]}, sort_keys=True)
        paths = [os.path.join(folder, *f.name.split("/")) for f in layer.files]
        if _reusable(folder, marker, layer.files, f"layer {layer.run_id!r} of shard {shard.db_id}"):
            return paths
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        staging = _new_staging(folder)
        try:
            self._download_verified(snapshot, shard, staging, layer.db_url, layer.files)
            _install(staging, folder, marker, marker, layer.files, f"layer {layer.run_id!r} of shard {shard.db_id}")
            self._stats.layer_downloaded(layer.byte_size)
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
        every shard slower than opening the new snapshot fresh (docs/benchmarks.md); only the new
        files are copied out.
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
        staging = _new_staging(final)
        memory = None
        try:
            source, done = self._clone_source(shard.db_id, layers, exclude=run_id)
            linked: dict[str, tuple[int, int, str]] = {}
            # A new database is built in memory only when small (see MEMORY_BUILD_FROM_DISK_MAX_BYTES);
            # a clone copies in nothing but the layers it lacks, and out only what it writes.
            # A clone that lacks no layer is only linked and copied: no database is opened, so no
            # fsync to spare by building it in memory.
            memory = None if source is not None and done == len(shard.layers) else scratch.memory_workdir(
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
                                      on_compact=self._stats.shard_compacted)
            _install(staging, final, written, marker, (), where)
            self._trust(final)
            if done < len(shard.layers):
                self._stats.shard_built(reused_layers=done)
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
                with open(os.path.join(folder, MARKER), encoding="utf-8") as fh:
                    recorded = json.loads(fh.read())
                have = recorded.get("layers") or [_full_sig(recorded)]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if best[1] < len(have) <= len(layers) and have == layers[:len(have)] \
                    and (self.trusted_now(folder) or _cached_copy_ok(folder, "", (), f"cached {folder}")):
                best = (folder, len(have))
        return best

    def _trust(self, folder: str) -> str:
        """Remember that this cache verified (or built) ``folder`` as its marker is now; returns it."""
        try:
            st = os.stat(os.path.join(folder, MARKER))
        except OSError:
            return folder
        self._trusted[folder] = (st.st_ino, st.st_mtime_ns)
        return folder

    def trusted_now(self, folder: str) -> bool:
        """Whether ``folder`` is still what this cache verified: a refresh clones the database it serves
        without hashing the whole shard again (another process replacing it changes its marker)."""
        seen = self._trusted.get(folder)
        try:
            st = os.stat(os.path.join(folder, MARKER))
        except OSError:
            return False
        return seen == (st.st_ino, st.st_mtime_ns)

    def remove_run(self, run_id: str) -> None:
        """Delete ``run_id``'s shard folders and forget that this cache trusted them."""
        folder = os.path.join(self.root, f"run_id={run_id}")
        for trusted in [f for f in self._trusted if f.startswith(folder + os.sep)]:
            self._trusted.pop(trusted, None)
        shutil.rmtree(folder, ignore_errors=True)


def _giving_up(snapshot: LoadedSnapshot) -> Callable[[], None]:
    """Stop waiting for another process's build once nobody will open the shard (the snapshot retired)."""
    def check() -> None:
        if snapshot.retired:
            raise StaleSnapshot()
    return check


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
                if max_runs is not None and (runs := sorted_runs(db)) > max_runs:
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
    shutil.rmtree(os.path.join(folder, INCOMING), ignore_errors=True)
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



def sorted_runs(db: Rdict) -> int:
    """How many files a point look-up may visit: each level-0 file, plus one per other non-empty level."""
    runs = 0
    for level in range(NUM_LEVELS):
        files = db.property_int_value(f"rocksdb.num-files-at-level{level}") or 0
        runs += files if level == 0 else min(files, 1)
    return runs


def _new_staging(final: str) -> str:
    """The empty staging folder of a build of ``final``; the caller holds its build lock."""
    staging = staging_path(final)
    os.mkdir(staging, 0o700)  # private, as a temporary folder would be
    return staging


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
    with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as fh:
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
    path = os.path.join(base, INCOMING, run_id)
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
    with open(os.path.join(source, MARKER), encoding="utf-8") as fh:
        marker = json.load(fh)
    # An ingested shard records its local files; a downloaded database ("db" layout) is its manifest
    # entry, whose files were verified one for one.
    listed = marker.get("local_files") if "local_files" in marker else marker.get("files", ())
    recorded = {str(f["name"]): (int(f["size"]), str(f["checksum"])) for f in listed}
    linked: dict[str, tuple[int, int, str]] = {}
    os.makedirs(into, exist_ok=True)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if not os.path.isfile(path) or name == "LOCK" or name.startswith("LOG") or name == MARKER:
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
        with open(os.path.join(path, MARKER), encoding="utf-8") as fh:
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
