"""Promise: the Spark Connect server killed mid-publish (manifest written, ``_CURRENT`` not moved yet)
leaves a run that is failed or published, never half; a rerun publishes exactly; cleanup reclaims the rest.

Real parts: a Spark Connect server on loopback (its whole process group killed with SIGKILL), the
operator running the job as a Connect client child process, held by the test-only fault
``hold_before_pointer`` (the run's manifest written and its record succeeded, the pointer not moved),
then a second server for the rerun, and the lifecycle cleanup. ``Watch`` reads the old snapshot
exactly and checks that ``_CURRENT`` names only succeeded runs throughout.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.fault_env import set_faults
from tests.operator_helpers import connections, execute_in_thread, make_context, make_op
from tests.polling import wait_for
from tests.reliability.job_harness import Watch, live_run, old_snapshot, read_exactly, reclaim, run_objects, write_input
from tests.spark_connect_server import connect_server, connect_server_process

pytestmark = pytest.mark.spark


def connect(monkeypatch, port: int) -> None:
    connections(monkeypatch, spark={"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})


def test_connect_server_killed_between_manifest_and_pointer(monkeypatch, tmp_path, figure):
    root = f"file://{tmp_path}/snap"
    snapshots = SnapshotRoot(open_store(root))
    old_run, old_expected = old_snapshot(root)
    input_path, killed_expected = write_input(tmp_path / "input", range(600), "killed")
    marker, release = tmp_path / "held.pid", tmp_path / "release"
    run_id = layout.new_run_id()
    watch = Watch(root, old_expected)
    (tmp_path / "server-a").mkdir()
    with connect_server_process(tmp_path / "server-a") as (port, server):
        connect(monkeypatch, port)
        # Set after the server started: the hold is the client's (the job's driver side), not the server's.
        set_faults(monkeypatch, {"hold_before_pointer": {"marker": str(marker), "release": str(release), "seconds": 120}})
        op = make_op(root, aws_conn_id=None, input_path=f"file://{input_path}", key_column="id", value_column="v",
                     num_dbs=3, run_id=run_id)
        task, outcome = execute_in_thread(op)
        wait_for(lambda: marker.exists() or not task.is_alive(), 180, "the job to hold before moving _CURRENT")
        assert marker.exists(), outcome
        held = snapshots.read_run(run_id)
        assert held.status == SUCCEEDED and held.manifest_ref and held.published_at is None
        assert live_run(root) == old_run
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        killed = time.monotonic()
        release.touch()
        task.join(timeout=120)
        seconds = time.monotonic() - killed
        if task.is_alive():  # a client stuck on the dead server: stop it so the test can report
            op.on_kill()
        assert not task.is_alive(), "the task did not end within 120 s of the kill"
    monkeypatch.delenv("SHARDYFUSION_TEST_FAULTS")

    # Never half: the task's verdict, the record and _CURRENT agree.
    record = snapshots.read_run(run_id)
    if "result" in outcome:
        assert outcome["result"]["published"] is True and outcome["result"]["run_id"] == run_id
        assert record.status == SUCCEEDED and record.published_at is not None
        assert live_run(root) == run_id
        # What went live is the killed run's own data, exactly (a fresh reader of _CURRENT).
        killed_checked = read_exactly(root, killed_expected)
        verdict, category = "published", "expired_snapshots"
    else:
        assert record.status == "failed", (outcome["error"], record.to_dict())
        assert live_run(root) == old_run and snapshots.find_manifest(run_id) is None
        verdict, category, killed_checked = "failed", "failed_runs", 0
    assert record.publishing_at is None or record.published_at is not None, record.to_dict()  # no claim left behind

    # A rerun on a fresh server publishes exactly.
    rerun_input, rerun_expected = write_input(tmp_path / "rerun", range(0, 900, 2), "rerun")
    rerun_id = layout.new_run_id()
    (tmp_path / "server-b").mkdir()
    with connect_server(tmp_path / "server-b") as port_b:
        connect(monkeypatch, port_b)
        summary = make_op(root, aws_conn_id=None, input_path=f"file://{rerun_input}", key_column="id", value_column="v",
                          num_dbs=4, run_id=rerun_id).execute(make_context())
    assert summary["published"] is True and live_run(root) == rerun_id
    checked = read_exactly(root, rerun_expected)
    watch.stop()
    assert watch.live_runs == ([old_run, run_id, rerun_id] if verdict == "published" else [old_run, rerun_id])

    # The cleanup takes what the killed run left (a superseded snapshot, or a failed run's files), nothing live.
    assert run_objects(root, run_id)
    # keep_runs is len(keep) + 1: a superseded snapshot expires only when just the live one is kept.
    reclaimed = reclaim(root, run_id, category, keep=() if verdict == "published" else (old_run, rerun_id))
    checked += read_exactly(root, rerun_expected)
    figure(servers_killed=1, outcome=verdict, seconds_to_end=f"{seconds:.1f}", polls=watch.polls,
           old_values_checked=watch.values_checked, killed_run_values_checked=killed_checked, rows_checked=checked,
           objects_reclaimed=reclaimed)
