"""Promise: a Spark driver killed with ``kill -9`` at any point never makes a failed run live.

The job runs through spark-submit in local mode (a JVM that starts the Python driver, which runs
the write). It is held at a chosen point by a test-only fault, and one of its processes is killed:
- the Python driver while a worker writes shard 2 (its files already uploaded),
- the Python driver just before it publishes (every shard written, no manifest yet),
- the JVM (spark-submit) while a worker writes shard 2: the orphaned Python driver ends itself.
Afterwards every process of the job is gone and ``_CURRENT`` never named the run. Its record still
says ``running`` (nobody was left to finish it), or, when the JVM died first, ``failed`` with a
``SparkSubmitError`` saying the JVM is gone. Throughout, the old snapshot reads back exactly
and ``_CURRENT`` names only succeeded runs. A rerun publishes exactly; once the dead run's lease
has run out, the lifecycle cleanup marks it abandoned (or takes it as failed) and deletes everything
it wrote.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reliability.job_harness import (
    Watch,
    command_line,
    held_pid,
    job_config,
    live_run,
    old_snapshot,
    python_driver,
    read_exactly,
    reclaim,
    rerun,
    run_objects,
    submit,
    wait_for,
    write_input,
)

pytestmark = pytest.mark.spark
LEASE_S, HEARTBEAT_S = 6.0, 1.0  # short, so the cleanup can reap the dead run within the test


@pytest.mark.parametrize(("target", "point"), [
    ("python_driver", "mid_write"),
    ("python_driver", "before_publish"),
    ("jvm", "mid_write"),
])
def test_killed_driver(tmp_path, figure, target, point):
    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    input_path, _ = write_input(tmp_path / "input", range(4000), "new")
    marker = tmp_path / "held.pid"
    hold = {"marker": str(marker), "seconds": 90}
    faults = ({"hold_shard_write": {"db_id": 2, "attempt": 0, **hold}} if point == "mid_write"
              else {"hold_before_publish": hold})
    config = job_config(root, input_path, num_dbs=4, run_id=layout.new_run_id(), lease_seconds=LEASE_S,
                        heartbeat_seconds=HEARTBEAT_S)
    watch = Watch(root, old_expected)
    job = submit(config, tmp_path, faults=faults)
    try:
        held = held_pid(marker, job)
        tree = job.tree()
        driver = python_driver(job)
        if point == "before_publish":
            assert held == driver.pid
        victim = driver if target == "python_driver" else psutil.Process(job.proc.pid)
        assert target != "jvm" or "java" in victim.name(), command_line(victim)
        os.kill(victim.pid, signal.SIGKILL)
        job.wait(timeout=60)
        # Every process of the job ends: no orphan driver, no Python worker left writing.
        gone, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [(p.pid, command_line(p)) for p in alive]
    finally:
        job.stop()

    snapshots = SnapshotRoot(open_store(root))
    record = snapshots.read_run(config.run_id)
    assert record is not None
    if record.status == "running":  # nobody was left to finish it: the cleanup reaps it once its lease is out
        category = "abandoned_runs"
    else:
        # The JVM died first: the Python driver's next call to it failed, and it recorded why (before the
        # orphan guard ended it, which it does within a second).
        assert target == "jvm" and record.status == "failed" and record.error.type == "SparkSubmitError", record
        assert record.error.message.startswith("the Spark JVM this Python driver talks to (spark-submit's process) "
                                               "is gone: it was killed or crashed"), record.error.message
        category = "failed_runs"
    assert live_run(root) == old_run and snapshots.find_manifest(config.run_id) is None
    left = run_objects(root, config.run_id)
    assert left  # shard files the dead run uploaded
    checked = read_exactly(root, old_expected)

    rerun_id, rerun_expected, rows = rerun(root, tmp_path)
    checked += rows

    if category == "abandoned_runs":
        wait_for(lambda: snapshots.read_run(config.run_id).lease_expired(layout.utc_now()), LEASE_S + 5,
                 "the dead run's lease to run out", interval=0.5)
    reclaimed = reclaim(root, config.run_id, category, keep=(old_run, rerun_id))
    after = snapshots.read_run(config.run_id)
    assert after.status == "failed"
    assert after.error.type == ("RunAbandoned" if category == "abandoned_runs" else "SparkSubmitError")
    checked += read_exactly(root, rerun_expected)  # the cleanup left the live snapshot whole
    watch.stop()
    assert watch.live_runs == [old_run, rerun_id]
    figure(processes_killed=1, processes_ended=len(gone), record=category.split("_")[0], polls=watch.polls,
           old_values_checked=watch.values_checked, rows_checked=checked, objects_reclaimed=reclaimed)
