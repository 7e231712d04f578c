"""One snapshot a reader follows: its manifest, key locator, and the shard handles open now.

A reader holds a single reference to a ``LoadedSnapshot``. ``refresh()`` builds a complete new one
and swaps the reference, then retires the old one: reads still on it raise ``StaleSnapshot`` at
their next shard open and retry on the current snapshot.

Retired shard handles are never closed explicitly: rocksdict refuses ``close()`` while another
thread is inside a read of the same handle ("Already borrowed"), and the read would then fail.
Instead the retired snapshot drops its handles and each one closes (rocksdict closes on
deallocation) as soon as the last read still using it returns. A handle evicted to keep at most
``max_open`` shards and ``max_files`` SST files open closes the same way: a read-only database
holds a descriptor per SST file, so a reader with every shard of thousands open, or with shards of
many layers each, runs out of descriptors (issue #26).

A shard may be *live* (``live``): served from a column family of a read-write database private to
the reader, into which ``refresh()`` ingests the new layers instead of building and opening the
shard again. The
old and the new snapshot then share that database: before the first ingestion the refresh pins the
old snapshot (``pin_live``): its live handles become reads through a RocksDB snapshot taken then,
and ``generation`` moves on, so a read that took a handle before the pin and read it after an
ingestion sees the change of generation and reads again, through the pin.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUTS, Manifest, ShardEntry
from airflow_provider_shardyfusion.core.read.key_locator import GroupKeys, KeyLocator, Locate
from airflow_provider_shardyfusion.core.read.value_decoding import value_decoder

if TYPE_CHECKING:
    from collections.abc import Callable

    from rocksdict import Rdict, Snapshot

    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.model.routing import CelRouter

__all__ = ["LIVE_CF_FILES", "NUM_LEVELS", "LiveDb", "LoadedSnapshot", "PinnedShard", "StaleSnapshot"]

# RocksDB's default number of levels (every database here uses it).
NUM_LEVELS = 7
# Descriptors a live shard's column family holds besides its SSTs: a handle on the database's folder.
LIVE_CF_FILES = 1

# What rocksdict's Snapshot raises (a bare Exception) for a key it does not hold.
_NOT_FOUND = "key not found"


class StaleSnapshot(Exception):
    """Internal: the snapshot a read started on was swapped out by ``refresh()``/``close()``."""


class LiveDb:
    """A reader's private read-write copy of one shard: a column family ``name`` of a live database
    (see ``ShardCache``); ``db`` reads and ingests into that column family only.

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


class LoadedSnapshot:
    """One followed snapshot: its manifest, how its keys are located, the shard handles open now.

    Not a frozen dataclass on purpose: ``handles`` fills lazily, holding at most ``max_open``
    databases of at most ``max_files`` SST files together (but always the newest one; the least
    recently opened is dropped first: a hit costs no bookkeeping), and ``paths`` keeps
    the local folder of every shard built or verified for it, to reopen an evicted shard without
    checking it again. Everything else is fixed at construction. ``handles`` is read without a lock
    (a dict lookup is atomic in CPython) and written only under the shard's lock and ``mutex``.
    """

    __slots__ = (
        "cel_router",
        "decode",
        "generation",
        "group",
        "handles",
        "live",
        "locate",
        "manifest",
        "max_files",
        "max_open",
        "mutex",
        "open_files",
        "paths",
        "pointer",
        "retired",
        "run_id",
        "shard_locks",
        "shards",
        "sst_files",
    )

    def __init__(self, pointer: CurrentPointer, manifest: Manifest, *, max_open: int, max_files: int,
                 value_decoding: str = "typed"):
        self.pointer = pointer
        self.manifest = manifest
        self.run_id = manifest.run_id
        if manifest.shard_layout not in SHARD_LAYOUTS:
            raise ManifestValidationError(
                f"manifest of run {self.run_id!r}: shard_layout {manifest.shard_layout!r} is unknown to this reader "
                f"(expected one of {list(SHARD_LAYOUTS)}); upgrade the reader"
            )
        self.shards: dict[int, ShardEntry] = {s.db_id: s for s in manifest.shards}
        self.handles: dict[int, Rdict | PinnedShard] = {}
        self.max_open = max_open
        self.max_files = max_files
        self.sst_files: dict[int, int] = {}  # SST files of each open handle
        self.open_files = 0
        self.paths: dict[int, str] = {}
        self.live: dict[int, LiveDb] = {}  # the open handles that are live databases
        self.generation = 0
        # One lock per shard: a shard is downloaded once however many threads want it.
        self.shard_locks = {db_id: threading.Lock() for db_id in self.shards}
        self.mutex = threading.Lock()
        self.retired = False
        # None where the stored bytes are the value: skipping the call keeps get() close to raw rocksdict.
        self.decode: Callable[[bytes], Any] | None = value_decoder(
            manifest.value_format, manifest.value_schema, value_decoding)
        locator = KeyLocator.for_manifest(manifest)
        self.locate: Locate = locator.locate
        self.group: GroupKeys | None = locator.group
        self.cel_router: CelRouter | None = locator.cel_router

    def register(self, db_id: int, db: Rdict, sst_files: int, live: LiveDb | None = None) -> None:
        with self.mutex:
            if self.retired:
                raise StaleSnapshot()
            while self.handles and (len(self.handles) >= self.max_open or self.open_files + sst_files > self.max_files):
                evicted = next(iter(self.handles))
                del self.handles[evicted]  # closes once no read uses it (see above)
                self.live.pop(evicted, None)
                self.open_files -= self.sst_files.pop(evicted)
            self.handles[db_id] = db
            self.sst_files[db_id] = sst_files
            self.open_files += sst_files
            if live is not None:
                self.live[db_id] = live

    def pin_live(self) -> dict[int, LiveDb]:
        """Serve every live shard through a RocksDB snapshot of its database as it is now; return them.

        Called before a refresh ingests into them: this snapshot keeps answering as before until it
        is retired (or, if the refresh fails, for good).
        """
        with self.mutex:
            for db_id, live in self.live.items():
                # One pinned by a refresh that failed keeps that pin: its database may hold more now.
                if db_id in self.handles and not isinstance(self.handles[db_id], PinnedShard):
                    self.handles[db_id] = PinnedShard(live.db.snapshot())
            self.generation += 1
            return dict(self.live)

    def retire(self) -> None:
        """Stop serving: later reads retry on the new snapshot; handles close once unused."""
        with self.mutex:
            self.retired = True
            self.handles.clear()
            self.live.clear()
            self.sst_files.clear()
            self.open_files = 0
