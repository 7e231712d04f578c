"""What the streaming job reports back (SPEC §14): the batches it handled, typed on both sides (pure).

The job writes a ``StreamReport`` under the root (``core.stream.job.report_key``) after every
micro-batch and when the query ended, and prints it as one ``SHARDYFUSION_STREAM_RESULT {json}``
line on stderr (``result_line``). The operator reads it back with the codec of
``core.serialization``: a report or a batch entry that is not what the job writes is one error
naming the field and where it is (``$.batches[1].rows``), never a batch silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.write.job_contract import STREAM_RESULT_MARKER

__all__ = ["BatchAction", "BatchOutcome", "StreamReport", "parse_result_line"]

# ``written``: the batch was written and published; ``published``: an earlier attempt's run was
# published; ``skipped``: the batch is already live, or below the last live batch.
BatchAction = Literal["skipped", "written", "published"]
LIVE_ACTIONS: tuple[BatchAction, ...] = ("written", "published")


@dataclass(frozen=True)
class BatchOutcome:
    """What the writer did with one micro-batch (``BatchWriter.outcomes``, the report's ``batches``)."""

    batch_id: int
    action: BatchAction
    run_id: str
    reason: str
    rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(ser.to_plain(self))

    @property
    def live(self) -> bool:
        """Whether the batch's run went live in this query (an asset event each)."""
        return self.action in LIVE_ACTIONS

    def summary(self) -> dict[str, Any]:
        """The batch as the operator's XCom lists it."""
        return {"batch_id": self.batch_id, "run_id": self.run_id, "action": self.action, "rows": self.rows}


@dataclass(frozen=True)
class StreamReport:
    """The streaming job's report: its stream, whether the query ended, its error, the batches handled."""

    stream_id: str
    finished: bool
    error: str | None = None
    batches: tuple[BatchOutcome, ...] = ()

    def to_bytes(self) -> bytes:
        return ser.dumps(ser.to_plain(self))

    @classmethod
    def from_bytes(cls, data: bytes | str) -> StreamReport:
        """The report as the job wrote it; ``ConfigError`` naming the field that is missing or malformed."""
        return _CODEC.from_bytes(data)

    def result_line(self) -> str:
        """The report as one line of the job's stderr."""
        return f"{STREAM_RESULT_MARKER} {self.to_bytes().decode()}"


def parse_result_line(tail: str) -> StreamReport | None:
    """The streaming job's newest result line in ``tail`` (its output), if any."""
    for line in reversed(tail.splitlines()):
        head, marker, rest = line.partition(f"{STREAM_RESULT_MARKER} ")
        if marker and not head.strip():
            return StreamReport.from_bytes(rest)
    return None


_CODEC = ser.Codec(StreamReport, "stream report", ConfigError)
