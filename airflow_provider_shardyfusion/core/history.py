"""A snapshot root's history: every run with what became of it, and the difference of two runs.

What people ask of a root (what is live and since when, what was rolled back, how big each run
was, what changed between two runs) answered from run records, ``_CURRENT`` and manifests only.
The CLI (``shardyfusion history`` / ``diff``) prints these models; the UI renders them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from . import layout
from .errors import ConfigError, ManifestValidationError, RunRecordError
from .pointer import CurrentPointer
from .run_record import FAILED, RUNNING, SUCCEEDED, RunRecord

if TYPE_CHECKING:
    from .manifest import Manifest, ShardEntry
    from .snapshot import ManifestRef, SnapshotRoot

RunState = Literal["running", "failed", "staged", "live", "superseded", "rolled_back", "deleted", "unreadable"]


@dataclass(frozen=True)
class RunEntry:
    """One run of a root as a reader of its history sees it."""

    run_id: str
    state: RunState
    started_at: datetime | None = None
    finished_at: datetime | None = None
    published_at: datetime | None = None
    deleted_at: datetime | None = None
    rows: int | None = None
    bytes: int | None = None
    num_dbs: int | None = None
    manifest_ref: str | None = None
    error: str | None = None  # "<type>: <message>" of a failed run, or why its record is unreadable
    replaced_by: str | None = None  # the run published after it (superseded / rolled back)
    validation: dict[str, Any] | None = None  # the last ValidateManifestOperator report, if any
    airflow: dict[str, Any] = field(default_factory=dict)  # the writing task (dag_id, task_id, run_id, try)

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds(), 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "state": self.state, "started_at": _ts(self.started_at),
            "finished_at": _ts(self.finished_at), "published_at": _ts(self.published_at),
            "deleted_at": _ts(self.deleted_at), "duration_s": self.duration_s, "rows": self.rows, "bytes": self.bytes,
            "num_dbs": self.num_dbs, "manifest_ref": self.manifest_ref, "error": self.error,
            "replaced_by": self.replaced_by, "validation": self.validation, "airflow": dict(self.airflow),
        }


@dataclass(frozen=True)
class RootHistory:
    """Every run of a root, newest start first, and the live one."""

    root: str
    live_run_id: str | None
    live_since: datetime | None
    runs: tuple[RunEntry, ...]
    pointer: CurrentPointer | None = field(default=None, repr=False, compare=False)  # as read: no second read

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "live_run_id": self.live_run_id, "live_since": _ts(self.live_since),
                "runs": [r.to_dict() for r in self.runs]}


# Run records read at a time: a history page of a large root on S3 is bound by round trips.
HISTORY_READ_PARALLEL = 16


def root_history(snapshots: SnapshotRoot) -> RootHistory:
    """Read every run record once, and ``_CURRENT``; no manifest is read."""
    live = snapshots.current()
    records: dict[str, RunRecord] = {}
    unreadable: dict[str, str] = {}
    for run_id, record, exc in snapshots.iter_runs(parallel=HISTORY_READ_PARALLEL):
        if record is not None:
            records[run_id] = record
        else:
            unreadable[run_id] = f"{type(exc).__name__}: {exc}"
    replaced_by = _replacements(records)
    entries = [_entry(record, live, replaced_by.get(run_id)) for run_id, record in records.items()]
    entries += [RunEntry(run_id=run_id, state="unreadable", error=why) for run_id, why in unreadable.items()]
    entries.sort(key=lambda e: (e.started_at is not None, e.started_at or datetime.min, e.run_id), reverse=True)
    return RootHistory(root=snapshots.root, live_run_id=live.run_id if live else None,
                       live_since=live.updated_at if live else None, runs=tuple(entries), pointer=live)


def _replacements(records: dict[str, RunRecord]) -> dict[str, RunRecord]:
    """For each published run, the run published next (by ``published_at``)."""
    published = sorted((r for r in records.values() if r.published_at is not None),
                       key=lambda r: r.published_at)  # type: ignore[arg-type, return-value]
    return {earlier.run_id: later for earlier, later in itertools.pairwise(published)}


def _entry(record: RunRecord, live: CurrentPointer | None, next_published: RunRecord | None) -> RunEntry:
    state: RunState
    if record.deleted_at is not None:
        state = "deleted"
    elif live is not None and live.run_id == record.run_id:
        state = "live"
    elif record.status == RUNNING:
        state = "running"
    elif record.status == FAILED:
        state = "failed"
    elif record.status == SUCCEEDED and record.published_at is None:
        state = "staged"
    elif next_published is not None and next_published.started_at < record.started_at:
        state = "rolled_back"  # _CURRENT moved from it to a run that started before it
    else:
        state = "superseded"
    stats = record.stats or {}
    return RunEntry(
        run_id=record.run_id, state=state, started_at=record.started_at, finished_at=record.finished_at,
        published_at=record.published_at, deleted_at=record.deleted_at, rows=_int(stats.get("rows")),
        bytes=_int(stats.get("bytes")), num_dbs=record.num_dbs, manifest_ref=record.manifest_ref,
        error=f"{record.error.type}: {record.error.message}" if record.error else None,
        replaced_by=next_published.run_id if next_published is not None and state != "live" else None,
        validation=record.validation, airflow=dict(record.writer.get("airflow") or {}),
    )


# -- the difference of two runs --------------------------------------------------------------------


@dataclass(frozen=True)
class ShardDiff:
    """One shard of two runs: rows and bytes of each, whether its files are the same, and, when run
    ``b`` extends run ``a``'s chain in this shard, exactly what ``b``'s newer layers did."""

    db_id: int
    rows_a: int | None
    rows_b: int | None
    bytes_a: int | None
    bytes_b: int | None
    same_files: bool  # identical layers, file names, sizes and checksums: the shard did not change
    changes: dict[str, int] | None = None  # inserted / updated / deleted / deleted_absent along the chain

    def to_dict(self) -> dict[str, Any]:
        return {"db_id": self.db_id, "rows_a": self.rows_a, "rows_b": self.rows_b, "bytes_a": self.bytes_a,
                "bytes_b": self.bytes_b, "same_files": self.same_files, "changes": self.changes}


@dataclass(frozen=True)
class RunDiff:
    """Per-shard rows and bytes of run ``a`` against run ``b`` (``b`` is usually the newer)."""

    run_a: str
    run_b: str
    rows_a: int
    rows_b: int
    bytes_a: int
    bytes_b: int
    same_routing: bool  # same num_dbs and sharding: shard i of one holds the keys of shard i of the other
    shards: tuple[ShardDiff, ...]

    @property
    def changes(self) -> dict[str, int] | None:
        """Exact inserted / updated / deleted from ``a`` to ``b`` when ``b`` extends ``a``'s chain in every shard."""
        if not self.shards or any(s.changes is None for s in self.shards):
            return None
        return {k: sum((s.changes or {}).get(k, 0) for s in self.shards) for k in _CHANGE_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "rows_a": self.rows_a, "rows_b": self.rows_b,
                "rows_change": self.rows_b - self.rows_a, "bytes_a": self.bytes_a, "bytes_b": self.bytes_b,
                "same_routing": self.same_routing, "changes": self.changes, "shards": [s.to_dict() for s in self.shards]}


_CHANGE_KEYS = ("inserted", "updated", "deleted", "deleted_absent")


def _chain_changes(sa: ShardEntry | None, sb: ShardEntry | None) -> dict[str, int] | None:
    """What ``sb``'s layers beyond ``sa``'s did, if ``sa``'s layers are where ``sb``'s begin; else None."""
    layers_a = sa.all_layers() if sa is not None else ()
    layers_b = sb.all_layers() if sb is not None else ()
    if len(layers_b) < len(layers_a) or layers_b[:len(layers_a)] != layers_a:
        return None
    if sb is None and sa is None:
        return None
    newer = layers_b[len(layers_a):]
    if any(layer.kind != "delta" for layer in newer):
        return None
    return {k: sum(getattr(layer, k) for layer in newer) for k in _CHANGE_KEYS}


def diff_runs(snapshots: SnapshotRoot, run_a: str, run_b: str) -> RunDiff:
    """Compare the manifests of two runs; ``ConfigError`` naming a run that has none."""
    a, b = manifest_of_run(snapshots, run_a), manifest_of_run(snapshots, run_b)
    shards_a = {s.db_id: s for s in a.shards}
    shards_b = {s.db_id: s for s in b.shards}
    diffs = []
    for db_id in sorted(set(shards_a) | set(shards_b)):
        sa, sb = shards_a.get(db_id), shards_b.get(db_id)
        files_a = _layer_files(sa) if sa else None
        files_b = _layer_files(sb) if sb else None
        diffs.append(ShardDiff(
            db_id=db_id, rows_a=sa.row_count if sa else None, rows_b=sb.row_count if sb else None,
            bytes_a=sa.byte_size if sa else None, bytes_b=sb.byte_size if sb else None,
            same_files=files_a == files_b and files_a is not None,
            changes=_chain_changes(sa, sb) if a.num_dbs == b.num_dbs and a.sharding == b.sharding else None,
        ))
    return RunDiff(
        run_a=run_a, run_b=run_b, rows_a=a.row_count, rows_b=b.row_count,
        bytes_a=sum(d.bytes_a or 0 for d in diffs), bytes_b=sum(d.bytes_b or 0 for d in diffs),
        same_routing=a.num_dbs == b.num_dbs and a.sharding == b.sharding, shards=tuple(diffs),
    )


def _layer_files(shard: ShardEntry) -> list[list[tuple[str, int, str]]]:
    return [sorted((f.name, f.size, f.checksum) for f in layer.files) for layer in shard.all_layers()]


def manifest_of_run(snapshots: SnapshotRoot, run_id: str) -> Manifest:
    """The manifest the run's record names (one read, no listing of every manifest of the root);
    ``ConfigError`` for a run that has none (failed, running, deleted)."""
    record: RunRecord | None
    try:
        record = snapshots.read_run(run_id)
    except RunRecordError:
        record = None  # unreadable: the manifest may still be found by its path
    ref: ManifestRef | None
    if record is not None and record.manifest_ref is not None and record.deleted_at is None:
        ref = snapshots.manifest_ref(record.manifest_ref)
    elif record is None:
        ref = snapshots.find_manifest(run_id)
    else:
        ref = None
    if ref is None:
        raise ConfigError(f"run {run_id!r} has no manifest under {snapshots.root} (failed, running, or deleted)")
    return snapshots.read_manifest(ref)


def run_claim_holds(snapshots: SnapshotRoot, run_id: str, manifest_ref: str) -> bool:
    """Whether the root's own record of ``run_id`` names ``manifest_ref``, a manifest under the root:
    what an asset event says of a root, checked against the root. A ``StorageError`` (the answer is
    unknown, not no) propagates."""
    try:
        layout.validate_run_id(run_id)
        snapshots.manifest_ref(manifest_ref)
        record = snapshots.read_run(run_id)
    except (ConfigError, ManifestValidationError, RunRecordError):
        return False
    return record is not None and record.manifest_ref == manifest_ref


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ts(value: datetime | None) -> str | None:
    return layout.format_ts(value) if value is not None else None
