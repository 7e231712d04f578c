"""A snapshot root's history: every run with what became of it, and the difference of two runs.

What people ask of a root (what is live and since when, what was rolled back, how big each run
was, what changed between two runs) answered from run records, ``_CURRENT`` and manifests only.
The CLI (``shardyfusion history`` / ``diff``) prints these models; the UI renders them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError, RunRecordError, ShardyfusionError
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.model.manifest import Manifest, WriteMode
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunRecord
from airflow_provider_shardyfusion.core.model.value_schema import ValueSchema, describe_changes, schema_changes
from airflow_provider_shardyfusion.core.write.job_contract import RunStats, WriterIdentity

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding
    from airflow_provider_shardyfusion.core.model.manifest import ShardEntry
    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef, SnapshotRoot

__all__ = [
    "CHANGE_KINDS",
    "HISTORY_READ_PARALLEL",
    "SAMPLE_KEYS",
    "SAMPLE_SCAN_KEYS",
    "STATE_MEANINGS",
    "VALUE_PREVIEW_CHARS",
    "ChangeKind",
    "ChangedKeys",
    "KeyFate",
    "RootHistory",
    "RunDiff",
    "RunEntry",
    "RunState",
    "ShardDiff",
    "ShardSample",
    "change_label",
    "changed_keys",
    "comparison_between",
    "diff_runs",
    "differing_fields",
    "json_value",
    "key_fates",
    "manifest_ref_of_run",
    "rank_fields",
    "root_history",
    "run_claim_holds",
    "sample_changes",
    "schema_columns",
    "schema_diff",
    "shown_values",
    "signed",
    "spread",
    "typed_comparison",
]

T = TypeVar("T")

RunState = Literal["running", "failed", "staged", "live", "base_of_live", "superseded", "rolled_back", "deleted",
                   "unreadable"]
# Who reads the layers of a run that is no longer live: a "base of live" run's files are still read
# by the live delta, so it is not the same as "superseded" (whose data a cleanup may reclaim).

# What each state means, for help texts: one list, so a new state cannot be left out of one of them.
STATE_MEANINGS: dict[RunState, str] = {
    "running": "the writer has not finished",
    "failed": "the writer failed (with its error)",
    "staged": "succeeded, never published",
    "live": "the run _CURRENT names",
    "base_of_live": "no longer live, but the live delta still reads its files",
    "superseded": "replaced by a run that started later",
    "rolled_back": "_CURRENT moved from it to a run that started before it",
    "deleted": "its data was reclaimed by cleanup",
    "unreadable": "its run record could not be read (with why)",
}


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
    write_mode: WriteMode | None = None  # as the writer's stats say
    base_run_id: str | None = None  # the run a delta or compaction was written on
    changes: dict[str, int] | None = None  # a chain run's inserted / updated / deleted / deleted_absent (stored)
    rows_change: int | None = None  # rows against its base (chain) or the previous run that wrote (full)

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
            "write_mode": self.write_mode, "base_run_id": self.base_run_id, "changes": self.changes,
            "rows_change": self.rows_change, "change_label": change_label(self.changes, self.rows_change),
        }


@dataclass(frozen=True)
class RootHistory:
    """Every run of a root, newest start first, and the live one."""

    root: str
    live_run_id: str | None
    live_since: datetime | None
    runs: tuple[RunEntry, ...]
    pointer: CurrentPointer | None = field(default=None, repr=False, compare=False)  # as read: no second read
    live_manifest: Manifest | None = field(default=None, repr=False, compare=False)
    live_manifest_error: str | None = None  # why the live run's manifest could not be read

    @property
    def exists(self) -> bool:
        """Whether anything of a snapshot root is there: a run record or ``_CURRENT``."""
        return bool(self.runs) or self.pointer is not None

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "live_run_id": self.live_run_id, "live_since": _ts(self.live_since),
                "exists": self.exists, "live_manifest_error": self.live_manifest_error,
                "runs": [r.to_dict() for r in self.runs]}


# Run records read at a time: a history page of a large root on S3 is bound by round trips.
HISTORY_READ_PARALLEL = 16


def root_history(snapshots: SnapshotRoot) -> RootHistory:
    """Read every run record once, ``_CURRENT``, and the live run's manifest, which names the
    earlier runs whose layers the live snapshot still reads ("base of live")."""
    live = snapshots.current()
    records: dict[str, RunRecord] = {}
    unreadable: dict[str, str] = {}
    for run_id, record, exc in snapshots.iter_runs(parallel=HISTORY_READ_PARALLEL):
        if record is not None:
            records[run_id] = record
        else:
            unreadable[run_id] = f"{type(exc).__name__}: {exc}"
    live_manifest: Manifest | None = None
    live_error = None
    if live is not None:
        try:
            live_manifest = snapshots.read_manifest(live)
        except ShardyfusionError as exc:  # the timeline still shows; only "base of live" is unknown
            live_error = f"{type(exc).__name__}: {exc}"
    read_by_live = live_manifest.layer_run_ids() if live_manifest is not None else set()
    replaced_by = _replacements(records)
    entries = [_entry(record, live, replaced_by.get(run_id), read_by_live) for run_id, record in records.items()]
    entries += [RunEntry(run_id=run_id, state="unreadable", error=why) for run_id, why in unreadable.items()]
    entries.sort(key=lambda e: (e.started_at is not None, e.started_at or datetime.min, e.run_id), reverse=True)
    return RootHistory(root=snapshots.root, live_run_id=live.run_id if live else None,
                       live_since=live.updated_at if live else None, runs=_with_full_run_changes(entries),
                       pointer=live, live_manifest=live_manifest, live_manifest_error=live_error)


def _with_full_run_changes(newest_first: list[RunEntry]) -> tuple[RunEntry, ...]:
    """A full run's row change is against the run that wrote before it (a chain run's is stored)."""
    out = []
    for i, entry in enumerate(newest_first):
        if entry.rows_change is None and entry.rows is not None and entry.write_mode == "full":
            older = next((e for e in newest_first[i + 1:] if e.rows is not None), None)
            if older is not None and older.rows is not None:
                entry = dataclasses.replace(entry, rows_change=entry.rows - older.rows)
        out.append(entry)
    return tuple(out)


def _replacements(records: dict[str, RunRecord]) -> dict[str, RunRecord]:
    """For each published run, the run published next (by ``published_at``)."""
    published = sorted((r for r in records.values() if r.published_at is not None),
                       key=lambda r: r.published_at)  # type: ignore[arg-type, return-value]
    return {earlier.run_id: later for earlier, later in itertools.pairwise(published)}


def _entry(record: RunRecord, live: CurrentPointer | None, next_published: RunRecord | None,
           read_by_live: set[str]) -> RunEntry:
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
    elif record.run_id in read_by_live:
        state = "base_of_live"
    elif next_published is not None and next_published.started_at < record.started_at:
        state = "rolled_back"  # _CURRENT moved from it to a run that started before it
    else:
        state = "superseded"
    stats = RunStats.from_dict(record.stats)
    changes = {k: v for k in _CHANGE_KEYS if (v := getattr(stats, k)) is not None}
    chain = stats.base_run_id is not None
    mode = stats.write_mode
    if mode is None and record.manifest_ref is not None and not chain:
        mode = "full"
    rows, base_rows = stats.rows, stats.base_rows
    airflow = WriterIdentity.from_dict(record.writer).airflow
    return RunEntry(
        run_id=record.run_id, state=state, started_at=record.started_at, finished_at=record.finished_at,
        published_at=record.published_at, deleted_at=record.deleted_at, rows=rows,
        bytes=stats.bytes, num_dbs=record.num_dbs, manifest_ref=record.manifest_ref,
        error=f"{record.error.type}: {record.error.message}" if record.error else None,
        replaced_by=next_published.run_id if next_published is not None and state != "live" else None,
        validation=record.validation, airflow=airflow.to_dict() if airflow is not None else {},
        write_mode=mode, base_run_id=stats.base_run_id,
        changes=changes if chain and len(changes) == len(_CHANGE_KEYS) else None,
        rows_change=rows - base_rows if chain and rows is not None and base_rows is not None else None,
    )


def change_label(changes: dict[str, int] | None, rows_change: int | None = None) -> str:
    """``+inserted ~updated −deleted`` (stored counts of a chain run) and the net row change, e.g.
    ``+200 ~500 −300 (net −100)``; a full run has only its net change against the run before it."""
    net = f"net {signed(rows_change)}" if rows_change is not None else ""
    if not changes:
        return net
    counts = f"+{changes.get('inserted', 0)} ~{changes.get('updated', 0)} \u2212{changes.get('deleted', 0)}"
    return f"{counts} ({net})" if net else counts


def signed(n: int) -> str:
    """``+5``, ``−5`` (a real minus sign) or ``0``."""
    return f"+{n}" if n > 0 else f"\u2212{-n}" if n < 0 else "0"


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
    manifest_a: str | None = None  # the manifests compared, for readers of the two runs
    manifest_b: str | None = None
    schema_a: ValueSchema | None = None  # None: the run's manifest recorded no value schema
    schema_b: ValueSchema | None = None

    @property
    def changes(self) -> dict[str, int] | None:
        """Exact inserted / updated / deleted from ``a`` to ``b`` when ``b`` extends ``a``'s chain in every shard."""
        if not self.shards or any(s.changes is None for s in self.shards):
            return None
        return {k: sum((s.changes or {}).get(k, 0) for s in self.shards) for k in _CHANGE_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "rows_a": self.rows_a, "rows_b": self.rows_b,
                "rows_change": self.rows_b - self.rows_a, "bytes_a": self.bytes_a, "bytes_b": self.bytes_b,
                "same_routing": self.same_routing, "changes": self.changes, "manifest_a": self.manifest_a,
                "manifest_b": self.manifest_b, "shards": [s.to_dict() for s in self.shards],
                "value_schema": schema_diff(self.schema_a, self.schema_b, self.run_a, self.run_b)}


def schema_columns(schema: ValueSchema | None) -> list[dict[str, Any]] | None:
    """A value schema as pages show it: each column's name, type text and nullability; None if not recorded."""
    if schema is None:
        return None
    return [{"name": c.name, "type": c.type.text(), "nullable": c.nullable} for c in schema.columns]


def schema_diff(a: ValueSchema | None, b: ValueSchema | None, run_a: str, run_b: str) -> dict[str, Any]:
    """Both runs' columns and the changes from ``a`` to ``b`` (``None`` when either recorded no schema),
    with a line that says it: ``no schema change``, ``schema not recorded ...`` or each change."""
    changes = schema_changes(a, b) if a is not None and b is not None else None
    if changes is None:
        missing = [run for run, schema in ((run_a, a), (run_b, b)) if schema is None]
        summary = ("schema not recorded for either run" if len(missing) == 2 else
                   f"schema not recorded for run {missing[0]!r} (written before value schemas were recorded)")
    else:
        summary = describe_changes(changes) if changes else "no schema change"
    return {"a": schema_columns(a), "b": schema_columns(b),
            "changes": msgspec.to_builtins(changes) if changes is not None else None, "summary": summary}


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
    ref_a, ref_b = manifest_ref_of_run(snapshots, run_a), manifest_ref_of_run(snapshots, run_b)
    a, b = snapshots.read_manifest(ref_a), snapshots.read_manifest(ref_b)
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
        manifest_a=ref_a.uri, manifest_b=ref_b.uri, schema_a=a.value_schema, schema_b=b.value_schema,
    )


def _layer_files(shard: ShardEntry) -> list[list[tuple[str, int, str]]]:
    return [sorted((f.name, f.size, f.checksum) for f in layer.files) for layer in shard.all_layers()]


def manifest_ref_of_run(snapshots: SnapshotRoot, run_id: str) -> ManifestRef:
    """The manifest the run's record names (no listing of every manifest of the root);
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
    return ref


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


# -- changed keys: bounded samples, fields that differ ------------------------------------------------

# Changed keys of each kind one shard's walk keeps, and the stored keys it walks to find them: a
# sample is a look at what changed, never a scan of the data.
SAMPLE_KEYS = 10
SAMPLE_SCAN_KEYS = 20_000

ChangeKind = Literal["inserted", "updated", "deleted"]
CHANGE_KINDS: tuple[ChangeKind, ...] = ("inserted", "updated", "deleted")


@dataclass(frozen=True)
class ShardSample:
    """Up to ``limit`` keys of each kind a shard's newer state changed against its older one, in key order."""

    db_id: int
    changes: tuple[dict[str, Any], ...]  # {key, kind: inserted/updated/deleted, before, after, fields}
    scanned: int  # stored keys walked (both states together)
    complete: bool  # every key of both states was walked: the sample is all there is (up to the limit)
    last_key: bytes | None = None  # the last stored key walked: a walk that stopped goes on after it

    def to_dict(self) -> dict[str, Any]:
        return {"db_id": self.db_id, "changes": list(self.changes), "scanned": self.scanned, "complete": self.complete}

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.changes if c["kind"] == kind]


def typed_comparison(value_format: str, schema: ValueSchema | None) -> Callable[[bytes], Any] | None:
    """What two stored values are compared by when their bytes differ: their typed values (SPEC §18),
    so a value the engine encoder wrote is not "updated" against the same value the Python encoder
    of earlier versions wrote (other timestamp text, maps as pairs); None: the bytes decide."""
    if value_format != "json" or schema is None:
        return None
    from airflow_provider_shardyfusion.core.read.value_decoding import value_decoder

    decode = value_decoder(value_format, schema, "typed")
    assert decode is not None  # json values always decode
    return decode


def shown_values(manifest: Manifest) -> Callable[[bytes], Any] | None:
    """How pages and the CLI show a run's values: typed, where its manifest has a value schema, so
    a timestamp stored as epoch microseconds (SPEC §18) shows as RFC 3339 text; None: as stored."""
    return typed_comparison(manifest.value_format, manifest.value_schema)


def sample_changes(db_id: int, before: Iterable[tuple[bytes, bytes]], after: Iterable[tuple[bytes, bytes]], *,
                   key_encoding: KeyEncoding, value_format: str, limit: int = SAMPLE_KEYS,
                   scan_limit: int = SAMPLE_SCAN_KEYS, typed: Callable[[bytes], Any] | None = None,
                   kinds: Iterable[str] = CHANGE_KINDS, expected: dict[str, int] | None = None,
                   after_key: bytes | None = None, shown: Callable[[bytes], Any] | None = None) -> ShardSample:
    """Walk two key-ordered states of one shard side by side: a key only in ``after`` was inserted,
    only in ``before`` deleted, in both with other bytes updated — other typed values, where
    ``typed`` (``typed_comparison``) is given. Keeps up to ``limit`` changes of each of ``kinds``,
    and stops once each has them, or has as many as ``expected`` says the shard holds (the counts
    a chain's writer stored: a kind the shard has none of is never waited for), or after
    ``scan_limit`` keys walked. ``after_key``: the walk goes on after that key (a page after the
    ``last_key`` of the one before; the states given may start at it). ``shown``
    (``shown_values``): how a value is shown, where not as its stored JSON."""
    wanted = {k: min(limit, (expected or {}).get(k, limit)) for k in kinds}
    wanted = {k: n for k, n in wanted.items() if n > 0}
    found: list[dict[str, Any]] = []
    counts = dict.fromkeys(wanted, 0)
    scanned = 0
    last: bytes | None = None
    if not wanted:
        return ShardSample(db_id, (), 0, complete=True)
    for key, old, new in _merged(iter(before), iter(after)):
        if after_key is not None and key <= after_key:
            continue
        scanned += (old is not None) + (new is not None)
        last = key
        if old != new:
            kind = "inserted" if old is None else "deleted" if new is None else "updated"
            if counts.get(kind, limit) < wanted.get(kind, 0):
                change = _change(key, kind, old, new, key_encoding, value_format, typed, shown)
                if change is not None:
                    found.append(change)
                    counts[kind] += 1
        if all(counts[k] >= n for k, n in wanted.items()) or scanned >= scan_limit:
            return ShardSample(db_id, tuple(found), scanned, complete=False, last_key=last)
    return ShardSample(db_id, tuple(found), scanned, complete=True, last_key=last)


def _change(key: bytes, kind: str, old: bytes | None, new: bytes | None, key_encoding: KeyEncoding, value_format: str,
            typed: Callable[[bytes], Any] | None, shown: Callable[[bytes], Any] | None) -> dict[str, Any] | None:
    """One changed key as pages show it; None for an update of equal typed values (no change)."""
    fields: list[str] = []
    if kind == "updated" and typed is not None:
        typed_old, typed_new = _typed_or_none(typed, old), _typed_or_none(typed, new)
        if typed_old is not None and typed_old == typed_new:
            return None
        fields = differing_fields(typed_old, typed_new)
    b = _shown_value(old, value_format, shown)
    a = _shown_value(new, value_format, shown)
    return {"key": _shown_key(key, key_encoding), "kind": kind, "before": b, "after": a,
            "fields": (fields or differing_fields(b, a)) if kind == "updated" else []}


def spread(items: Sequence[T], n: int) -> list[T]:
    """Up to ``n`` of ``items`` evenly apart, first and last included: a sample across all shards,
    not the first few."""
    if len(items) <= n:
        return list(items)
    if n <= 1:
        return list(items[:n])
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def comparison_between(before: Manifest, after: Manifest) -> Callable[[bytes], Any] | None:
    """``typed_comparison`` for two runs of one value format: bytes of two value encoders differ for
    equal values (SPEC §18), so values compare typed wherever either run has a value schema — equal
    encoder versions prove nothing, as a delta's base layers keep the bytes of the encoder that
    wrote them, and a run older than §18 has no schema of its own. Only keys whose bytes differ are
    decoded; None: the bytes decide."""
    if before.value_format != after.value_format:
        return None
    return typed_comparison(after.value_format, after.value_schema or before.value_schema)


CHANGE_KINDS = ("inserted", "updated", "deleted")


@dataclass(frozen=True)
class ChangedKeys:
    """Keys run ``b`` changed against run ``a``, in shard then key order, each with its before and after."""

    run_a: str
    run_b: str
    kinds: tuple[str, ...]
    changes: tuple[dict[str, Any], ...]  # {db_id, key, kind, before, after, fields}
    shards_changed: int  # shards whose files differ: the only ones that can hold a changed key
    shards_walked: int
    complete: bool  # every changed shard was walked to its end: there are no more keys of these kinds

    def to_dict(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "kinds": list(self.kinds), "changes": list(self.changes),
                "shards_changed": self.shards_changed, "shards_walked": self.shards_walked, "complete": self.complete}


def changed_keys(diff: RunDiff, before: Any, after: Any, *, kinds: Collection[str] = CHANGE_KINDS,
                 limit: int = 50) -> ChangedKeys:
    """Up to ``limit`` keys of ``kinds`` that changed from ``diff``'s run ``a`` to run ``b``.

    ``before`` and ``after`` are readers of the two runs (``ShardedReader(..., manifest_ref=...)``);
    only shards whose files differ are opened, each walked whole (``sample_changes``), until
    ``limit`` keys are found. Two runs sharded differently hold other keys in shard ``i``:
    ``ConfigError``."""
    if limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    unknown = sorted(set(kinds) - set(CHANGE_KINDS))
    if unknown:
        raise ConfigError(f"kinds {unknown} are not kinds of change ({', '.join(CHANGE_KINDS)})")
    if not diff.same_routing:
        raise ConfigError(f"runs {diff.run_a!r} and {diff.run_b!r} are sharded differently: "
                          "their keys cannot be compared shard by shard")
    typed = comparison_between(before.manifest, after.manifest)
    changed = [s.db_id for s in diff.shards if not s.same_files]
    found: list[dict[str, Any]] = []
    walked = 0
    complete = True
    for db_id in changed:
        if len(found) >= limit:
            complete = False
            break
        old, new = before.open_shard(db_id), after.open_shard(db_id)
        sample = sample_changes(db_id, old.items() if old is not None else (), new.items() if new is not None else (),
                                key_encoding=after.manifest.key_encoding, value_format=after.manifest.value_format,
                                limit=limit - len(found), scan_limit=sys.maxsize, typed=typed, kinds=set(kinds),
                                shown=shown_values(after.manifest))
        walked += 1
        # The sample keeps up to its limit of each kind, in key order: the first ones are the
        # first changed keys of the shard, whatever their kind.
        kept = sample.changes[:limit - len(found)]
        found.extend({"db_id": db_id, **c} for c in kept)
        complete = complete and sample.complete and len(kept) == len(sample.changes)
    return ChangedKeys(run_a=diff.run_a, run_b=diff.run_b, kinds=tuple(k for k in CHANGE_KINDS if k in kinds),
                       changes=tuple(found), shards_changed=len(changed), shards_walked=walked, complete=complete)


def _typed_or_none(typed: Callable[[bytes], Any], data: bytes | None) -> Any:
    try:
        return typed(data) if data is not None else None
    except ShardyfusionError:  # shown as stored, compared as bytes
        return None


def _merged(before: Iterator[tuple[bytes, bytes]],
            after: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    b, a = next(before, None), next(after, None)
    while b is not None or a is not None:
        if a is None or (b is not None and b[0] < a[0]):
            assert b is not None
            yield b[0], b[1], None
            b = next(before, None)
        elif b is None or a[0] < b[0]:
            yield a[0], None, a[1]
            a = next(after, None)
        else:
            yield a[0], b[1], a[1]
            b, a = next(before, None), next(after, None)


def _shown_key(data: bytes, key_encoding: KeyEncoding) -> Any:
    """A stored key as the key page takes it back (``encoding.key_to_show``); bytes that do not decode
    with the key encoding are shown as the raw bytes they are."""
    try:
        return encoding.key_to_show(encoding.decode_key(data, key_encoding))
    except ShardyfusionError:
        return encoding.key_to_show(bytes(data))


# Longest value a page shows; a longer one is cut (and is no longer valid JSON, so it is text).
VALUE_PREVIEW_CHARS = 2000


def json_value(value: Any) -> Any:
    """A decoded value as JSON can carry it: JSON values as they are, bytes as UTF-8 text; cut to
    ``VALUE_PREVIEW_CHARS`` characters of JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8", "replace")
    # Typed values as serve renders them: timestamps RFC 3339, decimals exact text, bytes base64.
    text = json.dumps(msgspec.to_builtins(value), default=str, ensure_ascii=False)
    if len(text) > VALUE_PREVIEW_CHARS:
        return text[:VALUE_PREVIEW_CHARS] + "…"
    return json.loads(text)


def _shown_value(data: bytes | None, value_format: str, shown: Callable[[bytes], Any] | None) -> Any:
    if data is None:
        return None
    try:
        return json_value(shown(data) if shown is not None else encoding.decode_value(data, value_format))
    except (ValueError, ShardyfusionError):
        return json_value(bytes(data))


def differing_fields(before: Any, after: Any) -> list[str]:
    """The top-level fields of two JSON objects that differ (present in one only, or other values);
    ``["(value)"]`` for two other values that differ, ``[]`` for equal ones."""
    if isinstance(before, dict) and isinstance(after, dict):
        return sorted(k for k in before.keys() | after.keys() if before.get(k, _ABSENT) != after.get(k, _ABSENT))
    return [] if before == after else ["(value)"]


_ABSENT = object()


def _differing_typed(before: Any, after: Any) -> list[str]:
    """``differing_fields`` of typed values, where a column one run's schema lacks reads None."""
    if isinstance(before, dict) and isinstance(after, dict):
        return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return differing_fields(before, after)


def rank_fields(changes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fields by how many updated keys of ``changes`` differ in them, most first (Hollow's diff ranking)."""
    counts = Counter(f for c in changes if c["kind"] == "updated" for f in c["fields"])
    return [{"field": f, "keys": n} for f, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


KeyFate = Literal["inserted", "updated", "deleted", "unchanged", "absent", "unknown"]


def key_fates(newest_first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each run did to one key against the retained run before it (rows ``{found, value}``,
    newest first, as the key look-up reads them): inserted / updated (with the fields that differ) /
    deleted / unchanged / absent; unknown next to a run whose look-up failed."""
    out = []
    for i, row in enumerate(newest_first):
        older = newest_first[i + 1] if i + 1 < len(newest_first) else None
        fate: KeyFate
        fields: list[str] = []
        if row.get("found") is None or (older is not None and older.get("found") is None):
            fate = "unknown"
        elif older is None or not older["found"]:
            fate = "inserted" if row["found"] else "absent"
        elif not row["found"]:
            fate = "deleted"
        else:
            # Typed values where the look-up gave them (SPEC §18): the same value written by two
            # encoders is unchanged.
            both_typed = older.get("typed") is not None and row.get("typed") is not None
            fields = (_differing_typed(older["typed"], row["typed"]) if both_typed
                      else differing_fields(older.get("value"), row.get("value")))
            fate = "updated" if fields else "unchanged"
        shown = {k: v for k, v in row.items() if k != "typed"}
        out.append({**shown, "fate": fate, "fields": fields, "compared_with": older["run_id"] if older else None,
                    "before": older.get("value") if older is not None and fate == "updated" else None})
    return out


def _ts(value: datetime | None) -> str | None:
    return layout.format_ts(value) if value is not None else None
