"""The RocksDB options every shard database and SST file is written and opened with."""

from __future__ import annotations

from typing import Any

__all__ = ["SST_FORMAT_VERSION", "ingest_only_options", "live_shard_options", "rocksdb_options"]

# Block-based table format 5 is readable since RocksDB 6.x; the default 6 is refused before 8.6
# (e.g. Debian 12's RocksDB 7.8: "Corrupt or unsupported format_version: 6"). SPEC §5.
SST_FORMAT_VERSION = 5


def rocksdb_options(*, auto_compactions: bool = True, compress: bool = True) -> Any:
    """rocksdict ``Options`` for a shard: raw keys and values, cheap opens, portable SST files.

    ``auto_compactions=False`` for a database whose files must stay as ingested (a reader's cache
    records them by checksum). ``compress=False`` writes blocks uncompressed: for values Snappy
    cannot shrink, RocksDB stores each block raw anyway, after paying for the attempt (a large
    share of an SST's write time for random values; docs/benchmarks.md). Every RocksDB release
    reads either.
    """
    from rocksdict import BlockBasedOptions, DBCompressionType, Options

    # raw_mode: stored keys/values are exactly our bytes, so any RocksDB client can read the shard.
    opts = Options(raw_mode=True)
    # A database per shard, opened once: RocksDB's 16 file-opening threads and its stats pass on
    # open are pure fixed cost here, paid by every shard opened and written (docs/benchmarks.md).
    opts.set_max_file_opening_threads(1)
    opts.set_skip_stats_update_on_db_open(True)
    if not auto_compactions:
        opts.set_disable_auto_compactions(True)
    if not compress:
        opts.set_compression_type(DBCompressionType.none())
    table = BlockBasedOptions()
    table.set_format_version(SST_FORMAT_VERSION)
    opts.set_block_based_table_factory(table)
    return opts


def ingest_only_options() -> Any:
    """Options of a scratch database filled only by ingesting SSTs that overlap, then read."""
    opts = rocksdb_options(auto_compactions=False)
    # Overlapping files all land in level 0: never stall on them.
    opts.set_level_zero_slowdown_writes_trigger(1 << 30)
    opts.set_level_zero_stop_writes_trigger(1 << 30)
    return opts


def live_shard_options() -> Any:
    """Options of a reader's live shard: filled by ingesting SSTs that overlap, read, and ingested into again.

    Each ingested layer lands in level 0, never stalling, and is merged in the background into the
    level below: a look-up visits each sorted run (a follower whose shards kept several runs read
    slower than a compacted snapshot: docs/benchmarks.md), so a live shard reads from one again
    soon after a refresh, as a shard built fresh (compacted past ``max_local_layers``) does.
    """
    opts = rocksdb_options()
    opts.set_level_zero_file_num_compaction_trigger(1)
    opts.set_level_zero_slowdown_writes_trigger(1 << 30)
    opts.set_level_zero_stop_writes_trigger(1 << 30)
    return opts
