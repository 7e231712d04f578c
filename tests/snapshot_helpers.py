"""Build snapshot objects (run record, manifest, ``_CURRENT``) with core models, no Spark.

Used by the sensor / trigger tests: a manifest with zero shards (every shard empty) is a valid
published snapshot.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardingInfo
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunError, RunRecord
from airflow_provider_shardyfusion.core.storage import ObjectStore, open_store


def store_for(root: str, options: dict[str, Any] | None = None) -> ObjectStore:
    return open_store(root, options)


def write_run_record(store: ObjectStore, run_id: str, status: str = RUNNING, *, manifest_ref: str | None = None,
                     error: RunError | None = None, lease_seconds: float = 600.0,
                     now: datetime | None = None) -> RunRecord:
    now = now or layout.utc_now()
    record = RunRecord(
        run_id=run_id, status=status, started_at=now - timedelta(seconds=5), updated_at=now,
        lease_expires_at=now + timedelta(seconds=lease_seconds), output_uri=store.root,
        finished_at=now if status in (SUCCEEDED, FAILED) else None, manifest_ref=manifest_ref, error=error, num_dbs=2,
    ).validate()
    store.put(layout.run_record_key(run_id), record.to_bytes())
    return record


def publish_snapshot(store: ObjectStore, run_id: str | None = None) -> CurrentPointer:
    """An empty 2-shard snapshot: manifest, run record ``succeeded``, then ``_CURRENT`` (publish order)."""
    run_id = run_id or layout.new_run_id()
    now = layout.utc_now()
    manifest = Manifest(
        run_id=run_id, created_at=now, output_uri=store.root, num_dbs=2,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        shards=(), stats={"rows": 0, "empty_shards": 2},
    ).validate()
    manifest_key = layout.manifest_key(run_id, now)
    store.put(manifest_key, manifest.to_bytes())
    manifest_ref = store.uri(manifest_key)
    write_run_record(store, run_id, SUCCEEDED, manifest_ref=manifest_ref, now=now)
    pointer = CurrentPointer(manifest_ref=manifest_ref, run_id=run_id, updated_at=now)
    store.put(layout.CURRENT_KEY, pointer.to_bytes())
    return pointer


def publish_written_run(store: ObjectStore, run_id: str, *, started_minutes_ago: float = 0.0, live: bool = True,
                        writer: dict[str, Any] | None = None) -> RunRecord:
    """An empty 2-shard run through the writer's own two-phase publish (``core.write.commit.publish``),
    as if its run had started ``started_minutes_ago``; ``live=False`` stages it."""
    from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle
    from airflow_provider_shardyfusion.core.write.commit import publish

    now = layout.utc_now()
    manifest = Manifest(
        run_id=run_id, created_at=now, output_uri=store.root, num_dbs=2,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        shards=(), stats={"rows": 0, "empty_shards": 2}, run_started_at=now - timedelta(minutes=started_minutes_ago),
    ).validate()
    lifecycle = RunRecordLifecycle(store, run_id, num_dbs=2, writer=writer).start()
    return publish(store, manifest, lifecycle, live=live, sleep=lambda s: None)

