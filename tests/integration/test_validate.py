"""Snapshot validation (SPEC §8) on real storage: the local store and the S3 server, real RocksDB shards."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.cli import main
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.lifecycle.integrity import check_storage
from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot, value_digest
from airflow_provider_shardyfusion.core.model.encoding import encode_key
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RunError
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_delta, build_snapshot
from tests.snapshot_helpers import write_run_record
from tests.value_schemas import leaf_schema, with_value_schema


def _value(i: int) -> bytes:
    return f"value-{i}-".encode() * 3


def _live_and_staged(root, opts, *, live_rows=400, staged_rows=380, num_dbs=4):
    live = build_snapshot(root, [(i, b"old-%d" % i) for i in range(live_rows)], num_dbs=num_dbs, storage_options=opts)
    staged = build_snapshot(root, [(i, _value(i)) for i in range(staged_rows)], num_dbs=num_dbs, storage_options=opts,
                            publish=False, published_at=live.published_at + timedelta(seconds=1))
    return live, staged


def _file_key(store, shard, index):
    return layout.join(store.key_of(shard.db_url), shard.files[index].name)


def test_a_good_staged_snapshot_passes_with_its_figures(any_root):
    root, opts = any_root
    live, staged = _live_and_staged(root, opts)
    snapshots = SnapshotRoot.open(root, opts)
    expected = [0, 7, 379]
    report = validate_snapshot(
        snapshots, run_id=staged.run_id, min_rows=300, max_row_change_ratio=0.1, max_empty_shards=0,
        max_shard_skew=1.5, sample_lookups=8, expected_keys=expected, verify_checksums=True, storage_options=opts,
    )
    assert report.ok and report.failures == []
    assert report.run_id == staged.run_id and report.manifest_ref == staged.manifest_ref and not report.live
    assert report.rows == 380 and report.num_dbs == 4
    by_name = {c.name: c for c in report.checks}
    assert list(by_name) == ["structure", "storage", "run_record", "min_rows", "max_row_change_ratio",
                             "max_empty_shards", "max_shard_skew", "schema_change", "lookups"]
    assert all(c.ok and not c.skipped for c in report.checks if c.name != "schema_change")
    # Neither manifest records a value schema (as before SPEC §18): said so, not failed.
    assert by_name["schema_change"].skipped and "recorded no value schema" in by_name["schema_change"].detail
    assert by_name["structure"].figure == {"format_version": 1, "num_dbs": 4, "shards": 4}
    m = staged.manifest
    assert by_name["storage"].figure == {"shards": 4, "files": sum(len(s.files) for s in m.shards),
                                         "bytes": m.byte_size}
    assert by_name["run_record"].figure == "succeeded"
    assert by_name["min_rows"].figure == 380 and by_name["min_rows"].limit == 300
    # baseline: the live snapshot (400 rows), since another run is validated
    assert by_name["max_row_change_ratio"].figure == pytest.approx(20 / 400)
    assert f"live run {live.run_id!r}" in by_name["max_row_change_ratio"].detail
    assert by_name["max_empty_shards"].figure == 0
    largest = max(s.row_count for s in m.shards)
    assert by_name["max_shard_skew"].figure == pytest.approx(largest / (380 / 4), abs=1e-6)
    assert by_name["lookups"].figure == {"sampled": 8, "expected": 3, "absent": 0, "found": 11, "missing_expected": 0}
    # the report is JSON (an XCom) as it is
    assert json.loads(json.dumps(report.to_dict()))["checks"][0]["name"] == "structure"


def test_five_problems_make_one_error_naming_all_of_them(any_root):
    root, opts = any_root
    _live, staged = _live_and_staged(root, opts, live_rows=400, staged_rows=100)
    store = open_store(root, opts)
    shards = sorted(staged.manifest.shards, key=lambda s: s.db_id)
    missing_key = _file_key(store, shards[0], 0)
    resized_key = _file_key(store, shards[1], -1)
    assert store.delete_many([missing_key]) == []
    store.put(resized_key, b"not the shard file")
    write_run_record(store, staged.run_id, FAILED, manifest_ref=staged.manifest_ref,
                     error=RunError(type="ShardWriteError", message="shard 3 failed on executor 2"))

    with pytest.raises(ManifestValidationError) as caught:
        validate_snapshot(SnapshotRoot.open(root, opts), run_id=staged.run_id, min_rows=200,
                          max_row_change_ratio=0.5, storage_options=opts)
    message = str(caught.value)
    failures = caught.value.failures
    assert len(failures) == 5, failures
    assert "failed with 5 problem(s)" in message
    assert f"file {store.uri(missing_key)} is missing (manifest records {shards[0].files[0].size} bytes)" in message
    assert (f"file {store.uri(resized_key)} has {len(b'not the shard file')} bytes on storage, the manifest "
            f"records {shards[1].files[-1].size}") in message
    assert "status is 'failed', not 'succeeded' (ShardWriteError: shard 3 failed on executor 2)" in message
    assert "100 rows, fewer than min_rows 200" in message
    assert "row change ratio 0.7500 exceeds max_row_change_ratio 0.5" in message
    report = caught.value.report
    assert {c.name: c.ok for c in report.checks} == {
        "structure": True, "storage": False, "run_record": False, "min_rows": False, "max_row_change_ratio": False,
        "schema_change": True,
    }


def test_sample_and_expected_lookups_read_the_exact_values(any_root):
    root, opts = any_root
    rows = {f"user-{i:03d}": {"name": f"n{i}", "score": i} for i in range(120)}
    built = build_snapshot(root, list(rows.items()), num_dbs=5, storage_options=opts, value_format="json")
    report = validate_snapshot(SnapshotRoot.open(root, opts), sample_lookups=10,
                               expected_keys=["user-000", "user-119"], storage_options=opts)
    assert report.live and report.run_id == built.run_id
    # the sampled keys are exactly every shard's smallest and largest stored key
    by_shard: dict[int, list[bytes]] = {}
    for key in rows:
        by_shard.setdefault(route_key(key, 5), []).append(encode_key(key, "utf8"))
    ends = {(db, min(keys).decode()) for db, keys in by_shard.items()} | {
        (db, max(keys).decode()) for db, keys in by_shard.items()}
    samples = [lk for lk in report.lookups if lk.source == "sample"]
    assert {(lk.db_id, lk.key) for lk in samples} == ends and len(samples) == 10
    for lk in report.lookups:
        assert lk.found and lk.value_digest == value_digest(rows[lk.key], "json")
    assert [lk.key for lk in report.lookups if lk.source == "expected"] == ["user-000", "user-119"]


def test_expected_keys_read_exact_binary_values_and_text_becomes_int(file_root):
    build_snapshot(file_root, [(i * 3, _value(i)) for i in range(50)], num_dbs=3)
    report = validate_snapshot(SnapshotRoot.open(file_root), expected_keys=[0, "3", 147])
    got = {lk.key: lk.value_digest for lk in report.lookups}
    assert got == {0: value_digest(_value(0), "binary"), 3: value_digest(_value(1), "binary"),
                   147: value_digest(_value(49), "binary")}


def test_the_lookup_summary_counts_absent_keys_as_expected(file_root):
    build_snapshot(file_root, [(i, _value(i)) for i in range(30)], num_dbs=3)
    report = validate_snapshot(SnapshotRoot.open(file_root), expected_keys=[1, 2], absent_keys=[500, 501])
    assert report.check("lookups").detail.startswith("4 of 4 as expected (2 present, 2 absent)")


def test_a_missing_expected_key_fails(any_root):
    root, opts = any_root
    build_snapshot(root, [(i, _value(i)) for i in range(30)], num_dbs=3, storage_options=opts)
    with pytest.raises(ManifestValidationError, match=r"2 of 3 expected keys are missing: 1000, 31") as caught:
        validate_snapshot(SnapshotRoot.open(root, opts), expected_keys=[5, 1000, 31], storage_options=opts)
    assert caught.value.failures == [f"run {caught.value.report.run_id!r}: 2 of 3 expected keys are missing: 1000, 31"]
    found = {lk.key: lk.found for lk in caught.value.report.lookups}
    assert found == {5: True, 1000: False, 31: False}


def test_checksums_are_checked_only_on_request(any_root):
    root, opts = any_root
    built = build_snapshot(root, [(i, _value(i)) for i in range(60)], num_dbs=2, storage_options=opts)
    store = open_store(root, opts)
    shard = built.manifest.shards[0]
    sst = next(i for i, f in enumerate(shard.files) if f.name.endswith(".sst"))
    key = _file_key(store, shard, sst)
    data = store.get(key).data
    store.put(key, bytes([data[0] ^ 0xFF]) + data[1:])  # same size, other bytes
    snapshots = SnapshotRoot.open(root, opts)
    assert check_storage(snapshots, built.manifest) == []
    problems = check_storage(snapshots, built.manifest, verify_checksums=True)
    assert len(problems) == 1 and store.uri(key) in problems[0] and "checksum" in problems[0]
    assert validate_snapshot(snapshots).ok  # presence and sizes only
    with pytest.raises(ManifestValidationError, match="does not match the manifest's xxh3_128"):
        validate_snapshot(snapshots, verify_checksums=True)


def test_the_live_snapshot_is_compared_with_the_newest_older_succeeded_run(file_root):
    first = build_snapshot(file_root, [(i, b"a") for i in range(100)], num_dbs=2)
    second = build_snapshot(file_root, [(i, b"b") for i in range(200)], num_dbs=2, publish=False,
                            published_at=first.published_at + timedelta(seconds=1))
    failed = build_snapshot(file_root, [(i, b"c") for i in range(10)], num_dbs=2, publish=False,
                            published_at=first.published_at + timedelta(seconds=2))
    store = open_store(file_root)
    write_run_record(store, failed.run_id, FAILED, error=RunError(type="ShardWriteError", message="x"),
                     now=first.published_at + timedelta(seconds=2))
    live = build_snapshot(file_root, [(i, b"d") for i in range(210)], num_dbs=2,
                          published_at=first.published_at + timedelta(seconds=3))
    report = validate_snapshot(SnapshotRoot.open(file_root), max_row_change_ratio=0.1)
    assert report.live and report.run_id == live.run_id
    check = report.check("max_row_change_ratio")
    assert check.figure == pytest.approx(10 / 200) and f"older succeeded run {second.run_id!r}" in check.detail


def test_no_baseline_skips_the_ratio_with_a_note(file_root):
    build_snapshot(file_root, [(1, b"x")], num_dbs=2)
    check = validate_snapshot(SnapshotRoot.open(file_root), max_row_change_ratio=0.1).check("max_row_change_ratio")
    assert check.ok and check.skipped and "no live snapshot and no older succeeded run" in check.detail


def test_nothing_to_validate(file_root):
    with pytest.raises(ManifestValidationError, match="no snapshot is published"):
        validate_snapshot(SnapshotRoot.open(file_root))
    build_snapshot(file_root, [(1, b"x")], num_dbs=2)
    with pytest.raises(ManifestValidationError, match="has no manifest"):
        validate_snapshot(SnapshotRoot.open(file_root), run_id="20200101T000000Z-deadbeef")


def test_cli_validate_prints_the_report_or_every_failure(file_root, capsys):
    _live, staged = _live_and_staged(file_root, None, live_rows=100, staged_rows=90)
    code = main(["validate", file_root, "--run-id", staged.run_id, "--min-rows", "50", "--sample-lookups", "4",
                 "--expected-key", "89", "--verify-checksums"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["ok"] and report["run_id"] == staged.run_id and report["rows"] == 90
    assert {lk["key"]: lk["value_digest"] for lk in report["lookups"]}[89] == value_digest(_value(89), "binary")

    code = main(["validate", file_root, "--run-id", staged.run_id, "--min-rows", "95", "--max-row-change-ratio",
                 "0.05", "--expected-key", "500"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("shardyfusion: error: ManifestValidationError: validation of run")
    assert "90 rows, fewer than min_rows 95" in err and "row change ratio 0.1000" in err
    assert "1 of 1 expected keys are missing: 500" in err and len(err.strip().splitlines()) == 1


def test_operator_returns_the_report(file_root):
    from airflow_provider_shardyfusion.operators.validate import ValidateManifestOperator

    live, staged = _live_and_staged(file_root, None, live_rows=100, staged_rows=100)
    op = ValidateManifestOperator(task_id="validate", output_uri=file_root, run_id=staged.run_id, min_rows=100,
                                  max_row_change_ratio=0.0, max_empty_shards=0, max_shard_skew=2.0,
                                  sample_lookups=4, expected_keys=[42], verify_checksums=True)
    result = op.execute({})
    assert result["ok"] and result["run_id"] == staged.run_id and result["manifest_ref"] == staged.manifest_ref
    assert [c["name"] for c in result["checks"]] == ["structure", "storage", "run_record", "min_rows",
                                                     "max_row_change_ratio", "max_empty_shards", "max_shard_skew",
                                                     "schema_change", "lookups"]
    assert result["checks"][4]["figure"] == 0.0
    assert {lk["key"]: lk["value_digest"] for lk in result["lookups"]}[42] == value_digest(_value(42), "binary")
    json.dumps(result)

    failing = ValidateManifestOperator(task_id="validate_live", output_uri=file_root, min_rows=1000)
    with pytest.raises(ManifestValidationError, match=f"run '{live.run_id}': 100 rows, fewer than min_rows 1000"):
        failing.execute({})


def test_expected_keys_on_a_snapshot_routed_by_other_columns_fail_instead_of_passing_unchecked(tmp_path):
    root = f"file://{tmp_path}/snap"
    build_snapshot(root, [(k, b"v") for k in range(12)], num_dbs=3, run_id="by-region", key_column="id",
                   cel_expr="region", cel_columns={"id": "int", "region": "string"}, routing_values=("eu", "us", "ap"),
                   routing_context=lambda k: {"region": ("eu", "us", "ap")[k % 3]})
    snapshots = SnapshotRoot(open_store(root))
    report = validate_snapshot(snapshots, run_id="by-region", sample_lookups=5)
    assert report.check("lookups").skipped  # sampling cannot route by key alone: reported, not failed
    with pytest.raises(ManifestValidationError, match=r"expected_keys cannot be looked up by key alone.*region"):
        validate_snapshot(snapshots, run_id="by-region", expected_keys=[1, 2])
    with pytest.raises(ManifestValidationError, match=r"absent_keys cannot be looked up by key alone.*region"):
        validate_snapshot(snapshots, run_id="by-region", absent_keys=[99])


# -- value schema against the live run's (SPEC §18) ----------------------------------------------------

LIVE_SCHEMA = {"name": "string", "score": "int64"}


def _schemas(root, opts, staged_columns, *, live_columns=LIVE_SCHEMA, not_null=()):
    live, staged = _live_and_staged(root, opts, live_rows=100, staged_rows=100, num_dbs=2)
    live = with_value_schema(live, leaf_schema(live_columns), opts) if live_columns is not None else live
    staged = with_value_schema(staged, leaf_schema(staged_columns, not_null), opts) if staged_columns is not None else staged
    return live, staged


def test_an_added_nullable_column_passes_by_default_and_is_recorded(any_root):
    root, opts = any_root
    live, staged = _schemas(root, opts, {**LIVE_SCHEMA, "city": "string"})
    snapshots = SnapshotRoot.open(root, opts)
    check = validate_snapshot(snapshots, run_id=staged.run_id, storage_options=opts).check("schema_change")
    added = {"column": "city", "kind": "added", "old": None, "new": "string", "nullable": True}
    assert check.ok and not check.skipped and check.limit == "additions" and check.figure == [added]
    assert check.detail == f"against live run {live.run_id!r}: column 'city' added (string)"
    # The run record keeps the check with its figure, for the history UI and audits.
    stored = {c["name"]: c for c in snapshots.read_run(staged.run_id).validation["checks"]}
    assert stored["schema_change"] == {"name": "schema_change", "ok": True, "skipped": False, "figure": [added],
                                       "limit": "additions"}


def test_a_changed_type_fails_naming_the_column_and_both_types(any_root):
    root, opts = any_root
    live, staged = _schemas(root, opts, {"name": "string", "score": "string", "city": "string", "rank": "int32"},
                            not_null=("rank",))
    snapshots = SnapshotRoot.open(root, opts)
    with pytest.raises(ManifestValidationError) as caught:
        validate_snapshot(snapshots, run_id=staged.run_id, min_rows=1, storage_options=opts)
    where = f"run {staged.run_id!r}: value schema against live run {live.run_id!r}"
    rule = "(schema_change='additions' allows only added nullable columns)"
    # One error listing each refused change; the nullable addition passes and is not listed.
    assert caught.value.failures == [f"{where}: column 'score' changed from int64 to string {rule}",
                                     f"{where}: column 'rank' added (int32, not nullable) {rule}"]
    assert "failed with 2 problem(s)" in str(caught.value)
    assert [c["column"] for c in caught.value.report.check("schema_change").figure] == ["score", "city", "rank"]
    assert snapshots.read_run(staged.run_id).validation["ok"] is False

    # "any" lets every change through, and still reports it.
    check = validate_snapshot(snapshots, run_id=staged.run_id, schema_change="any", storage_options=opts).check("schema_change")
    assert check.ok and check.limit == "any" and [c["kind"] for c in check.figure] == ["changed", "added", "added"]
    assert "column 'score' changed from int64 to string" in check.detail


def test_none_refuses_even_a_nullable_addition(file_root):
    _live, staged = _schemas(file_root, None, {**LIVE_SCHEMA, "city": "string"})
    refused = r"column 'city' added \(string\) \(schema_change='none' allows no change\)"
    with pytest.raises(ManifestValidationError, match=refused):
        validate_snapshot(SnapshotRoot.open(file_root), run_id=staged.run_id, schema_change="none")
    # The same schema passes "none".
    same = _schemas(f"{file_root}-same", None, LIVE_SCHEMA)[1]
    assert validate_snapshot(SnapshotRoot.open(f"{file_root}-same"), run_id=same.run_id,
                             schema_change="none").check("schema_change").figure == []


@pytest.mark.parametrize(("live_columns", "staged_columns", "why"), [
    (None, LIVE_SCHEMA, "the live run {live!r} recorded no value schema"),
    (LIVE_SCHEMA, None, "run {staged!r} recorded no value schema"),
])
def test_manifests_without_a_schema_skip_the_check(file_root, live_columns, staged_columns, why):
    live, staged = _schemas(file_root, None, staged_columns, live_columns=live_columns)
    check = validate_snapshot(SnapshotRoot.open(file_root), run_id=staged.run_id, schema_change="none").check("schema_change")
    assert check.ok and check.skipped and check.detail.startswith(why.format(live=live.run_id, staged=staged.run_id))


def test_the_live_run_itself_and_a_root_with_nothing_live_skip_the_check(file_root):
    _schemas(file_root, None, {"other": "bool"})
    check = validate_snapshot(SnapshotRoot.open(file_root), schema_change="none").check("schema_change")
    assert check.skipped and check.detail == "the validated run is the live run"
    root = f"{file_root}-unpublished"
    staged = with_value_schema(build_snapshot(root, [(1, b"x")], num_dbs=2, publish=False), leaf_schema(LIVE_SCHEMA), None)
    check = validate_snapshot(SnapshotRoot.open(root), run_id=staged.run_id, schema_change="none").check("schema_change")
    assert check.skipped and check.detail == "no live run to compare with"


def test_cli_takes_schema_change(file_root, capsys):
    _live, staged = _schemas(file_root, None, {"name": "string", "score": "double"})
    code = main(["validate", file_root, "--run-id", staged.run_id])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and "column 'score' changed from int64 to double" in err
    code = main(["validate", file_root, "--run-id", staged.run_id, "--schema-change", "any"])
    out, err = capsys.readouterr()
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 0 and checks["schema_change"]["ok"] and checks["schema_change"]["figure"][0]["new"] == "double"
    code = main(["validate", file_root, "--run-id", staged.run_id, "--schema-change", "some"])
    out, err = capsys.readouterr()
    assert code == 1 and "invalid choice: 'some' (choose from" in err and "'additions', 'none', 'any'" in err


# Not with capsys: the task logger would keep writing to capsys's stream after the test closed it.
def test_operator_takes_schema_change(file_root):
    from airflow_provider_shardyfusion.operators.validate import ValidateManifestOperator

    _live, staged = _schemas(file_root, None, {"name": "string", "score": "double"})
    op = ValidateManifestOperator(task_id="v", output_uri=file_root, run_id=staged.run_id, schema_change="any")
    assert op.execute({})["checks"][-1]["figure"][0]["column"] == "score"
    with pytest.raises(ManifestValidationError, match="column 'score' changed from int64 to double"):
        ValidateManifestOperator(task_id="v", output_uri=file_root, run_id=staged.run_id).execute({})


def test_a_delta_counts_the_files_of_every_layer(file_root):
    # A delta's shards are read from its base's layer and its own: storage checks (and counts) both.
    base = build_snapshot(file_root, [(i, b"v0") for i in range(40)], num_dbs=4, shard_layout="sst", run_id="t0")
    delta = build_delta(file_root, {i: b"v1" for i in range(40)}, run_id="t1")  # every shard changes
    base_files = sum(len(s.files) for s in base.manifest.shards)
    own_files = sum(len(layer.files) for s in delta.manifest.shards for layer in s.layers if layer.run_id == "t1")
    assert base_files == 4 and own_files == 4
    figure = validate_snapshot(SnapshotRoot(open_store(file_root)), run_id="t1").check("storage").figure
    assert figure == {"shards": 4, "files": base_files + own_files, "bytes": delta.manifest.byte_size}
