"""A root's history and the difference of two runs (SPEC §16 models), on both stores, through the CLI.

The root is built with every state a run can end in: live, superseded, rolled back, staged,
failed, running, deleted (by a real cleanup) and unreadable; the expected states are stated
independently of the code under test, from how the root was built.
"""

from __future__ import annotations

import json

from airflow_provider_shardyfusion.cli import main
from tests.history_root import build_history_root
from tests.value_schemas import build_schema_root


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def flags(opts):
    return ["--endpoint-url", opts["endpoint_url"], "--region", opts["region_name"], "--path-style"] if opts else []


def test_every_state_a_run_can_end_in_and_a_diff(any_root, capsys):
    root, opts = any_root
    runs = build_history_root(root, opts)

    history = cli(capsys, "history", root, *flags(opts))
    states = {r["run_id"]: r["state"] for r in history["runs"]}
    assert states == {
        runs["gone"]: "deleted", runs["v1"]: "superseded", runs["v2"]: "live", runs["v3"]: "rolled_back",
        runs["staged"]: "staged", "20260107T000000Z-failed00": "failed", "20260108T000000Z-running0": "running",
        "20260109T000000Z-broken00": "unreadable",
    }, history
    assert history["live_run_id"] == runs["v2"]
    by_id = {r["run_id"]: r for r in history["runs"]}
    # Records keep each run's last publish time: v2 was re-published by the rollback, so the run
    # published after v1 is v3 by the records.
    assert by_id[runs["v3"]]["replaced_by"] == runs["v2"] and by_id[runs["v1"]]["replaced_by"] == runs["v3"]
    assert [by_id[runs[n]]["rows"] for n in ("v1", "v2", "v3", "staged")] == [20, 30, 40, 50]
    assert by_id[runs["v2"]]["bytes"] > 0 and by_id[runs["v2"]]["duration_s"] == 1.0
    assert by_id[runs["staged"]]["validation"]["ok"] is True
    assert {c["name"] for c in by_id[runs["staged"]]["validation"]["checks"]} >= {"structure", "min_rows"}
    assert by_id["20260107T000000Z-failed00"]["error"] == "InputDataError: duplicate key 4"
    assert by_id["20260109T000000Z-broken00"]["error"].startswith("RunRecordError: ")
    order = [r["run_id"] for r in history["runs"] if r["state"] != "unreadable"]
    assert order == sorted(order, reverse=True)  # newest start first (run ids here sort by start)

    diff = cli(capsys, "diff", root, runs["v2"], runs["v3"], *flags(opts))
    assert (diff["rows_a"], diff["rows_b"], diff["rows_change"]) == (30, 40, 10) and diff["same_routing"] is True
    assert [s["db_id"] for s in diff["shards"]] == [0, 1, 2]
    assert sum(s["rows_a"] for s in diff["shards"]) == 30 and sum(s["rows_b"] for s in diff["shards"]) == 40
    assert not any(s["same_files"] for s in diff["shards"])
    same = cli(capsys, "diff", root, runs["v2"], runs["v2"], *flags(opts))
    assert all(s["same_files"] for s in same["shards"]) and same["rows_change"] == 0
    assert diff["value_schema"] == {"a": None, "b": None, "changes": None, "summary": "schema not recorded for either run"}

    code = main(["diff", root, runs["v2"], runs["gone"], *flags(opts)])
    _, err = capsys.readouterr()
    assert code == 1 and f"run {runs['gone']!r} has no manifest" in err


def test_an_event_claim_holds_only_if_the_roots_own_record_names_its_manifest(any_root, tmp_path):
    """What the history plugin checks of an asset event of ours before it lists the root (issue 27 item 1)."""
    from airflow_provider_shardyfusion.core.lifecycle.history import run_claim_holds
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.storage import open_store
    from tests.snapshot_factory import build_snapshot

    root, opts = any_root
    a = build_snapshot(root, [(1, b"a")], num_dbs=1, storage_options=opts, run_id="20260101T000000Z-claima00")
    b = build_snapshot(root, [(1, b"b")], num_dbs=1, storage_options=opts, run_id="20260102T000000Z-claimb00")
    snapshots = SnapshotRoot(open_store(root, opts))
    assert run_claim_holds(snapshots, a.run_id, a.manifest_ref) is True
    assert run_claim_holds(snapshots, a.run_id, b.manifest_ref) is False  # another run's manifest
    assert run_claim_holds(snapshots, "20260103T000000Z-norecord", a.manifest_ref) is False
    assert run_claim_holds(snapshots, "../../etc", a.manifest_ref) is False
    elsewhere = a.manifest_ref.replace(root, f"file://{tmp_path}/elsewhere")
    assert run_claim_holds(snapshots, a.run_id, elsewhere) is False


def test_diff_lists_the_schema_changes_between_two_runs(file_root, capsys):
    runs = {name: built.run_id for name, built in build_schema_root(file_root, None).items()}
    schema = cli(capsys, "diff", file_root, runs["v1"], runs["v2"])["value_schema"]
    assert schema["summary"] == "column 'score' changed from int64 to string; column 'city' added (string)"
    assert [(c["column"], c["kind"], c["old"], c["new"]) for c in schema["changes"]] == [
        ("score", "changed", "int64", "string"), ("city", "added", None, "string")]
    assert schema["a"] == [{"name": "name", "type": "string", "nullable": False},
                           {"name": "score", "type": "int64", "nullable": True}]
    back = cli(capsys, "diff", file_root, runs["v2"], runs["v1"])["value_schema"]
    assert back["summary"] == "column 'score' changed from string to int64; column 'city' removed (was string)"
    assert cli(capsys, "diff", file_root, runs["v1"], runs["v1"])["value_schema"]["summary"] == "no schema change"
    old = cli(capsys, "diff", file_root, runs["old"], runs["v2"])["value_schema"]
    assert old["changes"] is None and old["a"] is None and len(old["b"]) == 3
    assert old["summary"] == f"schema not recorded for run {runs['old']!r} (written before value schemas were recorded)"
