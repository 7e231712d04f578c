"""What crosses the boundary between the Spark job and the Airflow side, defined once (pure).

- The job's verdict: one line on stderr, written by the job with ``failed_line`` / ``done_line``
  and read back from spark-submit's output by the operator with ``parse_failure``; the streaming
  job's ``SHARDYFUSION_STREAM_RESULT`` line is its typed report (``core.stream.report``).
- ``RunStats``: a run's ``stats`` (run record and manifest), typed.
- ``WriterIdentity`` and ``TaskTry``: a run's ``writer``, and in it the Airflow try that wrote it.

Run records and manifests keep ``stats`` and ``writer`` as the JSON objects they hold, so existing
records read, and are rewritten, byte for byte. ``from_dict`` reads any of them with the codec of
``core.serialization`` and its kept keys: a known key whose value is not of its type is kept in
``other`` with the keys this module does not know, so ``from_dict(d).to_dict() == d`` for any stats
and any writer the job wrote (a writer always names the keys it always wrote, null when unknown;
the others only when set; tests/unit/test_job_contract.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ShardyfusionError
from airflow_provider_shardyfusion.core.model.manifest import WriteMode

__all__ = [
    "JOB", "STREAMING_JOB", "STREAM_RESULT_MARKER", "RunStats", "TaskTry", "WriterIdentity", "done_line",
    "failed_line", "parse_failure",
]

JOB = "shardyfusion job"
STREAMING_JOB = "shardyfusion streaming job"
STREAM_RESULT_MARKER = "SHARDYFUSION_STREAM_RESULT"
_FAILED_RE = re.compile(rf"{JOB} failed: (?P<type>[A-Za-z_][A-Za-z0-9_]*): (?P<message>.*)")


# ---- the verdict line -----------------------------------------------------------------------------


def failed_line(error_type: str, message: str, *, job: str = JOB) -> str:
    """``shardyfusion job failed: Type: message``: how the job ends when it fails (one line)."""
    return f"{job} failed: {error_type}: {message}"


def done_line(state: Literal["published", "staged"], run_id: str, manifest_ref: str | None) -> str:
    return f"{JOB} {state} run {run_id}: {manifest_ref}"


def parse_failure(tail: str) -> tuple[str, str] | None:
    """``(type, message)`` of the batch job's newest failure line in ``tail`` (its output), if any."""
    for line in reversed(tail.splitlines()):
        m = _FAILED_RE.search(line)
        if m:
            return m["type"], m["message"]
    return None


# ---- typed views of persisted objects ---------------------------------------------------------------


# Written only when set: a stats or writer key the job did not know stays absent.
_SET = {"omit_none": True}


@dataclass(frozen=True)
class RunStats:
    """The figures of a run's ``stats`` read across the job boundary, a chain's change counts
    included; ``other``: every other key (per-task timings, ...), as written."""

    rows: int | None = field(default=None, metadata=_SET)
    base_rows: int | None = field(default=None, metadata=_SET)
    inserted: int | None = field(default=None, metadata=_SET)
    updated: int | None = field(default=None, metadata=_SET)
    deleted: int | None = field(default=None, metadata=_SET)
    deleted_absent: int | None = field(default=None, metadata=_SET)
    puts: int | None = field(default=None, metadata=_SET)
    deletes: int | None = field(default=None, metadata=_SET)
    bytes: int | None = field(default=None, metadata=_SET)
    num_dbs: int | None = field(default=None, metadata=_SET)
    empty_shards: int | None = field(default=None, metadata=_SET)
    shards_written: int | None = field(default=None, metadata=_SET)
    attempts_seen: int | None = field(default=None, metadata=_SET)
    base_run_id: str | None = field(default=None, metadata=_SET)
    write_mode: WriteMode | None = field(default=None, metadata=_SET)
    durations_s: Mapping[str, float] | None = field(default=None, metadata=_SET)
    other: Mapping[str, Any] = ser.kept_keys()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunStats:
        return _STATS_CODEC.from_dict(dict(data or {}))

    def to_dict(self) -> dict[str, Any]:
        return dict(ser.to_plain(self))


@dataclass(frozen=True)
class TaskTry:
    """The Airflow task try that wrote a run (``writer.airflow``): who owns the run (core.lifecycle.write_attempts)."""

    dag_id: str | None = field(default=None, metadata=_SET)
    task_id: str | None = field(default=None, metadata=_SET)
    run_id: str | None = field(default=None, metadata=_SET)
    map_index: int | None = field(default=None, metadata=_SET)
    try_number: int | None = field(default=None, metadata=_SET)
    other: Mapping[str, Any] = ser.kept_keys()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskTry:
        return _TASK_TRY_CODEC.from_dict(dict(data))

    def to_dict(self) -> dict[str, Any]:
        return dict(ser.to_plain(self))

    def same_task_instance(self, other: TaskTry) -> bool:
        return (self.dag_id, self.task_id, self.run_id, self.map_index) == (
            other.dag_id, other.task_id, other.run_id, other.map_index)

    def same_try(self, other: TaskTry) -> bool:
        return self.same_task_instance(other) and self.try_number == other.try_number


@dataclass(frozen=True)
class WriterIdentity:
    """A run's ``writer``: the software that wrote it, its Spark application, the Airflow try, and
    for a stream's micro-batch the stream and batch id.

    Every job writes the fields up to ``publish``, null when unknown; the stream's only when set.
    """

    provider: str | None = None
    provider_version: str | None = None
    spark_version: str | None = None
    python_version: str | None = None
    spark_app_id: str | None = None
    spark_ui_url: str | None = None
    airflow: TaskTry | None = None
    publish: bool | None = None
    stream_id: str | None = field(default=None, metadata=_SET)
    batch_id: int | None = field(default=None, metadata=_SET)
    other: Mapping[str, Any] = ser.kept_keys()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> WriterIdentity:
        return _WRITER_CODEC.from_dict(dict(data or {}))

    def to_dict(self) -> dict[str, Any]:
        return dict(ser.to_plain(self))


# Read from any record any provider version wrote: nothing is refused, what is not typed is kept.
_STATS_CODEC = ser.Codec(RunStats, "run stats", ShardyfusionError)
_TASK_TRY_CODEC = ser.Codec(TaskTry, "writer.airflow", ShardyfusionError)
_WRITER_CODEC = ser.Codec(WriterIdentity, "run writer", ShardyfusionError)
