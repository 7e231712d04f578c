"""The pure parts of snapshot validation: thresholds, sample keys, key coercion, limits, report; the operator shell."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError
from airflow_provider_shardyfusion.core.lifecycle.validation import (
    Check,
    Lookup,
    ValidationReport,
    _limit,
    sample_keys,
    schema_change_check,
    schema_change_policy,
    threshold_checks,
    value_digest,
)
from airflow_provider_shardyfusion.core.model.encoding import encode_key, key_from_text
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardingInfo
from tests.value_schemas import leaf_schema

ROOT = "file:///data/snap"
RUN = "20250101T000000Z-abcdef01"


def _manifest(rows_by_shard: dict[int, int], *, num_dbs: int = 4, key_encoding: str = "u64be",
              keys: dict[int, tuple[object, object]] | None = None) -> Manifest:
    shards = []
    for db_id, rows in sorted(rows_by_shard.items()):
        lo, hi = (keys or {}).get(db_id, (db_id * 100, db_id * 100 + max(rows - 1, 0)))
        shards.append(ShardEntry(
            db_id=db_id, db_url=layout.join(ROOT, layout.attempt_key(RUN, db_id, 0, 1)), attempt=0, task_attempt_id=1,
            row_count=rows, byte_size=rows * 10, min_key=encode_key(lo, key_encoding).hex(),
            max_key=encode_key(hi, key_encoding).hex(),
        ))
    return Manifest(
        run_id=RUN, created_at=datetime(2025, 1, 1, tzinfo=UTC), output_uri=ROOT, num_dbs=num_dbs,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding=key_encoding, value_format="binary",
        shards=tuple(shards),
    ).validate()


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_only_the_thresholds_asked_for_are_checked():
    assert threshold_checks(_manifest({0: 5})) == []


def test_min_rows_boundary():
    m = _manifest({0: 60, 1: 40})
    assert _by_name(threshold_checks(m, min_rows=100))["min_rows"].ok
    failed = _by_name(threshold_checks(m, min_rows=101))["min_rows"]
    assert not failed.ok and failed.figure == 100 and failed.problems == (f"run {RUN!r}: 100 rows, fewer than min_rows 101",)


def test_row_change_ratio_against_the_baseline():
    m = _manifest({0: 60, 1: 60})  # 120 rows
    ok = _by_name(threshold_checks(m, baseline_rows=100, baseline_note="live run 'x'", max_row_change_ratio=0.2))
    assert ok["max_row_change_ratio"].ok and ok["max_row_change_ratio"].figure == pytest.approx(0.2)
    shrink = _by_name(threshold_checks(_manifest({0: 50}), baseline_rows=100, max_row_change_ratio=0.2))
    check = shrink["max_row_change_ratio"]
    assert not check.ok and check.figure == pytest.approx(0.5)
    assert "row change ratio 0.5000 exceeds max_row_change_ratio 0.2" in check.problems[0]


@pytest.mark.parametrize(("baseline", "note", "expect"), [
    (None, "", "no baseline snapshot"),
    (None, "no live snapshot and no older succeeded run to compare with", "no live snapshot"),
    (0, "live run 'x'", "0 rows: the ratio is undefined"),
])
def test_row_change_ratio_without_a_usable_baseline_is_skipped_with_a_note(baseline, note, expect):
    check = threshold_checks(_manifest({0: 5}), baseline_rows=baseline, baseline_note=note,
                             max_row_change_ratio=0.1)[0]
    assert check.ok and check.skipped and expect in check.detail and check.figure is None


def test_empty_shards_count_absent_and_zero_row_shards():
    m = _manifest({0: 10, 2: 0}, num_dbs=5)  # shards 1, 3, 4 absent; shard 2 listed with 0 rows
    check = _by_name(threshold_checks(m, max_empty_shards=3))["max_empty_shards"]
    assert not check.ok and check.figure == 4
    assert check.problems == (f"run {RUN!r}: 4 of 5 shards are empty, more than max_empty_shards 3",)
    assert _by_name(threshold_checks(m, max_empty_shards=4))["max_empty_shards"].ok


def test_shard_skew_is_largest_over_mean_across_num_dbs():
    m = _manifest({0: 10, 1: 30}, num_dbs=4)  # mean 40 / 4 = 10, largest 30
    check = _by_name(threshold_checks(m, max_shard_skew=2.5))["max_shard_skew"]
    assert not check.ok and check.figure == pytest.approx(3.0) and "largest shard 1 has 30 rows" in check.detail
    assert _by_name(threshold_checks(m, max_shard_skew=3))["max_shard_skew"].ok
    empty = threshold_checks(_manifest({}, num_dbs=4), max_shard_skew=1)[0]
    assert empty.ok and empty.skipped


@pytest.mark.parametrize(("encoding", "lo", "hi"), [
    ("u64be", 3, 2**63 - 1), ("u32be", 0, 2**32 - 1), ("utf8", "apple", "zürich"), ("raw", b"\x00", b"\xff\xfe"),
])
def test_sample_keys_decode_min_and_max_keys(encoding, lo, hi):
    m = _manifest({0: 2, 1: 2}, num_dbs=2, key_encoding=encoding, keys={0: (lo, hi), 1: (hi, hi)})
    # min keys of every shard first, then max keys; a shard whose min == max is sampled once
    assert sample_keys(m, 10) == [(0, lo), (1, hi), (0, hi)]
    assert sample_keys(m, 2) == [(0, lo), (1, hi)]
    assert sample_keys(m, 0) == []


def test_a_key_that_does_not_decode_is_a_manifest_problem():
    m = _manifest({0: 2}, num_dbs=2, key_encoding="u64be")
    bad = Manifest.from_dict({**m.to_dict(), "shards": [{**m.shards[0].to_dict(), "min_key": "0102"}]})
    with pytest.raises(ManifestValidationError, match=r"shard 0 .* min_key '0102' does not decode as u64be"):
        sample_keys(bad, 1)


def test_expected_keys_from_templates_become_the_key_type():
    assert key_from_text("42", "u64be") == 42 and key_from_text("x", "u32be") == "x"
    assert key_from_text("ab", "raw") == b"ab" and key_from_text("ab", "utf8") == "ab"


def test_limits_accept_numbers_and_numeric_text_only():
    assert _limit("min_rows", None, integer=True) is None
    assert _limit("min_rows", "10", integer=True) == 10 and _limit("max_shard_skew", "1.5", integer=False) == 1.5
    for bad, integer in ((-1, True), (1.5, True), (True, True), ("ten", True), (float("nan"), False), ([1], False)):
        with pytest.raises(ConfigError):
            _limit("x", bad, integer=integer)


def test_report_is_json_and_lists_failures_of_failed_checks_only():
    report = ValidationReport(
        output_uri=ROOT, run_id=RUN, manifest_ref=None, live=False, num_dbs=2, rows=3,
        checks=(Check("structure", True, figure={"num_dbs": 2}),
                Check("min_rows", False, figure=3, limit=5, problems=("too few",)),
                Check("max_row_change_ratio", True, skipped=True, detail="no baseline")),
        lookups=(Lookup({"hex": "00"}, "sample", 0, True, value_digest(b"v", "binary")),),
    )
    assert not report.ok and report.failures == ["too few"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["checks"][1] == {"name": "min_rows", "ok": False, "skipped": False, "figure": 3, "limit": 5,
                                 "detail": "", "problems": ["too few"]}
    assert data["lookups"][0]["key"] == {"hex": "00"} and data["lookups_total"] == 1
    assert report.check("structure").describe() == "structure: ok; figure {'num_dbs': 2}"
    assert value_digest({"b": 1, "a": [1]}, "json") == value_digest({"a": [1], "b": 1}, "json")


def test_operator_keeps_templated_arguments_verbatim_and_checks_them_in_execute():
    from airflow_provider_shardyfusion.operators.validate import ValidateManifestOperator

    op = ValidateManifestOperator(task_id="v", output_uri="{{ var.value.root }}", run_id="{{ ti.xcom_pull('w')['run_id'] }}",
                                  min_rows="{{ params.min_rows }}", expected_keys="{{ params.keys }}")
    assert op.output_uri == "{{ var.value.root }}" and op.min_rows == "{{ params.min_rows }}"
    assert set(op.template_fields) == {
        "output_uri", "run_id", "manifest_ref", "min_rows", "max_row_change_ratio", "max_empty_shards",
        "max_shard_skew", "sample_lookups", "expected_keys", "verify_checksums", "max_delta_ratio", "absent_keys",
        "schema_change", "aws_conn_id"}
    bad = ValidateManifestOperator(task_id="b", output_uri="file:///tmp/nowhere", min_rows=-3)
    with pytest.raises(ConfigError, match="min_rows -3 must be an integer >= 0"):
        bad.execute({})
    assert ValidateManifestOperator(task_id="s", output_uri="x", schema_change="{{ params.s }}").schema_change == "{{ params.s }}"
    bad = ValidateManifestOperator(task_id="s", output_uri="file:///tmp/nowhere", schema_change="additive")
    with pytest.raises(ConfigError, match=r"schema_change 'additive' must be one of \['additions', 'none', 'any'\]"):
        bad.execute({})


def test_importing_the_operator_is_light():
    code = ("import sys; import airflow_provider_shardyfusion.operators.validate; "
            "print(sorted(m for m in ('pyspark', 'rocksdict', 'boto3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


LIVE = "20241231T000000Z-11111111"


def _with_schema(m: Manifest, columns: dict[str, str] | None, run_id: str = RUN, not_null: tuple[str, ...] = ()) -> Manifest:
    schema = leaf_schema(columns, not_null) if columns is not None else None
    return dataclasses.replace(m, run_id=run_id, value_schema=schema)


def test_schema_policies_and_their_rendered_text():
    assert [schema_change_policy(v) for v in ("additions", " none ", "any")] == ["additions", "none", "any"]
    for bad in ("", "None", None, 1, "all"):
        with pytest.raises(ConfigError, match=r"must be one of \['additions', 'none', 'any'\]"):
            schema_change_policy(bad)


def test_a_nullable_addition_passes_by_default_and_is_reported():
    m = _manifest({0: 5})
    live = _with_schema(m, {"name": "string"}, LIVE)
    run = _with_schema(m, {"name": "string", "city": "string"})
    check = schema_change_check(run, live)
    assert check.ok and not check.skipped and check.limit == "additions" and check.problems == ()
    assert check.figure == [{"column": "city", "kind": "added", "old": None, "new": "string", "nullable": True}]
    assert check.detail == f"against live run {LIVE!r}: column 'city' added (string)"
    same = schema_change_check(_with_schema(m, {"name": "string"}), live, "none")
    assert same.ok and same.figure == [] and same.detail == f"no change against live run {LIVE!r}"


def test_each_refused_change_is_a_problem_naming_the_column_and_both_types():
    m = _manifest({0: 5})
    live = _with_schema(m, {"name": "string", "score": "int64", "gone": "date"}, LIVE)
    run = _with_schema(m, {"name": "string", "score": "string", "city": "string", "rank": "int32"}, not_null=("rank",))
    check = schema_change_check(run, live)
    assert not check.ok and [c["column"] for c in check.figure] == ["score", "city", "rank", "gone"]
    where = f"run {RUN!r}: value schema against live run {LIVE!r}"
    rule = "(schema_change='additions' allows only added nullable columns)"
    assert check.problems == (f"{where}: column 'score' changed from int64 to string {rule}",
                              f"{where}: column 'rank' added (int32, not nullable) {rule}",
                              f"{where}: column 'gone' removed (was date) {rule}")
    anything = schema_change_check(run, live, "any")
    assert anything.ok and anything.figure == check.figure and "column 'score' changed from int64 to string" in anything.detail
    nothing = schema_change_check(_with_schema(m, {"name": "string", "score": "int64", "gone": "date", "city": "string"}),
                                  live, "none")
    assert nothing.problems == (f"{where}: column 'city' added (string) (schema_change='none' allows no change)",)


def test_the_schema_check_is_skipped_without_two_schemas_to_compare():
    m = _manifest({0: 5})
    with_schema, live = _with_schema(m, {"a": "string"}), _with_schema(m, {"a": "int64"}, LIVE)
    for check, why in (
        (schema_change_check(_with_schema(m, None), live), f"run {RUN!r} recorded no value schema"),
        (schema_change_check(with_schema, _with_schema(m, None, LIVE)), f"the live run {LIVE!r} recorded no value schema"),
        (schema_change_check(with_schema, None, "none", no_live="the validated run is the live run"),
         "the validated run is the live run"),
    ):
        assert check.ok and check.skipped and check.figure is None and check.detail.startswith(why), check
