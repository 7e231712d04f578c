"""Shard results and winner selection (SPEC §6 steps 8–10)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ShardCoverageError, ShardWriteError
from airflow_provider_shardyfusion.core.model.manifest import ShardEntry, ShardFile

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["ShardResult", "WinnerSelection", "select_winners"]


@dataclass(frozen=True)
class ShardResult:
    """What one task attempt reports for its shard. Empty shards have ``db_url=None``."""

    db_id: int
    attempt: int
    task_attempt_id: int | None
    db_url: str | None
    row_count: int
    byte_size: int = 0
    min_key: str | None = None
    max_key: str | None = None
    files: tuple[ShardFile, ...] = ()
    key_index: ShardFile | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def sort_key(self) -> tuple[int, int, str]:
        return (self.attempt, self.task_attempt_id if self.task_attempt_id is not None else -1, self.db_url or "")

    def to_entry(self) -> ShardEntry:
        if self.db_url is None or self.min_key is None or self.max_key is None:
            raise ShardCoverageError(f"shard {self.db_id} is empty and has no manifest entry")
        return ShardEntry(
            db_id=self.db_id, db_url=self.db_url, attempt=self.attempt, task_attempt_id=self.task_attempt_id,
            row_count=self.row_count, byte_size=self.byte_size, min_key=self.min_key, max_key=self.max_key,
            files=self.files, key_index=self.key_index,
        )

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardResult:
        return _SHARD_RESULT_CODEC.from_dict(d)


# A task's result crosses from the executor to the driver as JSON; a malformed one names its field.
_SHARD_RESULT_CODEC = ser.Codec(ShardResult, "shard task result", ShardWriteError)


@dataclass(frozen=True)
class WinnerSelection:
    """The deterministic outcome of winner selection: one winning attempt per non-empty shard, and the rest."""

    winners: dict[int, ShardResult]  # non-empty shards only (the manifest is sparse)
    losers: tuple[ShardResult, ...]
    empty_db_ids: tuple[int, ...]
    attempts_seen: int

    def entries(self) -> tuple[ShardEntry, ...]:
        return tuple(self.winners[db_id].to_entry() for db_id in sorted(self.winners))


def select_winners(results: Iterable[ShardResult], num_dbs: int) -> WinnerSelection:
    """Per shard the smallest ``(attempt, task_attempt_id, db_url)`` wins; ids must lie in range."""
    by_db: dict[int, list[ShardResult]] = {}
    count = 0
    for result in results:
        count += 1
        if not 0 <= result.db_id < num_dbs:
            raise ShardCoverageError(
                f"shard result for db_id {result.db_id} is outside [0, {num_dbs}); routing or partitioning is broken"
            )
        by_db.setdefault(result.db_id, []).append(result)
    winners: dict[int, ShardResult] = {}
    losers: list[ShardResult] = []
    empty: list[int] = []
    for db_id in range(num_dbs):
        candidates = sorted(by_db.get(db_id, ()), key=lambda r: r.sort_key)
        if not candidates:
            empty.append(db_id)  # no task reported: its partition had no rows
            continue
        best, rest = candidates[0], candidates[1:]
        losers.extend(rest)
        if best.row_count == 0:
            empty.append(db_id)
        else:
            winners[db_id] = best
    return WinnerSelection(winners=winners, losers=tuple(losers), empty_db_ids=tuple(empty), attempts_seen=count)
