"""The snapshot lifecycle under real Airflow (``dag.test()``) with real local Spark, file:// store.

stage → validate → publish → consumer sensor (deferrable) → read back → cleanup dry run → cleanup;
a staged run that fails the validation gate never goes live; the rollback DAG moves ``_CURRENT``
back and a reader follows; ``shardyfusion cleanup`` then reclaims exactly the unneeded run.
Every check reads the snapshot back and compares values with what the DAG run generated.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_shardyfusion import ShardedReader
from airflow_provider_shardyfusion.cli import main as cli
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})
DAG_ID = "shardyfusion_snapshot_lifecycle"
ROWS = 3000


def key_of(i: int) -> int:  # the DAG's own key function
    return i * 7919 + 13


def assert_live_run_reads(root: str, airflow_run_id: str, write_run_id: str) -> None:
    keys = [key_of(i) for i in range(ROWS)]
    with ShardedReader(root) as reader:
        assert reader.run_id == write_run_id
        values = reader.multi_get(keys)
    wrong = [k for k, v in zip(keys, values, strict=False) if v != f"value-{k}-{airflow_run_id}".encode()]
    assert not wrong, f"{len(wrong)} of {ROWS} keys read back wrong"


def test_lifecycle_gate_rollback_and_cleanup(run_dag, tmp_path, capsys):
    env = {"SHARDYFUSION_DEMO_DIR": str(tmp_path), "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK}
    root = f"file://{tmp_path}/{DAG_ID}/snapshot"
    snapshots = SnapshotRoot(open_store(root))

    first = run_dag(DAG_ID, conf={"rows": ROWS}, extra_env=env)
    staged = first.xcoms["write_snapshot"]
    run1 = staged["run_id"]
    assert staged["published"] is False and staged["rows"] == ROWS
    report = first.xcoms["validate_snapshot"]
    assert report["ok"] is True and report["run_id"] == run1 and report["rows"] == ROWS
    assert {c["name"] for c in report["checks"] if c["ok"] and not c["skipped"]} >= {"structure", "storage", "run_record"}
    expected = [lk for lk in report["lookups"] if lk["source"] == "expected"]
    assert len(expected) == 2 and all(lk["found"] for lk in expected)
    assert first.xcoms["publish_snapshot"]["moved"] is True
    assert first.xcoms["consumer_waits"]["run_id"] == run1
    assert first.xcoms["read_back"]["lookups"][str(key_of(0))] == f"value-{key_of(0)}-{first.run_id}"
    assert first.xcoms["read_back"]["lookups"]["7"] is None
    assert first.xcoms["cleanup_plan"]["dry_run"] is True
    assert snapshots.read_run(run1).published_at is not None
    assert_live_run_reads(root, first.run_id, run1)

    gated = run_dag(DAG_ID, conf={"rows": ROWS, "min_rows": ROWS + 1}, extra_env=env, expect_success=False)
    assert gated.tasks["validate_snapshot"] == "failed"
    assert gated.tasks["publish_snapshot"] == "upstream_failed"
    assert "min_rows" in gated.output
    run2 = gated.xcoms["write_snapshot"]["run_id"]
    assert snapshots.read_run(run2).status == "succeeded" and snapshots.read_run(run2).published_at is None
    assert snapshots.current().run_id == run1
    assert_live_run_reads(root, first.run_id, run1)

    third = run_dag(DAG_ID, conf={"rows": ROWS}, extra_env=env)
    run3 = third.xcoms["write_snapshot"]["run_id"]
    assert snapshots.current().run_id == run3
    assert_live_run_reads(root, third.run_id, run3)

    rollback = run_dag("shardyfusion_snapshot_rollback", conf={"output_uri": root}, extra_env=env)
    assert rollback.xcoms["find_target"] == run1
    assert rollback.xcoms["roll_back"]["rollback"] is True
    assert rollback.xcoms["consumer_sees_rollback"]["run_id"] == run1
    assert snapshots.current().previous_run_id == run3
    assert_live_run_reads(root, first.run_id, run1)

    # Keep one succeeded run besides the live one: the newest (run3) stays, the staged run2 goes.
    before = {o.key: o.size for o in snapshots.store.list("")}
    assert cli(["cleanup", root, "--keep-runs", "1", "--grace-period-seconds", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    after = {o.key: o.size for o in snapshots.store.list("")}
    gone = set(before) - set(after)
    assert gone and all((layout.parse_shard_key(k) and layout.parse_shard_key(k).run_id == run2)
                        or (layout.parse_manifest_key(k) and layout.parse_manifest_key(k).run_id == run2) for k in gone)
    assert json.dumps(printed).count(run2) >= 1
    assert snapshots.read_run(run2).deleted_at is not None
    assert_live_run_reads(root, first.run_id, run1)
    assert_live_run_reads_pinned(snapshots, run3, third.run_id)


def assert_live_run_reads_pinned(snapshots: SnapshotRoot, write_run_id: str, airflow_run_id: str) -> None:
    ref = snapshots.find_manifest(write_run_id)
    keys = [key_of(i) for i in range(0, ROWS, 7)]
    with ShardedReader(snapshots.root, manifest_ref=ref.uri) as reader:
        assert reader.multi_get(keys) == [f"value-{k}-{airflow_run_id}".encode() for k in keys]
