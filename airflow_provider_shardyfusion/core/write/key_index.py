"""A layer's key index: one SST of its keys with empty values beside its data (SPEC §13).

Full shards, compacted layers and delta layers with enough value bytes write one, ``keys-00000.sst``:
a put with an empty value per key the layer holds, a point tombstone per key it deletes. The key
indexes of a shard, ingested oldest first, hold exactly the keys its layers do, so a delta's
existence check downloads keys, not values. Readers never ingest them.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from airflow_provider_shardyfusion.core.model import checksum
from airflow_provider_shardyfusion.core.model.manifest import ShardFile

__all__ = ["KEY_INDEX_FILE", "finish_key_index", "key_index_file", "key_index_writer", "shard_file", "sst_writer"]

KEY_INDEX_FILE = "keys-00000.sst"


def sst_writer(path: str) -> Any:
    """An open SST writer at ``path`` with the tables every layer uses (``rocksdb_options``)."""
    from rocksdict import SstFileWriter

    writer = SstFileWriter(options=_sst_options())
    writer.open(path)
    return writer


@functools.cache
def _sst_options() -> Any:
    """The writers' options, built once per process and only read by each writer: building them
    cost a large part of writing a small delta layer (1000s a run)."""
    from airflow_provider_shardyfusion.core.model.rocksdb_options import rocksdb_options

    return rocksdb_options()


def shard_file(folder: str, name: str) -> ShardFile:
    """The manifest's entry (size, checksum) of the written file ``name`` in ``folder``."""
    path = os.path.join(folder, name)
    return ShardFile(name=name, size=os.path.getsize(path), checksum=checksum.file_checksum(path))


def key_index_writer(folder: str) -> Any:
    """The SST writer of a layer's key index in ``folder``: set ``writer[key] = b""`` per put, del per deletion."""
    return sst_writer(os.path.join(folder, KEY_INDEX_FILE))


def finish_key_index(writer: Any, folder: str) -> ShardFile:
    writer.finish()
    return key_index_file(folder)


def key_index_file(folder: str) -> ShardFile:
    """The manifest's entry of the key index written in ``folder``."""
    return shard_file(folder, KEY_INDEX_FILE)
