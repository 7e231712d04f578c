"""A snapshot root holding every state a run can end in, for the history tests (CLI and UI)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, RunError
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot
from tests.snapshot_helpers import write_run_record


def build_history_root(root: str, opts: dict[str, Any] | None) -> dict[str, str]:
    """Runs named gone (deleted), v1 (superseded), v2 (live after a rollback), v3 (rolled back) and
    staged (validated), of 10, 20, 30, 40 and 50 rows with values ``b"<name>-<key>"``; plus a failed,
    a running and an unreadable record. Returns the run id of each name."""
    store = open_store(root, opts)
    snapshots = SnapshotRoot(store)
    t0 = layout.utc_now() - timedelta(hours=5)
    runs = {}
    for i, name in enumerate(("gone", "v1", "v2", "v3", "staged")):
        rows = [(k, f"{name}-{k}".encode()) for k in range(10 * (i + 1))]
        runs[name] = build_snapshot(root, rows, num_dbs=3, storage_options=opts, run_id=f"2026010{i + 1}T000000Z-{name:0>8}",
                                    published_at=t0 + timedelta(hours=i), publish=name != "staged").run_id
    # v3 went live last; rolling back to v2 makes v3 "rolled back", v1 stays "superseded".
    publish_run(snapshots, run_id=runs["v2"], allow_older=True)
    # A real cleanup deletes the oldest run (keep 3 newest, no grace).
    plan = make_plan(snapshots, keep_runs=3, grace_period=timedelta(0), keep_run_ids=[runs["v1"]])
    assert [i.run_id for i in plan.items if i.run_id == runs["gone"]] == [runs["gone"]], plan.to_dict()
    execute_cleanup(snapshots, plan)
    # After the cleanup, which would reclaim a failed run at once.
    write_run_record(store, "20260107T000000Z-failed00", FAILED, error=RunError("InputDataError", "duplicate key 4"),
                     now=layout.utc_now() - timedelta(minutes=2))
    write_run_record(store, "20260108T000000Z-running0", RUNNING)
    store.put(layout.run_record_key("20260109T000000Z-broken00"), b"{not json")
    assert validate_snapshot(snapshots, run_id=runs["staged"], min_rows=1).ok
    return runs


def source_for(roots, opts, tmp_path) -> Any:
    """The history app's ``HistorySource`` over ``roots`` (its reader cache under ``tmp_path``)."""
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.ui.app import HistorySource

    return HistorySource(
        roots=lambda: list(roots), open_root=lambda uri: SnapshotRoot(open_store(uri, opts)),
        open_reader=lambda uri, ref: ShardedReader(uri, storage_options=opts, manifest_ref=ref,
                                                   cache_dir=str(tmp_path / "cache")))


def client_for(roots, opts, tmp_path) -> Any:
    """A FastAPI test client of the history app over ``source_for(roots, opts, tmp_path)``."""
    from fastapi.testclient import TestClient

    from airflow_provider_shardyfusion.ui.app import create_app

    return TestClient(create_app(source_for(roots, opts, tmp_path)))


# A JVM trace as a failed Spark job leaves it: a long first line, then hundreds of frames.
JVM_TRACE = ("Py4JJavaError: An error occurred while calling o271.save.\n"
             "org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 7.0 failed 1 times, "
             "most recent failure: Lost task 3.0 in stage 7.0 (TID 41) (127.0.0.1 executor driver): "
             "java.lang.IllegalStateException: shard writer lost its output stream after 3 retries\n"
             + "\n".join(f"\tat org.apache.spark.sql.execution.datasources.FileFormatWriter$.executeTask{i}"
                         f"(FileFormatWriter.scala:{400 + i})" for i in range(250)))


def build_change_root(root: str, opts: dict[str, Any] | None = None) -> dict[str, str]:
    """Issue 41's root: a full run of keys 0..1999, then a delta that updates every 10th key, deletes
    20 and inserts 500 keys after the end of the key space (2000..2499), then a failed run whose
    error is ``JVM_TRACE``. Returns the run id of each name (base, delta, failed)."""
    from tests.snapshot_factory import build_delta

    t0 = layout.utc_now() - timedelta(hours=2)
    base = build_snapshot(root, [(k, f"b0-{k}".encode()) for k in range(2000)], num_dbs=4, storage_options=opts,
                          run_id="20260101T000000Z-uibase00", shard_layout="sst", published_at=t0)
    upserts = {k: f"b1-{k}".encode() for k in [*range(0, 2000, 10), *range(2000, 2500)]}
    delta = build_delta(root, upserts, range(5, 2000, 100), storage_options=opts, run_id="20260102T000000Z-uidelta0",
                        published_at=t0 + timedelta(hours=1))
    failed = "20260103T000000Z-uifailed"
    write_run_record(open_store(root, opts), failed, FAILED, error=RunError("SparkJobError", JVM_TRACE))
    return {"base": base.run_id, "delta": delta.run_id, "failed": failed}
