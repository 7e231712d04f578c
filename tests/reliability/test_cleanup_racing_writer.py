"""Promise: a cleanup that runs while a writer is mid-write deletes nothing of that writer's run.

The writer is a real spark-submit in local mode, held after shard 1's files were uploaded
(test-only fault ``hold_shard_write``, released by a file). While it holds, the lifecycle cleanup
runs with no grace period: the running run (valid lease) is left whole, while an orphan shard folder
next to it is deleted, so the cleanup really ran. Released, the writer publishes exactly. The old
snapshot reads back exactly throughout and ``_CURRENT`` only ever names succeeded runs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reliability.job_harness import (
    Watch,
    held_pid,
    job_config,
    live_run,
    old_snapshot,
    read_exactly,
    run_objects,
    submit,
    write_input,
)

pytestmark = pytest.mark.spark
ORPHAN_RUN = "19990101T000000Z-0rphan00"


def test_cleanup_while_a_writer_is_mid_write(tmp_path, figure):
    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    store = open_store(root)
    orphan_key = layout.attempt_key(ORPHAN_RUN, 0, 0) + "/run-00000.sst"
    store.put(orphan_key, b"left by a writer whose run record never existed")

    input_path, expected = write_input(tmp_path / "input", range(3000), "new")
    marker, release = tmp_path / "held.pid", tmp_path / "release"
    faults = {"hold_shard_write": {"db_id": 1, "attempt": 0, "marker": str(marker), "release": str(release),
                                   "seconds": 120}}
    config = job_config(root, input_path, num_dbs=4, run_id=layout.new_run_id())
    watch = Watch(root, old_expected)
    job = submit(config, tmp_path, faults=faults)
    try:
        held_pid(marker, job)
        snapshots = SnapshotRoot(store)
        writing = run_objects(root, config.run_id)
        assert writing, "the held writer has uploaded shard files"
        record = snapshots.read_run(config.run_id)
        assert record is not None and record.status == "running"

        plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(0))
        assert [(i.category, i.run_id) for i in plan.items] == [("orphans", ORPHAN_RUN)], plan.to_dict()
        report = execute_cleanup(snapshots, plan)
        assert not report.errors and not report.abandoned
        assert report.deleted["orphans"]["objects"] == 1
        assert not store.exists(orphan_key)
        # Nothing of the running run went (other, unheld shards may have landed meanwhile).
        assert set(writing) <= set(run_objects(root, config.run_id))
        assert live_run(root) == old_run

        release.touch()
        code = job.wait()
    finally:
        job.stop()
    watch.stop()
    assert code == 0, job.output()[-3000:]
    assert live_run(root) == config.run_id
    checked = read_exactly(root, expected)
    assert snapshots.read_run(config.run_id).status == "succeeded"
    figure(objects_deleted_while_writing=report.deleted["orphans"]["objects"], writer_objects_kept=len(writing),
           polls=watch.polls, old_values_checked=watch.values_checked, rows_checked=checked)
