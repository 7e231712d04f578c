"""What crosses the boundary between the Spark job and the Airflow side, defined once (pure).

- The job's verdict: one line on stderr, written by the job with ``failed_line`` / ``done_line``
  and read back from spark-submit's output by the operator with ``parse_failure``; the streaming
  job's ``SHARDYFUSION_STREAM_RESULT`` line likewise (``stream_result_line`` / ``parse_stream_result``).
- ``RunStats``: a run's ``stats`` (run record and manifest), typed.
- ``WriterIdentity`` and ``TaskTry``: a run's ``writer``, and in it the Airflow try that wrote it.

Run records and manifests keep ``stats`` and ``writer`` as the JSON objects they hold, so existing
records read, and are rewritten, byte for byte. ``from_dict`` reads any of them: a known key whose
value is not of its type is kept in ``other`` with the keys this module does not know, so
``from_dict(d).to_dict() == d`` for any stats and any writer the job wrote (a writer always names
the keys of ``_ALWAYS``, null when unknown; tests/unit/test_job_contract.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "JOB", "STREAMING_JOB", "STREAM_RESULT_MARKER", "RunStats", "TaskTry", "WriterIdentity", "done_line",
    "failed_line", "parse_failure", "parse_stream_result", "stream_result_line",
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


def stream_result_line(result: Mapping[str, Any]) -> str:
    return f"{STREAM_RESULT_MARKER} {json.dumps(result, sort_keys=True)}"


def parse_stream_result(tail: str) -> dict[str, Any] | None:
    """The streaming job's newest result line in ``tail``, if any."""
    for line in reversed(tail.splitlines()):
        head, _, rest = line.partition(f"{STREAM_RESULT_MARKER} ")
        if _ and not head.strip():
            return dict(json.loads(rest))
    return None


# ---- typed views of persisted objects ---------------------------------------------------------------


def _typed(data: Mapping[str, Any], names: dict[str, tuple[type, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``data`` into the known keys whose values have their type, and everything else."""
    known, other = {}, {}
    for key, value in data.items():
        types = names.get(key)
        if types is not None and isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
            known[key] = value
        else:
            other[key] = value
    return known, other


def _types(cls: type, skip: tuple[str, ...] = ()) -> dict[str, tuple[type, ...]]:
    kinds = {"int": (int,), "str": (str,), "bool": (bool,), "Mapping[str, float]": (Mapping,)}
    return {f.name: kinds[str(f.type).removesuffix(" | None")] for f in fields(cls)
            if f.name != "other" and f.name not in skip}


def _plain(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out = dict(obj.other)
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name != "other" and f.name not in skip and value is not None:
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
    return out


@dataclass(frozen=True)
class RunStats:
    """The figures of a run's ``stats`` read across the job boundary, a chain's change counts
    included; ``other``: every other key (per-task timings, ...), as written."""

    rows: int | None = None
    base_rows: int | None = None
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    deleted_absent: int | None = None
    puts: int | None = None
    deletes: int | None = None
    bytes: int | None = None
    num_dbs: int | None = None
    empty_shards: int | None = None
    shards_written: int | None = None
    attempts_seen: int | None = None
    base_run_id: str | None = None
    write_mode: str | None = None
    durations_s: Mapping[str, float] | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunStats:
        known, other = _typed(data or {}, _types(cls))
        return cls(**known, other=other)

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class TaskTry:
    """The Airflow task try that wrote a run (``writer.airflow``): who owns the run (core.lifecycle.write_attempts)."""

    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskTry:
        known, other = _typed(data, _types(cls))
        return cls(**known, other=other)

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    def same_task_instance(self, other: TaskTry) -> bool:
        return (self.dag_id, self.task_id, self.run_id, self.map_index) == (
            other.dag_id, other.task_id, other.run_id, other.map_index)

    def same_try(self, other: TaskTry) -> bool:
        return self.same_task_instance(other) and self.try_number == other.try_number


# Written by every job even when unknown (null), as the job always did.
_ALWAYS = ("provider", "provider_version", "spark_version", "python_version", "spark_app_id", "spark_ui_url",
           "airflow", "publish")


@dataclass(frozen=True)
class WriterIdentity:
    """A run's ``writer``: the software that wrote it, its Spark application, the Airflow try, and
    for a stream's micro-batch the stream and batch id."""

    provider: str | None = None
    provider_version: str | None = None
    spark_version: str | None = None
    python_version: str | None = None
    spark_app_id: str | None = None
    spark_ui_url: str | None = None
    airflow: TaskTry | None = None
    publish: bool | None = None
    stream_id: str | None = None
    batch_id: int | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> WriterIdentity:
        data = dict(data or {})
        airflow = data.pop("airflow", None)
        known, other = _typed(data, _types(cls, skip=("airflow",)))
        for name in _ALWAYS:  # null again in to_dict
            if name in other and other[name] is None:
                del other[name]
        if isinstance(airflow, Mapping):
            return cls(**known, airflow=TaskTry.from_dict(airflow), other=other)
        if airflow is not None:
            other["airflow"] = airflow
        return cls(**known, other=other)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(_ALWAYS)
        out.update(_plain(self, skip=("airflow",)))
        if self.airflow is not None:
            out["airflow"] = self.airflow.to_dict()
        return out
