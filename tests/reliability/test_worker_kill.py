"""Promise: a Python worker killed (``kill -9``) while it writes a shard never yields a mixed snapshot.

The job runs through spark-submit in local mode; the worker writing shard 2 holds after its files
are uploaded (test-only fault ``hold_shard_write``) and is killed there, so the killed attempt
leaves objects behind. With task retries (master ``local[2,4]``: spark.task.maxFailures=4) Spark
runs the shard again and the run publishes exactly, from the retried attempt. Without retries
(``local[2]``) the run fails with one clear ``ShardWriteError`` saying a Python worker died while
writing shard 2 and what to do, recorded in the run record; nothing is published. Throughout, the
old snapshot reads back exactly and ``_CURRENT`` names only succeeded runs; a rerun publishes
exactly; the lifecycle cleanup reclaims what the kill left.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import psutil
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import make_plan
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reliability.job_harness import (
    Watch,
    held_pid,
    job_config,
    live_run,
    old_snapshot,
    read_exactly,
    reclaim,
    rerun,
    run_objects,
    submit,
    write_input,
)

pytestmark = pytest.mark.spark
KILLED_SHARD = 2
NUM_DBS = 4


@pytest.mark.parametrize("retries", [True, False], ids=["with_task_retries", "no_task_retries"])
def test_killed_python_worker(tmp_path, figure, retries):
    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    input_path, expected = write_input(tmp_path / "input", range(4000), "new")
    marker = tmp_path / "worker.pid"
    faults = {"hold_shard_write": {"db_id": KILLED_SHARD, "attempt": 0, "marker": str(marker), "seconds": 90}}
    config = job_config(root, input_path, num_dbs=NUM_DBS, run_id=layout.new_run_id())
    watch = Watch(root, old_expected)
    job = submit(config, tmp_path, master="local[2,4]" if retries else "local[2]", faults=faults)
    try:
        pid = held_pid(marker, job)
        worker = psutil.Process(pid)
        assert "pyspark" in " ".join(worker.cmdline()), worker.cmdline()  # a Python worker, not the driver
        os.kill(pid, signal.SIGKILL)
        code = job.wait()
    finally:
        job.stop()
    watch.stop()
    output = job.output()
    snapshots = SnapshotRoot(open_store(root))
    record = snapshots.read_run(config.run_id)
    assert record is not None
    checked = read_exactly(root, expected if retries else old_expected)

    if retries:
        assert code == 0, output[-3000:]
        assert record.status == "succeeded" and live_run(root) == config.run_id
        manifest = snapshots.read_manifest(snapshots.manifest_ref(record.manifest_ref))
        retried = manifest.shards[KILLED_SHARD]
        assert retried.attempt == 1  # the killed attempt 0 is not in the snapshot
        # The writer itself deleted the killed attempt's uploaded files: only winners remain.
        winners = tuple(open_store(root).key_of(s.db_url) + "/" for s in manifest.shards)
        assert all(k.startswith(winners) or k.startswith(layout.MANIFESTS_DIR) for k in run_objects(root, config.run_id))
        rerun_of, reclaimed = None, 0
    else:
        assert code == 1, output[-3000:]
        assert record.status == "failed" and record.error is not None
        message = record.error.message
        assert record.error.type == "ShardWriteError", record.error
        assert message.startswith(f"a Spark Python worker died while writing shard {KILLED_SHARD} (task "
                                  f"{KILLED_SHARD} of Spark stage "), message
        for words in ("killed by the operating system's out-of-memory killer or by a signal",
                      "Spark gave up after 1 failed attempt(s)", "nothing was published", "spark.task.maxFailures",
                      "spark.executor.memory", "sort_run_rows"):
            assert words in message, message
        assert "Py4JJavaError" not in message
        assert f"shardyfusion job failed: ShardWriteError: {message}" in output
        assert live_run(root) == old_run and snapshots.find_manifest(config.run_id) is None
        assert run_objects(root, config.run_id)  # the killed attempt (and finished shards) left files
        rerun_of = config.run_id

    # A rerun (new run id, new values) publishes exactly over whatever the fault left.
    rerun_id, _, rows = rerun(root, tmp_path, NUM_DBS)
    checked += rows
    if rerun_of is not None:
        reclaimed = reclaim(root, rerun_of, "failed_runs", keep=(old_run, rerun_id))
    else:
        plan = make_plan(snapshots, grace_period=timedelta(0))
        assert config.run_id not in {i.run_id for i in plan.items}  # nothing of the retried run is left
    figure(processes_killed=1, task_retries=int(retries), exit_code=code, polls=watch.polls,
           old_values_checked=watch.values_checked, rows_checked=checked, objects_reclaimed=reclaimed)


# Spark 4's text for a task whose Python worker died (as raised above), trimmed to the parts read.
_SPARK_TEXT = (
    "An error occurred while calling o71.collectToPython.\n: org.apache.spark.SparkException: Job aborted due to "
    "stage failure: Task {task} in stage 6.0 failed 3 times, most recent failure: Lost task {task}.2 in stage 6.0 "
    "(TID 9) (localhost executor driver): org.apache.spark.SparkException: Python worker exited unexpectedly "
    "(crashed).\n\tat org.apache.spark.scheduler.{kind}.runTask({kind}.scala:93)\nDriver stacktrace:\n\tat "
    "org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:3318)"
)


@pytest.mark.parametrize(("kind", "where"), [
    ("ResultTask", "while writing shards 4..5 (task 2 of Spark stage 6)"),  # several shards per task
    ("ShuffleMapTask", "in task 2 of Spark stage 6"),  # reading / routing input rows: no shard yet
])
def test_worker_death_names_the_shards_of_the_writing_task_only(kind, where):
    from airflow_provider_shardyfusion.spark_jobs.errors import translate
    from airflow_provider_shardyfusion.spark_jobs.shard_task import shards_of_task

    error = translate(RuntimeError(_SPARK_TEXT.format(task=2, kind=kind)),
                      shards_of_task=lambda t: shards_of_task(t, 8, 4))
    assert type(error).__name__ == "ShardWriteError"
    assert str(error).startswith(f"a Spark Python worker died {where}: "), error
    assert "Spark gave up after 3 failed attempt(s)" in str(error)
