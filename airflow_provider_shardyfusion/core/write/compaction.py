"""The base shards one compaction task merges (SPEC §13), through ONE local database per task.

A compaction iterates each shard's merged rows in key order. A key routes to one shard, but the
shards of a task interleave in key order, so they cannot share one keyspace as a delta's
existence check does (``delta.TaskBase``). Each shard gets a column family of its own instead: a
keyspace in the task's database, created for the shard and dropped once its layer is written.
A column family costs no more than a fresh database to create and fill, less to drop, and on a
disk half a database's fsyncs (figures: docs/benchmarks.md). What cost most was the reader per shard: decoding the base manifest
chain, building its cache on disk, copying and deleting it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.write.delta import TaskFiles

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.manifest import Manifest

__all__ = ["TaskCompaction"]


class TaskCompaction(TaskFiles):
    """The base shards of one compaction task, one at a time, each in its own column family of the
    task's database in ``folder``. A shard's layers go in oldest first, every file verified, so
    iterating the shard yields its live rows only.
    """

    def __init__(self, store: Any, base: Manifest, folder: str):
        super().__init__(store, base, folder)
        self._family: str | None = None

    def shard_db(self, db_id: int) -> Any:
        """Base shard ``db_id`` alone, to read and iterate (None when the base has no such shard).

        The previous shard's column family is dropped first: its handle must not be used after."""
        from airflow_provider_shardyfusion.core.model.rocksdb_options import ingest_only_options

        self._drop()
        shard = self.base.shard(db_id)
        if shard is None:
            return None
        self._family = f"shard-{db_id:05d}"
        family = self._task_db().create_column_family(self._family, ingest_only_options())
        for layer in shard.all_layers():
            self._ingest(family, db_id, layer, layer.files)
        return family

    def _drop(self) -> None:
        if self._family is not None:
            self._db.drop_column_family(self._family)
            self._family = None

    def close(self) -> None:
        if self._db is not None:
            self._drop()
        super().close()
