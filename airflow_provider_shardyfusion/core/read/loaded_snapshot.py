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

A shard's handle may be a live shard's (``live_shards``), kept in ``live`` too: a refresh ingests
into it and pins this snapshot first, moving ``generation`` on so that a read that took a handle
before the pin reads again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUTS, Manifest, ShardEntry
from airflow_provider_shardyfusion.core.read.key_locator import GroupKeys, KeyLocator, Locate
from airflow_provider_shardyfusion.core.read.value_decoding import value_decoder

if TYPE_CHECKING:
    from collections.abc import Callable

    from rocksdict import Rdict

    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.model.routing import CelRouter
    from airflow_provider_shardyfusion.core.read.live_shards import LiveDb, PinnedShard

__all__ = ["LoadedSnapshot", "StaleSnapshot"]


class StaleSnapshot(Exception):
    """Internal: the snapshot a read started on was swapped out by ``refresh()``/``close()``."""


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
        "read_only",
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
        # Shards a live reader serves read-only from the cache for want of room in its memory-backed
        # folder, and why (health() reports them); a later refresh tries them live again.
        self.read_only: dict[int, str] = {}
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

    def retire(self) -> None:
        """Stop serving: later reads retry on the new snapshot; handles close once unused."""
        with self.mutex:
            self.retired = True
            self.handles.clear()
            self.live.clear()
            self.sst_files.clear()
            self.open_files = 0
