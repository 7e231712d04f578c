"""The write operator's decisions around its attempts at a run, as pure functions.

- ``choose_run``: which run id a try writes, or which earlier run it re-attaches to (retries of
  a fixed ``run_id`` are idempotent, issue 11).
- ``submission_outcome``: the run record (and what spark-submit said) after a submission → the
  run's failure, or ``None`` when the run succeeded (its outcome then waits on ``_CURRENT``:
  ``core.lifecycle.run_outcome``); ``abandon_reason``: whether this try may mark its run abandoned.
- ``resolve_deferral_timeout``: how long the task may wait on a run record.

Ownership rule: a run belongs to the Airflow try whose identity (dag, task, DAG run, map index,
try number) its run record's ``writer.airflow`` names. The operator marks a run failed only when
that identity is its own: never another task's run that happens to share the run id, and never
an earlier try's run (that run's own lease decides its fate).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, RunRecordError, SparkConnectError, SparkSubmitError
from airflow_provider_shardyfusion.core.lifecycle.run_outcome import RunOutcome
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunRecord
from airflow_provider_shardyfusion.core.write.job_contract import TaskTry, WriterIdentity, parse_failure

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_DEFERRAL_TIMEOUT", "SPARK_SUBMIT", "RunChoice", "abandon_reason", "candidate_run_ids",
    "choose_run", "connect_launcher", "describe_writer", "owned_by_another", "resolve_deferral_timeout",
    "retry_run_id", "same_task_instance", "same_try", "short_submit_error", "submission_outcome", "writer_identity",
]

DEFAULT_DEFERRAL_TIMEOUT = timedelta(hours=24)
_EXIT_CODE_RE = re.compile(r"Error code is: (-?\d+)")
SPARK_SUBMIT = "spark-submit"


def connect_launcher(conn_id: str) -> str:
    """How errors name the job's process with a Spark Connect connection (no spark-submit runs there)."""
    return f"the Spark Connect job (connection {conn_id!r})"


# ---- identity ----------------------------------------------------------------------------------


def writer_identity(record: RunRecord) -> TaskTry | None:
    """The Airflow try that wrote ``record`` (``writer.airflow``), if it says."""
    return WriterIdentity.from_dict(record.writer).airflow


def same_task_instance(ident: TaskTry | None, me: Mapping[str, Any]) -> bool:
    """``me``: this try as the operator records it (``airflow_context``)."""
    return ident is not None and ident.same_task_instance(TaskTry.from_dict(me))


def same_try(ident: TaskTry | None, me: Mapping[str, Any]) -> bool:
    return ident is not None and ident.same_try(TaskTry.from_dict(me))


def owned_by_another(record: RunRecord, me: Mapping[str, Any]) -> bool:
    """The record names a writer (``writer.airflow``) that is not this try: its status is not ours."""
    ident = writer_identity(record)
    return ident is not None and not same_try(ident, me)


def describe_writer(record: RunRecord) -> str:
    ident = writer_identity(record)
    if ident is None:
        return "a writer outside Airflow (its run record names no task)"
    return (f"task {ident.dag_id}.{ident.task_id} of DAG run {ident.run_id!r} "
            f"(map index {ident.map_index}, try {ident.try_number})")


# ---- retries of a fixed run id -----------------------------------------------------------------


def retry_run_id(base_run_id: str, try_number: int) -> str:
    """The run id try ``try_number`` writes when an earlier try's run of ``base_run_id`` ended."""
    return f"{base_run_id}-try{try_number}"


def candidate_run_ids(base_run_id: str, try_number: int) -> tuple[str, ...]:
    """Run ids tries 1..``try_number`` of a fixed ``run_id`` may have written, oldest first."""
    return (base_run_id, *(retry_run_id(base_run_id, n) for n in range(2, max(try_number, 1) + 1)))


@dataclass(frozen=True)
class RunChoice:
    """``start`` a new run with ``run_id``, or ``attach`` to the still-running ``run_id``."""

    action: Literal["start", "attach"]
    run_id: str
    reason: str


def choose_run(base_run_id: str, records: Mapping[str, RunRecord | None], me: Mapping[str, Any],
               now: datetime) -> RunChoice:
    """Decide what try ``me["try_number"]`` of a fixed ``run_id`` does.

    ``records`` holds the run record (or None) of each of ``candidate_run_ids``. A run of another
    task instance under one of these ids is refused (run ids are unique; it is not ours to touch).
    Of this task instance's runs, the newest decides: still running with a valid lease → attach
    (wait for it instead of writing twice); ended (failed, succeeded, or its lease expired) → a
    fresh run ``<run_id>-try<N>``, so the new try never inherits the old try's record or error.
    """
    try_number = int(me.get("try_number") or 1)
    existing = [(rid, rec) for rid in candidate_run_ids(base_run_id, try_number)
                if (rec := records.get(rid)) is not None]
    for rid, rec in existing:
        if not same_task_instance(writer_identity(rec), me):
            raise RunRecordError(
                f"run_id {rid!r} is already used at {layout.join(rec.output_uri, layout.run_record_key(rid))} by "
                f"{describe_writer(rec)} (status {rec.status!r}); run ids must be unique: pick another run_id "
                "or leave it unset to generate one"
            )
    if not existing:
        return RunChoice("start", base_run_id, "no earlier run of this task")
    rid, rec = existing[-1]
    ident = writer_identity(rec)
    by = f"try {ident.try_number if ident is not None else None}"
    if rec.status == RUNNING and not rec.lease_expired(now):
        return RunChoice("attach", rid, f"run {rid!r} of {by} is still running (lease valid until "
                                        f"{layout.format_ts(rec.lease_expires_at)})")
    fresh = retry_run_id(base_run_id, try_number)
    if records.get(fresh) is not None:
        raise RunRecordError(
            f"run {fresh!r} already has a run record (status {rec.status!r}); this try cannot start a fresh run "
            "under a new id: clear the task again (a new try) or pick another run_id"
        )
    state = "its lease expired (abandoned)" if rec.status == RUNNING else f"it {rec.status}"
    return RunChoice("start", fresh, f"run {rid!r} of {by} ended ({state}); starting a fresh run")


# ---- outcome of a run ----------------------------------------------------------------------------


def short_submit_error(exc: BaseException) -> str:
    """spark-submit's failure in one line: the spark provider repeats the whole command and its own
    tail in the message; the exit code is the part worth keeping."""
    text = str(exc)
    code = _EXIT_CODE_RE.search(text)
    if text.startswith("Cannot execute:") and code:
        return f"exit code {code[1]}"
    text = text.split("\nLast spark-submit output:", 1)[0]
    return text if len(text) <= 500 else text[:500] + "…"


def abandon_reason(record: RunRecord | None, me: Mapping[str, Any], *, cluster_mode: bool,
                   submit_error: BaseException | None, launcher: str = SPARK_SUBMIT) -> str | None:
    """Why this try's own run, still ``running`` after a client-mode spark-submit ended, is abandoned.

    spark-submit took the client-mode driver with it: nobody will finish the run. ``None`` when
    the run is not exactly this try's (never mark another writer's run), or a cluster runs it.
    ``launcher``: the job's process as errors name it (``connect_launcher`` for Spark Connect).
    """
    if record is None or record.status != RUNNING or cluster_mode or not same_try(writer_identity(record), me):
        return None
    return f"{launcher} ended ({submit_error or 'exit code 0'}) while the run was still running"


def submission_outcome(
    record: RunRecord | None,
    *,
    run_id: str,
    output_uri: str,
    me: Mapping[str, Any],
    submit_error: BaseException | None = None,
    tail: str = "",
    launcher: str = SPARK_SUBMIT,
) -> RunOutcome | None:
    """Run record (+ spark-submit's exit and output tail) → the run's failure, or ``None`` when it
    succeeded (what that means waits on ``_CURRENT``: ``core.lifecycle.run_outcome.wait_for_run``).

    ``record`` was absent before this try submitted, so its status is this try's outcome unless
    its ``writer.airflow`` names another writer (one that raced us for the run id). ``launcher``: as
    in ``abandon_reason``; with Spark Connect the failure is a ``SparkConnectError``.
    """
    job_line = parse_failure(tail)
    if record is not None and owned_by_another(record, me):
        if job_line is not None:
            return RunOutcome.failure(run_id, job_line[0], job_line[1])
        return RunOutcome.failure(run_id, RunRecordError.__name__, (
            f"run {run_id!r} at {output_uri} belongs to {describe_writer(record)}, not to this try; its status "
            f"{record.status!r} is not this task's outcome (run ids must be unique)"))
    if record is not None and record.status == SUCCEEDED:
        return None
    if record is not None and record.status == FAILED:
        return RunOutcome.from_record(record, run_id, layout.utc_now())
    if job_line is not None and record is None:
        # The job refused the config before it could start a run record (exit code 2).
        return RunOutcome.failure(run_id, job_line[0], job_line[1])
    where = layout.join(output_uri, layout.run_record_key(run_id))
    state = "no run record" if record is None else f"the run record still says {record.status!r}"
    cause = f"failed: {short_submit_error(submit_error)}" if submit_error is not None else "ended with exit code 0"
    message = f"run {run_id}: {launcher} {cause}; {state} at {where}" + (
        f"\nLast output of {launcher}:\n{tail}" if tail else "")
    error = SparkSubmitError if launcher == SPARK_SUBMIT else SparkConnectError
    return RunOutcome.failure(run_id, error.__name__, message, record=record)


# ---- waiting ------------------------------------------------------------------------------------------


def resolve_deferral_timeout(deferral_timeout: timedelta | float | None,
                             execution_timeout: timedelta | None) -> timedelta:
    """How long the task may wait on a run record: the argument, else ``execution_timeout``
    (Airflow does not apply it to deferred time), else 24 hours."""
    if deferral_timeout is None:
        return execution_timeout if execution_timeout is not None else DEFAULT_DEFERRAL_TIMEOUT
    if isinstance(deferral_timeout, timedelta):
        value = deferral_timeout
    elif isinstance(deferral_timeout, (int, float)) and not isinstance(deferral_timeout, bool):
        value = timedelta(seconds=deferral_timeout)
    else:
        raise ConfigError(f"deferral_timeout {deferral_timeout!r} must be seconds or a timedelta")
    if value <= timedelta(0):
        raise ConfigError(f"deferral_timeout {deferral_timeout!r} must be > 0")
    return value
