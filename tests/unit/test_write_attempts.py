"""The write operator's decisions as pure functions (core.lifecycle.write_attempts): retries, ownership,
what a submission left, how long to wait (issue 11)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    InputDataError,
    RunRecordError,
    ShardyfusionError,
    SparkConnectError,
    SparkSubmitError,
)
from airflow_provider_shardyfusion.core.lifecycle.write_attempts import (
    DEFAULT_DEFERRAL_TIMEOUT,
    abandon_reason,
    candidate_run_ids,
    choose_run,
    connect_launcher,
    resolve_deferral_timeout,
    retry_run_id,
    short_submit_error,
    submission_outcome,
)
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunError, RunRecord

NOW = layout.utc_now()
ROOT = "file:///data/snap"
TI = {"dag_id": "d", "task_id": "write", "run_id": "manual__1", "map_index": -1}


def me(try_number):
    return {**TI, "try_number": try_number}


def record(run_id, status, *, by=None, lease_left=timedelta(minutes=5), error=None, stats=None):
    return RunRecord(
        run_id=run_id, status=status, started_at=NOW - timedelta(minutes=10), updated_at=NOW,
        lease_expires_at=NOW + lease_left, output_uri=ROOT,
        finished_at=NOW if status != RUNNING else None,
        manifest_ref=f"{ROOT}/manifests/x_run_id={run_id}/manifest.json" if status == SUCCEEDED else None,
        error=error or (RunError("InputDataError", "null key in column 'id'") if status == FAILED else None),
        writer={"airflow": by} if by is not None else {}, stats=stats or {},
    ).validate()


# ---- choose_run ------------------------------------------------------------------------------------


def test_candidate_ids_of_a_try():
    assert candidate_run_ids("daily", 1) == ("daily",)
    assert candidate_run_ids("daily", 3) == ("daily", "daily-try2", "daily-try3")
    assert retry_run_id("daily", 4) == "daily-try4"


def test_first_try_with_nothing_written_starts_the_given_run_id():
    choice = choose_run("daily", {"daily": None}, me(1), NOW)
    assert (choice.action, choice.run_id) == ("start", "daily")
    # A retry whose earlier try never got as far as a run record also writes the given id.
    assert choose_run("daily", {}, me(3), NOW).run_id == "daily"


def test_retry_after_a_failed_run_starts_a_fresh_deterministic_run():
    records = {"daily": record("daily", FAILED, by=me(1))}
    choice = choose_run("daily", records, me(2), NOW)
    assert (choice.action, choice.run_id) == ("start", "daily-try2")
    assert "failed" in choice.reason


@pytest.mark.parametrize("status", [SUCCEEDED, FAILED])
def test_the_newest_earlier_run_decides(status):
    records = {"daily": record("daily", FAILED, by=me(1)), "daily-try2": record("daily-try2", status, by=me(2))}
    assert choose_run("daily", records, me(3), NOW).run_id == "daily-try3"


def test_retry_reattaches_to_its_still_running_run():
    records = {"daily": record("daily", FAILED, by=me(1)), "daily-try2": record("daily-try2", RUNNING, by=me(2))}
    choice = choose_run("daily", records, me(3), NOW)
    assert (choice.action, choice.run_id) == ("attach", "daily-try2")


def test_an_abandoned_run_is_left_to_its_lease_and_a_fresh_run_starts():
    records = {"daily": record("daily", RUNNING, by=me(1), lease_left=timedelta(seconds=-1))}
    choice = choose_run("daily", records, me(2), NOW)
    assert (choice.action, choice.run_id) == ("start", "daily-try2") and "abandoned" in choice.reason


@pytest.mark.parametrize("owner", [
    {**TI, "dag_id": "other_dag", "try_number": 1},
    {**TI, "run_id": "scheduled__2", "try_number": 1},
    {**TI, "map_index": 3, "try_number": 1},
    None,  # written outside Airflow (CLI)
])
def test_a_run_id_used_by_another_writer_is_refused_and_left_alone(owner):
    records = {"daily": record("daily", RUNNING, by=owner)}
    with pytest.raises(RunRecordError, match=r"run_id 'daily' is already used .* run ids must be unique"):
        choose_run("daily", records, me(1), NOW)


def test_a_fresh_id_that_already_exists_is_refused():
    records = {"daily": record("daily", FAILED, by=me(1)), "daily-try2": record("daily-try2", FAILED, by=me(2))}
    with pytest.raises(RunRecordError, match="'daily-try2' already has a run record"):
        choose_run("daily", records, me(2), NOW)


# ---- submission_outcome / abandon_reason ----------------------------------------------------------------


def outcome(rec, *, try_number=1, **kw):
    return submission_outcome(rec, run_id="r1", output_uri=ROOT, me=me(try_number), **kw)


def abandon(rec, *, try_number=1, cluster_mode=False, submit_error=None):
    return abandon_reason(rec, me(try_number), cluster_mode=cluster_mode, submit_error=submit_error)


def test_success_is_no_failure_and_its_outcome_waits_on_current():
    # What a succeeded run means (live / superseded / not live) is core.lifecycle.run_outcome's (tests/unit/test_run_outcome.py).
    assert outcome(record("r1", SUCCEEDED, by=me(1), stats={"rows": 7, "bytes": 70, "empty_shards": 0})) is None


def test_failure_is_the_writers_own_error():
    got = outcome(record("r1", FAILED, by=me(1)))
    with pytest.raises(InputDataError, match=r"^null key in column 'id'$"):
        raise got.to_exception()


def test_own_running_run_after_client_mode_exit_is_abandoned():
    rec = record("r1", RUNNING, by=me(1))
    got = outcome(rec, submit_error=RuntimeError("boom"))
    assert "spark-submit ended (boom)" in abandon(rec, submit_error=RuntimeError("boom"))
    with pytest.raises(SparkSubmitError, match="still says 'running'"):
        raise got.to_exception()
    assert abandon(rec, cluster_mode=True) is None  # the cluster runs it


def test_a_record_of_another_writer_is_never_our_outcome_nor_marked():
    for status in (RUNNING, SUCCEEDED, FAILED):
        rec = record("r1", status, by={**TI, "dag_id": "other", "try_number": 1})
        got = outcome(rec)
        assert got is not None and abandon(rec) is None
        with pytest.raises(RunRecordError, match=r"belongs to task other\.write"):
            raise got.to_exception()
    # An earlier try of this task is another writer too: its record is not this try's outcome.
    assert abandon(record("r1", RUNNING, by=me(1)), try_number=2) is None


def test_a_connect_job_that_ended_is_named_as_such_not_as_spark_submit():
    # Stopped sooner (SIGTERM, code -15) or lost: no spark-submit ran, and the job's output reaches the error.
    rec, launcher = record("r1", RUNNING, by=me(1)), connect_launcher("sf_spark")
    stopped = RuntimeError("exited with code -15")
    got = outcome(rec, submit_error=stopped, tail="retry 2 of 5\nConnection refused", launcher=launcher)
    with pytest.raises(SparkConnectError) as info:
        raise got.to_exception()
    text = str(info.value)
    assert "the Spark Connect job (connection 'sf_spark') failed: exited with code -15" in text
    assert text.endswith("retry 2 of 5\nConnection refused") and "spark-submit" not in text
    reason = abandon_reason(rec, me(1), cluster_mode=False, submit_error=stopped, launcher=launcher)
    assert reason == "the Spark Connect job (connection 'sf_spark') ended (exited with code -15) while the run was still running"


def test_a_record_without_identity_is_reported_but_never_marked():
    rec = record("r1", RUNNING)
    assert abandon(rec, submit_error=RuntimeError("boom")) is None
    assert outcome(rec, submit_error=RuntimeError("boom")).error_type == "SparkSubmitError"


def test_the_jobs_verdict_line_when_there_is_no_record():
    tail = "INFO x\nshardyfusion job failed: ConfigError: input_format 'x' is odd"
    got = outcome(None, submit_error=RuntimeError("Cannot execute: spark-submit ... Error code is: 2."), tail=tail)
    with pytest.raises(ConfigError, match=r"^input_format 'x' is odd$"):
        raise got.to_exception()


def test_unknown_error_types_keep_their_name():
    got = outcome(record("r1", FAILED, by=me(1), error=RunError("Py4JJavaError", "Java heap space")))
    with pytest.raises(ShardyfusionError, match=r"^Py4JJavaError: Java heap space$"):
        raise got.to_exception()


def test_short_submit_error_keeps_the_exit_code_not_the_command():
    exc = RuntimeError("Cannot execute: spark-submit --conf a=b app.py --config-b64 XYZ. Error code is: 101.\n"
                       "Last spark-submit output:\nnoise")
    assert short_submit_error(exc) == "exit code 101"
    assert short_submit_error(RuntimeError("x" * 600)).endswith("…")


# ---- resolve_deferral_timeout -----------------------------------------------------------------------------


def test_deferral_timeout_resolution():
    assert resolve_deferral_timeout(None, None) == DEFAULT_DEFERRAL_TIMEOUT == timedelta(hours=24)
    assert resolve_deferral_timeout(None, timedelta(hours=2)) == timedelta(hours=2)
    assert resolve_deferral_timeout(90, timedelta(hours=2)) == timedelta(seconds=90)
    assert resolve_deferral_timeout(timedelta(minutes=5), None) == timedelta(minutes=5)
    for bad in (0, -1, True, "1h", timedelta(0)):
        with pytest.raises(ConfigError, match="deferral_timeout"):
            resolve_deferral_timeout(bad, None)
