"""Promise: a delta run killed with ``kill -9`` mid-write leaves the live snapshot exact (SPEC §13).

A full snapshot is live; a delta job (spark-submit, local mode) is held by a test-only fault after
it uploaded the layer of shard 1, and its Python driver is killed. ``_CURRENT`` never names the
dead run, the live snapshot reads back exactly throughout, a rerun of the same change publishes
and reads back exactly the base with the change applied, and cleanup reaps the dead run's layers
without touching any layer the live chain reads.
"""

from __future__ import annotations

import os
import signal

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reliability.job_harness import (
    Watch,
    held_pid,
    live_run,
    python_driver,
    read_exactly,
    reclaim,
    run_objects,
    submit,
    wait_for,
    write_input,
)

pytestmark = pytest.mark.spark
LEASE_S, HEARTBEAT_S = 6.0, 1.0


def test_killed_delta_driver_leaves_the_live_snapshot_exact(tmp_path, figure):
    root = f"file://{tmp_path}/snap"
    base_input, base = write_input(tmp_path / "base", range(3000), "base")
    job = submit(build_write_config(output_uri=root, input_path=base_input, key_column="id", value_column="v",
                                    num_dbs=4, run_id="base-run"), tmp_path)
    try:
        assert job.wait() == 0, job.output()[-3000:]
    finally:
        job.stop()
    change_dir = tmp_path / "change"
    change_dir.mkdir()
    upserts = {k: f"delta-{k}".encode() for k in range(0, 3000, 10)} | {k: b"new" for k in range(5000, 5100)}
    deletes = list(range(1, 3000, 10))
    keys = [*upserts, *deletes]
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64()), "v": [upserts.get(k) for k in keys],
                             "gone": [k in deletes for k in keys]}), change_dir / "part-0.parquet")
    changed = {k: v for k, v in base.items() if k not in deletes} | upserts

    def delta_config(run_id: str, **kw):
        return build_write_config(output_uri=root, input_path=str(change_dir), key_column="id", value_column="v",
                                  write_mode="delta", delete_column="gone", run_id=run_id, **kw)

    marker = tmp_path / "held.pid"
    watch = Watch(root, base)
    dead = delta_config("delta-killed", lease_seconds=LEASE_S, heartbeat_seconds=HEARTBEAT_S)
    job = submit(dead, tmp_path, faults={"hold_shard_write": {"db_id": 1, "attempt": 0, "marker": str(marker),
                                                              "seconds": 90}})
    try:
        held_pid(marker, job)
        tree = job.tree()
        os.kill(python_driver(job).pid, signal.SIGKILL)
        job.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive
    finally:
        job.stop()
    snapshots = SnapshotRoot(open_store(root))
    assert live_run(root) == "base-run" and snapshots.find_manifest("delta-killed") is None
    assert run_objects(root, "delta-killed"), "the held delta had uploaded the layer of shard 1"
    checked = read_exactly(root, base)

    job = submit(delta_config("delta-rerun"), tmp_path)
    try:
        assert job.wait() == 0, job.output()[-3000:]
    finally:
        job.stop()
    assert live_run(root) == "delta-rerun"
    checked += read_exactly(root, changed)
    manifest = snapshots.read_manifest(snapshots.current())
    assert manifest.base_run_id == "base-run" and manifest.row_count == len(changed)

    wait_for(lambda: snapshots.read_run("delta-killed").lease_expired(layout.utc_now()), LEASE_S + 5,
             "the dead run's lease to run out", interval=0.5)
    reclaimed = reclaim(root, "delta-killed", "abandoned_runs", keep=("base-run", "delta-rerun"))
    assert run_objects(root, "base-run"), "the live chain's base layers stay"
    checked += read_exactly(root, changed)
    watch.stop()
    assert watch.live_runs == ["base-run", "delta-rerun"]
    figure(processes_killed=1, polls=watch.polls, old_values_checked=watch.values_checked, rows_checked=checked,
           objects_reclaimed=reclaimed)
