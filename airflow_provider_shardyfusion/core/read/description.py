"""What a reader holds now, for operators and tests: ``ShardedReader.describe()``'s answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.read.local_copy import sorted_runs

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot

__all__ = ["OpenShard", "ReaderDescription", "describe_snapshot"]


@dataclass(frozen=True)
class OpenShard:
    """One shard a reader holds open.

    ``files``: the descriptors counted for it against ``max_open_files``. ``sorted_runs``: the files
    a look-up in it may visit. ``live_shard``: the name of the live shard serving it (a column family,
    never reused: the same name after a refresh is the same live shard, ingested into), or None
    when it is read-only from the cache. ``pinned``: read through a RocksDB snapshot taken by a
    refresh (one that failed half-way leaves the old snapshot pinned for good).
    """

    db_id: int
    files: int
    sorted_runs: int
    live_shard: str | None
    pinned: bool


@dataclass(frozen=True)
class ReaderDescription:
    """What a reader holds now (``ShardedReader.describe()``), a copy that later reads leave as it is.

    ``open_shards``: least recently opened first (the next one closed past a bound). ``files_held``:
    the descriptors they hold together, as counted against ``max_open_files`` (a live reader's
    databases' own are set aside from it). ``ingest_refreshes``: whether shards are served from
    live shards (asked for, and a memory-backed folder exists).
    """

    run_id: str
    cache_dir: str
    open_shards: tuple[OpenShard, ...]
    files_held: int
    max_open_shards: int
    max_open_files: int
    ingest_refreshes: bool

    @property
    def live_shards(self) -> tuple[OpenShard, ...]:
        """The open shards served from live shards."""
        return tuple(shard for shard in self.open_shards if shard.live_shard is not None)


def describe_snapshot(snapshot: LoadedSnapshot, *, cache_dir: str, max_open_shards: int, max_open_files: int,
                      ingest_refreshes: bool) -> ReaderDescription:
    """``snapshot`` as ``ShardedReader.describe()`` reports it (its handles read under its lock, measured after)."""
    with snapshot.mutex:
        handles = list(snapshot.handles.items())
        live = dict(snapshot.live)
        files = dict(snapshot.sst_files)
        held = snapshot.open_files
    shards = []
    for db_id, handle in handles:
        live_db = live.get(db_id)
        # A pinned handle has no properties of its own: its live shard's are the same files.
        db = live_db.db if live_db is not None else handle
        shards.append(OpenShard(db_id=db_id, files=files[db_id], sorted_runs=sorted_runs(db),  # type: ignore[arg-type]  # a read-only shard's handle is its Rdict
                                live_shard=live_db.name if live_db is not None else None,
                                pinned=live_db is not None and handle is not live_db.db))
    return ReaderDescription(run_id=snapshot.run_id, cache_dir=cache_dir, open_shards=tuple(shards), files_held=held,
                             max_open_shards=max_open_shards, max_open_files=max_open_files,
                             ingest_refreshes=ingest_refreshes)
