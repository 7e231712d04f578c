"""``core.arguments``: one rule for values a template rendered as text, used by every operator."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core.arguments import as_bool, as_duration, as_int, as_list, as_literal, as_number
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.lifecycle.cleanup_plan import check_settings

HINT = r"render_template_as_native_obj=True"


@pytest.mark.parametrize(("value", "read"), [(True, True), ("True", True), (" false ", False), ("FALSE", False)])
def test_bool_and_its_rendering(value, read):
    assert as_bool("dry_run", value) is read


@pytest.mark.parametrize("value", ["yes", "1", 1, None, 0.0])
def test_anything_else_is_not_a_bool(value):
    hint = f".*{HINT}" if isinstance(value, str) else "$"
    with pytest.raises(ConfigError, match=rf"^dry_run {value!r} must be True or False{hint}"):
        as_bool("dry_run", value)


def test_integers_numbers_and_their_rendering():
    assert as_int("keep_runs", "3", minimum=0) == 3 and as_int("keep_runs", 3) == 3
    assert as_number("max_shard_skew", "1.5") == 1.5 and as_number("max_shard_skew", 2) == 2
    with pytest.raises(ConfigError, match=rf"keep_runs '3.5' must be an integer >= 0.*{HINT}"):
        as_int("keep_runs", "3.5", minimum=0)
    with pytest.raises(ConfigError, match=r"keep_runs True must be an integer"):
        as_int("keep_runs", True)
    with pytest.raises(ConfigError, match=r"keep_runs -1 must be an integer >= 0"):
        as_int("keep_runs", "-1", minimum=0)
    for bad in ("nan", "inf", math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"max_shard_skew .* must be a finite number"):
            as_number("max_shard_skew", bad)


@pytest.mark.parametrize(("value", "read"), [
    (timedelta(hours=1), timedelta(hours=1)), (3600, timedelta(hours=1)), ("3600", timedelta(hours=1)),
    ("1:00:00", timedelta(hours=1)), ("1 day, 2:30:00", timedelta(days=1, hours=2, minutes=30)),
    ("0:00:01.500000", timedelta(seconds=1.5)),
])
def test_durations_and_their_rendering(value, read):
    assert as_duration("grace_period", value) == read


@pytest.mark.parametrize("value", ["nan", math.nan, math.inf, "an hour", -5, timedelta(seconds=-1), -1e300,
                                   "1000000000 days, 0:00:00", "1" * 400 + ":00:00"])  # no timedelta renders so
def test_bad_durations_name_the_argument(value):
    with pytest.raises(ConfigError, match=r"^grace_period "):
        as_duration("grace_period", value)


@pytest.mark.parametrize("value", [1e300, "1e300", 10**400, timedelta.max, "999999999 days, 0:00:00",
                                   1e20, "1" * 400])
def test_durations_too_long_for_a_clock_are_a_config_error_not_an_overflow(value):
    # timedelta(seconds=1e300) raises OverflowError, and so does now - timedelta.max.
    with pytest.raises(ConfigError, match=r"^grace_period .* must be at most 36500 days \(100 years\)"):
        as_duration("grace_period", value)


def test_the_longest_duration_still_plans_a_cleanup(tmp_path):
    from airflow_provider_shardyfusion.core.arguments import MAX_DURATION
    from airflow_provider_shardyfusion.core.lifecycle.cleanup import make_plan
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

    assert as_duration("grace_period", MAX_DURATION.total_seconds()) == MAX_DURATION
    plan = make_plan(SnapshotRoot.open(f"file://{tmp_path}/snap"), keep_runs=1, grace_period=MAX_DURATION)
    assert plan.grace_period == MAX_DURATION and plan.items == ()


def test_lists_and_their_rendering():
    assert as_list("expected_keys", "[1, 2, 3]") == [1, 2, 3]
    assert as_list("expected_keys", "('a', 'b')") == ["a", "b"]
    assert as_list("expected_keys", (1,)) == [1]
    for bad in ("'a'", "{1: 2}", "[1,", 7):
        with pytest.raises(ConfigError, match=r"expected_keys .* must be a list"):
            as_list("expected_keys", bad)


def test_literals_of_several_shapes_and_their_rendering():
    shapes = (int, dict)
    assert as_literal("shard_retry", "3", shapes, "an integer or a mapping") == 3
    assert as_literal("shard_retry", "{'max_retries': 1}", shapes, "an integer or a mapping") == {"max_retries": 1}
    assert as_literal("shard_retry", 5, shapes, "an integer or a mapping") == 5
    for bad in ("True", True, "[1]", "{1:", 2.5):
        with pytest.raises(ConfigError, match=r"^shard_retry .* must be an integer or a mapping"):
            as_literal("shard_retry", bad, shapes, "an integer or a mapping")


def test_cleanup_settings_follow_the_rule():
    assert check_settings("2", "1:00:00", "['run-a', 'run-b']") == (2, timedelta(hours=1), ("run-a", "run-b"))
    assert check_settings(2, 60, "run-a") == (2, timedelta(minutes=1), ("run-a",))
    with pytest.raises(ConfigError, match=r"grace_period nan must be a timedelta or a number of seconds"):
        check_settings(1, float("nan"), ())


def test_the_cli_names_a_nan_grace_period_and_a_broken_endpoint(tmp_path, capsys):
    from airflow_provider_shardyfusion.cli import main

    root = f"file://{tmp_path}/snap"
    assert main(["cleanup", root, "--grace-period-seconds", "nan"]) == 1
    assert "ConfigError: --grace-period-seconds nan must be a timedelta or a number of seconds" in capsys.readouterr().err
    assert main(["validate", "s3://bucket/x", "--endpoint-url", "http://[::1"]) == 1
    assert "storage_options.endpoint_url 'http://[::1' is not a valid URL" in capsys.readouterr().err


@pytest.mark.parametrize(("seconds", "message"), [
    ("1e20", "--grace-period-seconds 1e+20 must be at most 36500 days (100 years)"),
    ("inf", "--grace-period-seconds inf must be a timedelta or a number of seconds"),
    ("-5", "--grace-period-seconds -5.0 must be a timedelta (or seconds) >= 0"),
])
def test_the_cli_names_a_grace_period_out_of_range(tmp_path, capsys, seconds, message):
    from airflow_provider_shardyfusion.cli import main

    assert main(["cleanup", f"file://{tmp_path}/snap", f"--grace-period-seconds={seconds}"]) == 1
    assert capsys.readouterr().err == f"shardyfusion: error: ConfigError: {message}\n"


def test_the_cleanup_operator_names_a_grace_period_too_long(tmp_path):
    from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator

    op = DeferredCleanupOperator(task_id="c", output_uri=f"file://{tmp_path}/snap", grace_period=1e300)
    with pytest.raises(ConfigError, match=r"^DeferredCleanupOperator 'c': grace_period 1e\+300 must be at most 36500 "):
        op.execute({})
