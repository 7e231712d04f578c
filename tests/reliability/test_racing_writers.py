"""Promise: two writers racing on one root end in exactly one consistent outcome, never a mix.

Two real writes run at the same time and are held just before publishing (test-only fault
``hold_before_publish``) until both got there; then both are released at once (or, to meet the
never-backwards rule every time, the run that started last first).
- Different run ids (two spark-submits): ``_CURRENT`` ends on the run that started last, its
  record ``succeeded`` and its manifest reading back exactly its own values (none of the other's).
  The other either published first and was replaced, or was superseded: kept staged by the
  never-backwards rule (recorded ``succeeded``, never live), its job ending well with a warning.
- One run id (two ``ShardedWriteOperator`` executions of different tasks): one writes the run; the
  other fails with a clear error and never marks the first's record, which publishes.
Throughout, the old snapshot reads back exactly and ``_CURRENT`` names only succeeded runs.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import RunRecordError
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.fault_env import set_faults
from tests.reliability.job_harness import (
    Watch,
    job_config,
    live_run,
    old_snapshot,
    read_exactly,
    run_objects,
    submit,
    wait_for,
    write_input,
)

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.spark


def hold_all(tmp_path) -> tuple[dict, Callable[[str], None], Callable[[str], bool]]:
    """Faults holding every writer before publish: run R writes ``R.pid`` and goes on once ``R.go`` exists.

    Returns the faults, ``release(run_id)`` and ``reached(run_id)``.
    """
    faults = {"hold_before_publish": {"marker": str(tmp_path / "{run_id}.pid"),
                                      "release": str(tmp_path / "{run_id}.go"), "seconds": 150}}
    return (faults, lambda run_id: (tmp_path / f"{run_id}.go").touch(),
            lambda run_id: (tmp_path / f"{run_id}.pid").exists())


def only_values_of(root: str, mine: dict[int, bytes], theirs: dict[int, bytes]) -> int:
    """The live snapshot holds exactly ``mine``: every key of the other writer's data reads as ours or absent."""
    checked = read_exactly(root, mine)
    with ShardedReader(root) as reader:
        keys = sorted(set(theirs) - set(mine))
        assert reader.multi_get(keys) == [None] * len(keys)
    return checked + len(keys)


@pytest.mark.parametrize("release_order", ["at_once", "newer_first"])
def test_two_writers_with_different_run_ids(tmp_path, figure, release_order):
    """``at_once``: both publish at the same moment. ``newer_first``: the run that started last
    publishes first, so the other must meet the never-backwards rule."""
    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    faults, release, reached = hold_all(tmp_path)
    data = {name: write_input(tmp_path / name, keys, name)
            for name, keys in (("first", range(0, 4000)), ("second", range(1, 6000, 2)))}
    watch = Watch(root, old_expected)
    jobs = {name: submit(job_config(root, path, num_dbs=4, run_id=layout.new_run_id()), tmp_path, faults=faults)
            for name, (path, _) in data.items()}
    try:
        for job in jobs.values():
            wait_for(lambda job=job: reached(job.run_id) or job.proc.poll() is not None, 180,
                     f"run {job.run_id} to reach the publish hold")
            assert job.proc.poll() is None, job.output()[-3000:]
        assert live_run(root) == old_run  # both written, both held: nothing moved yet
        snapshots = SnapshotRoot(open_store(root))
        started = {name: snapshots.read_run(job.run_id).started_at for name, job in jobs.items()}
        newer, older = sorted(started, key=started.__getitem__, reverse=True)
        assert started[newer] > started[older]
        if release_order == "newer_first":
            release(jobs[newer].run_id)
            assert jobs[newer].wait() == 0, jobs[newer].output()[-3000:]
        for job in jobs.values():
            release(job.run_id)
        codes = {name: job.wait() for name, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.stop()
    watch.stop()

    records = {name: snapshots.read_run(job.run_id) for name, job in jobs.items()}
    pointer = snapshots.current()
    assert pointer.run_id == jobs[newer].run_id
    assert codes[newer] == 0, jobs[newer].output()[-3000:]
    assert records[newer].status == "succeeded" and records[newer].manifest_ref == pointer.manifest_ref
    assert records[newer].published_at is not None
    # The other: published first and replaced, or kept staged by the never-backwards rule. Either
    # way its job succeeds: newer data is live, and a failed task's retry would publish the older
    # input over it under a fresh run id.
    assert codes[older] == 0, jobs[older].output()[-3000:]
    assert records[older].status == "succeeded"
    if records[older].published_at is not None:
        assert release_order == "at_once", "the older run moved _CURRENT after the newer one was live"
        outcome = "replaced"
        assert pointer.previous_run_id == jobs[older].run_id
        assert watch.live_runs in ([old_run, jobs[older].run_id, jobs[newer].run_id], [old_run, jobs[newer].run_id])
    else:
        outcome = "superseded"
        assert pointer.previous_run_id == old_run and watch.live_runs == [old_run, jobs[newer].run_id]
        line = next(x for x in jobs[older].output().splitlines() if "superseded, so it stays staged" in x)
        assert f"_CURRENT names run {jobs[newer].run_id!r}" in line, line
        assert "refusing to move it backwards" in line and "allow-older" in line
    checked = only_values_of(root, data[newer][1], data[older][1])

    # The lifecycle cleanup, keeping one snapshot, reclaims the loser and the old snapshot, never the live one.
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(0))
    doomed = {i.run_id: i.category for i in plan.items}
    assert doomed == {old_run: "expired_snapshots", jobs[older].run_id: "expired_snapshots"}, plan.to_dict()
    report = execute_cleanup(snapshots, plan)
    assert run_objects(root, old_run) == [] and run_objects(root, jobs[older].run_id) == []
    checked += only_values_of(root, data[newer][1], data[older][1])
    figure(writers=2, published=1, other=outcome, polls=watch.polls, old_values_checked=watch.values_checked,
           rows_checked=checked, objects_reclaimed=report.to_dict()["deleted_objects"])


class FakeTI(SimpleNamespace):
    def xcom_push(self, key, value):
        pass


def test_two_writers_with_one_run_id(tmp_path, figure, monkeypatch):
    from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
    from airflow_provider_shardyfusion.submission.bundle import build_bundle

    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    faults, release, reached = hold_all(tmp_path)
    set_faults(monkeypatch, faults)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    build_bundle()  # once, before two operators want it at the same moment
    run_id = layout.new_run_id()
    data = {name: write_input(tmp_path / name, keys, name)
            for name, keys in (("write_a", range(0, 4000)), ("write_b", range(1, 6000, 2)))}
    outcome: dict[str, BaseException | dict] = {}

    def execute(task_id: str) -> None:
        op = ShardedWriteOperator(task_id=task_id, output_uri=root, input_path=f"file://{data[task_id][0]}", key_column="id",
                                  value_column="v", num_dbs=4, run_id=run_id, aws_conn_id=None,
                                  spark_conf={"spark.ui.enabled": "false"})
        ti = FakeTI(dag_id="race", task_id=task_id, run_id="manual__race", try_number=1, map_index=-1)
        try:
            outcome[task_id] = op.execute({"ti": ti, "outlet_events": defaultdict(lambda: SimpleNamespace(extra=None))})
        except BaseException as exc:  # the losing writer must fail
            outcome[task_id] = exc

    watch = Watch(root, old_expected)
    threads = [threading.Thread(target=execute, args=(name,), daemon=True) for name in data]
    for t in threads:
        t.start()
    try:
        # One writer holds its run at publish; the other has failed meanwhile (while the first still runs).
        wait_for(lambda: reached(run_id) and len(outcome) == 1, 240, "one writer held at publish, the other failed")
        loser = next(iter(outcome))
        winner = next(n for n in data if n != loser)
        record = SnapshotRoot(open_store(root)).read_run(run_id)
        assert record.status == "running" and record.writer["airflow"]["task_id"] == winner  # not marked by the loser
    finally:
        release(run_id)
        for t in threads:
            t.join(timeout=180)
    watch.stop()

    error = outcome[loser]
    assert isinstance(error, RunRecordError), repr(error)
    message = str(error)
    # Refused before submitting (the record was already there) or by its own job (it was not yet).
    refused_by = "operator" if "is already used at" in message else "job"
    assert "run ids must be unique" in message, message
    assert isinstance(outcome[winner], dict) and outcome[winner]["run_id"] == run_id, outcome[winner]
    record = SnapshotRoot(open_store(root)).read_run(run_id)
    assert record.status == "succeeded" and record.error is None and record.writer["airflow"]["task_id"] == winner
    assert live_run(root) == run_id and watch.live_runs == [old_run, run_id]
    checked = only_values_of(root, data[winner][1], data[loser][1])
    figure(writers=2, published=1, refused=1, refused_by=refused_by, polls=watch.polls,
           old_values_checked=watch.values_checked, rows_checked=checked)


def test_a_writer_whose_clock_is_hours_behind_is_refused_before_writing(tmp_path, figure):
    """Issue 22 #5: the never-backwards rule compares run start times of different machines. A driver
    three hours behind would have its fresh run judged older than the live one and staged silently;
    instead it fails at its start, saying so, and nothing of it is written or published."""
    root = f"file://{tmp_path}/snap"
    old_run, old_expected = old_snapshot(root)
    input_path, _ = write_input(tmp_path / "input", range(500), "skewed")
    config = job_config(root, input_path, num_dbs=4, run_id=layout.new_run_id())
    job = submit(config, tmp_path, faults={"clock_offset_seconds": -3 * 3600})
    code = job.wait()
    assert code != 0, job.output()[-3000:]
    record = SnapshotRoot(open_store(root)).read_run(config.run_id)
    assert record.status == "failed" and record.error.type == "ClockSkewError", record.to_dict()
    assert "s apart" in record.error.message and "NTP" in record.error.message
    assert "ClockSkewError" in job.output()
    assert live_run(root) == old_run
    checked = read_exactly(root, old_expected)
    assert run_objects(root, config.run_id) == []  # no shard file, no manifest
    figure(skewed_writers=1, refused=1, objects_written=0, pointer_moves=0, values_checked=checked)
