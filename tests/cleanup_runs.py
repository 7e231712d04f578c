"""Runs for cleanup tests (SPEC §8): real shard objects under their attempt folders, a manifest and a
run record published through ``core.write.commit``, and a listing of the root to prove what was deleted."""

from __future__ import annotations

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardFile, ShardingInfo
from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle
from airflow_provider_shardyfusion.core.write.commit import publish

NO_SLEEP = {"sleep": lambda s: None}


def write_attempt(store, run_id: str, db_id: int, attempt: int, task: int, seed: int) -> tuple[str, tuple[ShardFile, ...]]:
    """A shard attempt folder with small files of distinct sizes (enough to prove exact deletion)."""
    prefix = layout.attempt_key(run_id, db_id, attempt, task)
    files = []
    for name, size in (("000001.sst", 100 + seed), ("CURRENT", 16), ("MANIFEST-000001", 30 + seed % 7)):
        data = bytes([seed % 251]) * size
        store.put(f"{prefix}/{name}", data, content_type="application/octet-stream")
        files.append(ShardFile(name, size, bytes_checksum(data)))
    return prefix, tuple(files)


def succeeded_run(store, run_id: str, started, *, live: bool = True, losing: bool = False,
                  allow_rollback: bool = False) -> dict:
    """Two shards (plus a losing attempt of db 0 if asked), manifest, record succeeded, _CURRENT (if live)."""
    lc = RunRecordLifecycle(store, run_id, heartbeat_seconds=3600, clock=lambda: started).start()
    seed = sum(map(ord, run_id))
    shards, losers = [], []
    for db_id in (0, 1):
        prefix, files = write_attempt(store, run_id, db_id, 1, 10 + db_id, seed + db_id)
        shards.append(ShardEntry(db_id=db_id, db_url=store.uri(prefix), attempt=1, task_attempt_id=10 + db_id,
                                 row_count=5, byte_size=sum(f.size for f in files), min_key="00", max_key="ff",
                                 files=files))
    if losing:
        losers.append(write_attempt(store, run_id, 0, 0, 3, seed + 9)[0])
    manifest = Manifest(
        run_id=run_id, created_at=started, output_uri=store.root, num_dbs=2,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        shards=tuple(shards), stats={"rows": 10}, run_started_at=started,
    ).validate()
    publish(store, manifest, lc, live=live, allow_rollback=allow_rollback, **NO_SLEEP)
    return {"losers": losers}


def objects(store) -> dict[str, int]:
    return {o.key: o.size for o in store.list("")}
