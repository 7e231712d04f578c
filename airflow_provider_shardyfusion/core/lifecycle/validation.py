"""Validation of a snapshot before (or after) it goes live (SPEC §8, ``ValidateManifestOperator``).

Every check runs even when an earlier one failed, so one run of the gate lists everything that
is wrong with a staged snapshot; the failures are raised together as one
``ManifestValidationError``. The look-ups go through ``ShardedReader`` pinned to the manifest, so
they prove exactly what a reader would do (routing, download, checksums, key and value decoding).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec
import xxhash

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.arguments import as_int, as_list, as_number
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError, ShardyfusionError, show_value
from airflow_provider_shardyfusion.core.lifecycle import integrity
from airflow_provider_shardyfusion.core.model.encoding import decode_key, key_from_text, key_to_show
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED, RunRecord
from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef, SnapshotRoot
from airflow_provider_shardyfusion.core.model.value_schema import SchemaChange, schema_changes
from airflow_provider_shardyfusion.core.write.job_contract import RunStats

if TYPE_CHECKING:
    from datetime import datetime

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.storage.base import StorageOptions

__all__ = [
    "SCHEMA_CHANGE_POLICIES", "Check", "Lookup", "ValidationReport", "chain_samples", "record_report", "sample_keys",
    "schema_change_check", "schema_change_policy", "threshold_checks", "validate_snapshot", "value_digest",
]

log = logging.getLogger(__name__)

# Keep the XCom small: the report lists at most this many look-ups / missing keys by name.
_MAX_LISTED = 50


@dataclass(frozen=True)
class Check:
    """One check: its figure (what was measured), the limit it was held to, and the outcome.

    ``skipped`` checks (nothing to compare with) count as passed and say why in ``detail``.
    """

    name: str
    ok: bool
    figure: Any = None
    limit: Any = None
    detail: str = ""
    skipped: bool = False
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "skipped": self.skipped, "figure": self.figure,
                "limit": self.limit, "detail": self.detail, "problems": list(self.problems)}

    def describe(self) -> str:
        state = "skipped" if self.skipped else ("ok" if self.ok else "FAILED")
        limit = f" (limit {self.limit})" if self.limit is not None else ""
        return f"{self.name}: {state}; figure {self.figure}{limit}" + (f"; {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Lookup:
    """One key read through the reader: where it routes, whether it was found, a digest of its value."""

    key: Any  # JSON-able: int, str, or {"hex": ...} for bytes
    source: str  # "sample" (a shard's min/max key) or "expected"
    db_id: int | None
    found: bool
    value_digest: str | None = None  # xxh3_64 of the stored value bytes (the JSON encoding for json values)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "source": self.source, "db_id": self.db_id, "found": self.found,
                "value_digest": self.value_digest}


@dataclass(frozen=True)
class ValidationReport:
    """The result of validating one manifest: every check with its figure, limit and problems, and the look-ups."""

    output_uri: str
    run_id: str | None
    manifest_ref: str | None
    live: bool  # the manifest is the one _CURRENT names
    checks: tuple[Check, ...]
    num_dbs: int | None = None
    rows: int | None = None
    lookups: tuple[Lookup, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[str]:
        return [p for c in self.checks if not c.ok for p in c.problems]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "output_uri": self.output_uri, "run_id": self.run_id, "manifest_ref": self.manifest_ref,
            "live": self.live, "num_dbs": self.num_dbs, "rows": self.rows,
            "checks": [c.to_dict() for c in self.checks], "failures": self.failures,
            "lookups": [lk.to_dict() for lk in self.lookups[:_MAX_LISTED]], "lookups_total": len(self.lookups),
        }


# ---- storage ------------------------------------------------------------------------------------


# ---- thresholds (pure) --------------------------------------------------------------------------


def _limit(name: str, value: Any, *, integer: bool) -> float | int | None:
    """A threshold as given (``core.arguments`` rules); ``None`` means not asked."""
    if value is None:
        return None
    return as_int(name, value, minimum=0) if integer else as_number(name, value, minimum=0)


def threshold_checks(
    manifest: Manifest,
    *,
    baseline_rows: int | None = None,
    baseline_note: str = "",
    min_rows: int | None = None,
    max_row_change_ratio: float | None = None,
    max_empty_shards: int | None = None,
    max_shard_skew: float | None = None,
    max_delta_ratio: float | None = None,
) -> list[Check]:
    """The data-quality thresholds of one manifest; only the ones asked for are returned."""
    checks: list[Check] = []
    if max_delta_ratio is not None:
        checks.append(_delta_ratio_check(manifest, max_delta_ratio))
    rows = manifest.row_count
    where = f"run {manifest.run_id!r}"
    if min_rows is not None:
        ok = rows >= min_rows
        checks.append(Check(
            "min_rows", ok, figure=rows, limit=min_rows, detail=f"{rows} rows",
            problems=() if ok else (f"{where}: {rows} rows, fewer than min_rows {min_rows}",),
        ))
    if max_row_change_ratio is not None:
        if baseline_rows is None:
            checks.append(Check("max_row_change_ratio", True, limit=max_row_change_ratio, skipped=True,
                                detail=baseline_note or "no baseline snapshot to compare with"))
        elif baseline_rows == 0:
            checks.append(Check("max_row_change_ratio", True, limit=max_row_change_ratio, skipped=True,
                                detail=f"the baseline ({baseline_note}) has 0 rows: the ratio is undefined"))
        else:
            ratio = abs(rows - baseline_rows) / baseline_rows
            ok = ratio <= max_row_change_ratio
            detail = f"{rows} rows against {baseline_rows} in the baseline ({baseline_note})"
            checks.append(Check(
                "max_row_change_ratio", ok, figure=round(ratio, 6), limit=max_row_change_ratio, detail=detail,
                problems=() if ok else (
                    f"{where}: row change ratio {ratio:.4f} exceeds max_row_change_ratio {max_row_change_ratio} "
                    f"({detail})",),
            ))
    if max_empty_shards is not None:
        # Shards absent from the sparse manifest are empty; a listed shard with 0 rows is empty too.
        empty = manifest.num_dbs - sum(1 for s in manifest.shards if s.row_count > 0)
        ok = empty <= max_empty_shards
        checks.append(Check(
            "max_empty_shards", ok, figure=empty, limit=max_empty_shards, detail=f"{empty} of {manifest.num_dbs} shards empty",
            problems=() if ok else (f"{where}: {empty} of {manifest.num_dbs} shards are empty, more than max_empty_shards "
                                    f"{max_empty_shards}",),
        ))
    if max_shard_skew is not None:
        if rows == 0:
            checks.append(Check("max_shard_skew", True, limit=max_shard_skew, skipped=True,
                                detail="the snapshot has no rows: skew is undefined"))
        else:
            largest = max(manifest.shards, key=lambda s: (s.row_count, -s.db_id))
            mean = rows / manifest.num_dbs
            skew = largest.row_count / mean
            ok = skew <= max_shard_skew
            detail = f"largest shard {largest.db_id} has {largest.row_count} rows, mean {mean:.2f} over {manifest.num_dbs} shards"
            checks.append(Check(
                "max_shard_skew", ok, figure=round(skew, 6), limit=max_shard_skew, detail=detail,
                problems=() if ok else (f"{where}: shard skew {skew:.4f} exceeds max_shard_skew {max_shard_skew} ({detail})",),
            ))
    return checks


# ---- value schema against the live run's (SPEC §18, pure) ---------------------------------------

# What each ``schema_change`` lets through: readers of the live snapshot keep working across a
# nullable added column (old rows decode it as None), not across a removed or retyped one.
SCHEMA_CHANGE_POLICIES = ("additions", "none", "any")
_POLICY_RULE = {"additions": "allows only added nullable columns", "none": "allows no change"}


def schema_change_policy(value: Any) -> str:
    """``schema_change`` as given (or rendered from a template): one of ``SCHEMA_CHANGE_POLICIES``."""
    policy = value.strip() if isinstance(value, str) else value
    if policy not in SCHEMA_CHANGE_POLICIES:
        raise ConfigError(
            f"schema_change {show_value(value)} must be one of {list(SCHEMA_CHANGE_POLICIES)}: 'additions' passes "
            "only added nullable columns, 'none' no change at all, 'any' every change (still reported)")
    return str(policy)


def _allowed(change: SchemaChange, policy: str) -> bool:
    return policy == "any" or (policy == "additions" and change.is_nullable_addition)


def schema_change_check(manifest: Manifest, live: Manifest | None, policy: str = "additions", *,
                        no_live: str = "no live run to compare with") -> Check:
    """The run's value schema against the live run's, held to ``policy`` (``schema_change_policy``).

    The figure lists every change (``column``, ``kind``, ``old`` / ``new`` type); a change the policy
    refuses is a problem naming the column and both types. Skipped, saying why, when there is no
    live run (``no_live``) or either run recorded no schema (written before SPEC §18).
    """
    def skipped(detail: str) -> Check:
        return Check("schema_change", True, limit=policy, skipped=True, detail=detail)

    unrecorded = "recorded no value schema (written before value schemas were recorded)"
    if manifest.value_schema is None:
        return skipped(f"run {manifest.run_id!r} {unrecorded}")
    if live is None:
        return skipped(no_live)
    against = f"live run {live.run_id!r}"
    if live.value_schema is None:
        return skipped(f"the {against} {unrecorded}")
    changes = schema_changes(live.value_schema, manifest.value_schema)
    refused = [c for c in changes if not _allowed(c, policy)]
    figure = msgspec.to_builtins(changes)
    detail = (f"against {against}: " + "; ".join(c.describe() for c in changes)) if changes else \
        f"no change against {against}"
    return Check("schema_change", not refused, figure=figure, limit=policy, detail=detail, problems=tuple(
        f"run {manifest.run_id!r}: value schema against {against}: {c.describe()} "
        f"(schema_change={policy!r} {_POLICY_RULE[policy]})" for c in refused))


def _delta_ratio_check(manifest: Manifest, limit: float) -> Check:
    """(puts + deletes) of the run's own layers over the rows of its base (SPEC §13).

    A delta written compacted (its base was at ``max_chain_depth``) has no layers of its own to
    count: its change counts are the run's stats, which the writer totals over the same layers.
    """
    stats = manifest.stats or {}
    if manifest.write_mode == "compact" and RunStats.from_dict(stats).write_mode == "delta":
        changes = _stat(stats, "puts") + _stat(stats, "deletes")
        base_rows = _stat(stats, "base_rows")
        how = " (written compacted)"
    elif manifest.write_mode != "delta":
        return Check("max_delta_ratio", True, limit=limit, skipped=True,
                     detail=f"a {manifest.write_mode} run, not a delta")
    else:
        own = [layer for s in manifest.shards for layer in s.layers if layer.run_id == manifest.run_id]
        changes = sum(layer.puts + layer.deletes for layer in own)
        base_rows = manifest.row_count - sum(layer.inserted - layer.deleted for layer in own)
        how = ""
    detail = f"{changes} puts and deletes on base run {manifest.base_run_id!r} of {base_rows} rows{how}"
    if base_rows == 0:
        return Check("max_delta_ratio", True, limit=limit, skipped=True, detail=f"{detail}: the ratio is undefined")
    ratio = changes / base_rows
    ok = ratio <= limit
    return Check("max_delta_ratio", ok, figure=round(ratio, 6), limit=limit, detail=detail,
                 problems=() if ok else (f"run {manifest.run_id!r}: delta ratio {ratio:.4f} exceeds max_delta_ratio "
                                         f"{limit} ({detail})",))


def _stat(stats: dict[str, Any], name: str) -> int:
    value = stats.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestValidationError(f"manifest stats.{name} {value!r} must be a count (an integer >= 0)")
    return value


def sample_keys(manifest: Manifest, n: int) -> list[tuple[int, Any]]:
    """Up to ``n`` distinct ``(db_id, key)`` from the shards' min/max keys, spread over the shards.

    Every shard's min key first (in shard order), then the max keys, so a small ``n`` still
    touches as many shards as possible. Raises ``ManifestValidationError`` for a key that does not
    decode with the manifest's key encoding.
    """
    if n <= 0:
        return []
    shards = sorted(manifest.shards, key=lambda s: s.db_id)
    out: list[tuple[int, Any]] = []
    seen: set[tuple[int, bytes]] = set()
    for attr in ("min_key", "max_key"):
        for shard in shards:
            if len(out) >= n:
                return out
            if shard.row_count == 0 or shard.layers:  # a chain's key range may name deleted keys: see chain_samples
                continue
            text = getattr(shard, attr)
            try:
                raw = bytes.fromhex(text)
                key = decode_key(raw, manifest.key_encoding)
            except (ValueError, ShardyfusionError) as exc:
                raise ManifestValidationError(
                    f"shard {shard.db_id} of run {manifest.run_id!r}: {attr} {text!r} does not decode as "
                    f"{manifest.key_encoding}: {exc}"
                ) from None
            if (shard.db_id, raw) not in seen:
                seen.add((shard.db_id, raw))
                out.append((shard.db_id, key))
    return out


def value_digest(value: Any, value_format: str) -> str:
    """Digest the report records for a value read back: xxh3_64 of its bytes (binary values) or of
    its compact, key-sorted JSON (json values), so a caller can compare it with the value it expects."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        data = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")
    return f"xxh3_64:{xxhash.xxh3_64(data).hexdigest()}"


# ---- the whole validation -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    ref: ManifestRef | None
    run_id: str | None
    live_pointer: CurrentPointer | None
    live: bool


def _key_list(name: str, keys: Any) -> list[Any]:
    """A list of keys as given, or read from its rendered text (``core.arguments``)."""
    if isinstance(keys, str):
        keys = as_list(name, keys)
    if keys is not None and (isinstance(keys, bytes) or not isinstance(keys, Iterable)):
        raise ConfigError(f"{name} {show_value(keys)} must be a list of keys")
    return list(keys) if keys is not None else []


def validate_snapshot(
    snapshots: SnapshotRoot,
    *,
    run_id: str | None = None,
    manifest_ref: str | None = None,
    min_rows: int | None = None,
    max_row_change_ratio: float | None = None,
    max_empty_shards: int | None = None,
    max_shard_skew: float | None = None,
    sample_lookups: int = 0,
    expected_keys: Iterable[Any] | None = None,
    verify_checksums: bool = False,
    max_delta_ratio: float | None = None,
    absent_keys: Iterable[Any] | None = None,
    cache_dir: str | None = None,
    storage_options: StorageOptions | Mapping[str, Any] | None = None,
    schema_change: str = "additions",
) -> ValidationReport:
    """Check one snapshot (the live one when neither ``run_id`` nor ``manifest_ref`` is given).

    ``schema_change`` holds the run's value schema against the live run's: ``"additions"`` passes
    only added nullable columns, ``"none"`` no change, ``"any"`` every change (still reported).

    Returns the report when every check passed; otherwise raises one ``ManifestValidationError``
    listing every failure (the report is on the exception as ``.report``, the list as ``.failures``).
    """
    min_rows = _limit("min_rows", min_rows, integer=True)  # type: ignore[assignment]
    max_row_change_ratio = _limit("max_row_change_ratio", max_row_change_ratio, integer=False)
    max_empty_shards = _limit("max_empty_shards", max_empty_shards, integer=True)  # type: ignore[assignment]
    max_shard_skew = _limit("max_shard_skew", max_shard_skew, integer=False)
    max_delta_ratio = _limit("max_delta_ratio", max_delta_ratio, integer=False)
    schema_change = schema_change_policy(schema_change)
    sample_lookups = _limit("sample_lookups", sample_lookups or 0, integer=True)  # type: ignore[assignment]
    expected = _key_list("expected_keys", expected_keys)
    absent = _key_list("absent_keys", absent_keys)
    if run_id is not None:
        layout.validate_run_id(run_id)

    checks: list[Check] = []
    target = _resolve(snapshots, run_id, manifest_ref, checks)
    manifest = _structure(snapshots, target, checks) if target.ref is not None else None
    if manifest is not None:
        checks.append(_storage_check(snapshots, manifest, verify_checksums))
    if target.run_id is not None:
        checks.append(_run_record_check(snapshots, target))
    lookups: list[Lookup] = []
    if manifest is not None:
        # Read once for both comparisons, and only when one of them needs it.
        live, no_live = (None, "")
        if max_row_change_ratio is not None or manifest.value_schema is not None:
            live, no_live = _live_manifest(snapshots, target)
        baseline_rows, note = (None, "")
        if max_row_change_ratio is not None:
            baseline_rows, note = _baseline(snapshots, manifest, live)
        checks.extend(threshold_checks(
            manifest, baseline_rows=baseline_rows, baseline_note=note, min_rows=min_rows,
            max_row_change_ratio=max_row_change_ratio, max_empty_shards=max_empty_shards, max_shard_skew=max_shard_skew,
            max_delta_ratio=max_delta_ratio,
        ))
        checks.append(schema_change_check(manifest, live, schema_change, no_live=no_live))
        if sample_lookups or expected or absent:
            check, lookups = _lookup_check(snapshots, target, manifest, sample_lookups, expected, cache_dir,
                                           storage_options, absent)
            checks.append(check)
    report = ValidationReport(
        output_uri=snapshots.root, run_id=target.run_id, manifest_ref=target.ref.uri if target.ref else None,
        live=target.live, checks=tuple(checks), num_dbs=manifest.num_dbs if manifest else None,
        rows=manifest.row_count if manifest else None, lookups=tuple(lookups),
    )
    record_report(snapshots, report)
    if not report.ok:
        failures = report.failures
        what = f"run {report.run_id!r}" if report.run_id else "the snapshot"
        raise ManifestValidationError(
            f"validation of {what} at {snapshots.root} failed with {len(failures)} problem(s):\n"
            + "\n".join(f"- {p}" for p in failures),
            report=report,
        )
    return report


def record_report(snapshots: SnapshotRoot, report: ValidationReport, when: datetime | None = None) -> None:
    """Keep the report's outcome in the run's record (``validation``), for the history UI and audits.

    Best effort: the report is the result; a record that cannot be written is logged, not raised.
    """
    if report.run_id is None:
        return
    summary = {
        "ok": report.ok, "validated_at": layout.format_ts(when or layout.utc_now()), "live": report.live,
        "manifest_ref": report.manifest_ref, "rows": report.rows, "failures": report.failures[:_MAX_LISTED],
        "checks": [{"name": c.name, "ok": c.ok, "skipped": c.skipped, "figure": c.figure, "limit": c.limit}
                   for c in report.checks],
    }
    try:
        snapshots.update_run(report.run_id, lambda r: replace(r, validation=summary))
    except ShardyfusionError as exc:
        log.warning("run %s: validation report not recorded in its run record: %s", report.run_id, exc)


def _storage_check(snapshots: SnapshotRoot, manifest: Manifest, verify_checksums: bool) -> Check:
    try:
        problems = integrity.check_storage(snapshots, manifest, verify_checksums=verify_checksums)
    except ShardyfusionError as exc:
        problems = [f"storage of run {manifest.run_id!r}: {exc}"]
    # Every layer's files: a delta's shard is read from its base's layers and its own.
    files = sum(len(layer.files) for s in manifest.shards for layer in s.all_layers())
    return Check(
        "storage", not problems, figure={"shards": len(manifest.shards), "files": files, "bytes": manifest.byte_size},
        detail=("files present with their recorded sizes" + (" and checksums" if verify_checksums else ""))
        if not problems else f"{len(problems)} problem(s)",
        problems=tuple(problems),
    )


def _resolve(snapshots: SnapshotRoot, run_id: str | None, manifest_ref: str | None, checks: list[Check]) -> _Target:
    try:
        live = snapshots.current()
    except ShardyfusionError as exc:
        live = None
        if run_id is None and manifest_ref is None:
            checks.append(Check("structure", False, detail="_CURRENT is unreadable",
                                problems=(f"_CURRENT at {snapshots.root}: {exc}",)))
            return _Target(None, None, None, False)
        log.warning("%s: _CURRENT is unreadable (%s); validating without the live snapshot", snapshots.root, exc)
    if run_id is None and manifest_ref is None:
        if live is None:
            checks.append(Check("structure", False, detail="no live snapshot", problems=(
                f"no snapshot is published at {snapshots.root} (_CURRENT does not exist); give run_id or manifest_ref",)))
            return _Target(None, None, None, False)
        manifest_ref = live.manifest_ref
    try:
        ref = snapshots.resolve_manifest(run_id=run_id, manifest_ref=manifest_ref)
    except ShardyfusionError as exc:
        checks.append(Check("structure", False, detail="manifest not found", problems=(f"{exc}",)))
        return _Target(None, run_id, live, False)
    is_live = live is not None and live.manifest_ref == ref.uri
    return _Target(ref, ref.run_id, live, is_live)


def _structure(snapshots: SnapshotRoot, target: _Target, checks: list[Check]) -> Manifest | None:
    """Parse and validate the manifest exactly as a reader following it would (SPEC §7)."""
    ref = target.ref
    assert ref is not None
    # The live manifest is checked against the checksum _CURRENT recorded; another one against
    # the pointer a publish would write (root, run and shard folders).
    pointer = target.live_pointer if target.live and target.live_pointer is not None else CurrentPointer(
        manifest_ref=ref.uri, run_id=ref.run_id, updated_at=ref.published_at)
    try:
        pointer.check_root(snapshots.root)
        manifest = snapshots.read_manifest(pointer)
    except ShardyfusionError as exc:
        checks.append(Check("structure", False, detail="manifest is invalid", problems=(f"{ref.uri}: {exc}",)))
        return None
    checks.append(Check(
        "structure", True, figure={"format_version": manifest.format_version, "num_dbs": manifest.num_dbs,
                                   "shards": len(manifest.shards)},
        detail=f"manifest {ref.uri} is valid",
    ))
    return manifest


def _run_record_check(snapshots: SnapshotRoot, target: _Target) -> Check:
    run_id = target.run_id
    assert run_id is not None
    where = f"run record {snapshots.run_record_ref(run_id)}"
    try:
        record = snapshots.read_run(run_id)
    except ShardyfusionError as exc:
        return Check("run_record", False, detail="unreadable", problems=(f"{where}: {exc}",))
    if record is None:
        return Check("run_record", False, detail="missing", problems=(f"{where} does not exist",))
    problems = integrity.record_problems(record, target.ref, where) if target.ref is not None else []
    if target.ref is not None and record.manifest_ref is None:
        problems.append(f"{where}: names no manifest, not the validated {target.ref.uri!r}")
    if target.ref is not None and not problems:
        try:
            problems = integrity.manifest_problems(record, target.ref, snapshots.store.get(target.ref.key).data)
        except ShardyfusionError as exc:
            problems = [f"manifest {target.ref.uri}: {exc}"]
    identity = "checksum recorded by the writer" if record.manifest_checksum else "no manifest checksum recorded"
    return Check("run_record", not problems, figure=record.status,
                 detail=f"status {record.status}, published_at "
                        f"{layout.format_ts(record.published_at) if record.published_at else None}; {identity}",
                 problems=tuple(problems))


def _started(record: RunRecord | None, manifest: Manifest | None) -> datetime | None:
    if manifest is not None and manifest.run_started_at is not None:
        return manifest.run_started_at
    return record.started_at if record is not None else None


def _live_manifest(snapshots: SnapshotRoot, target: _Target) -> tuple[Manifest | None, str]:
    """The live run's manifest when another run is validated (what its rows and schema are compared
    with), or why there is none."""
    live = target.live_pointer
    if live is None:
        return None, "no live run to compare with"
    if target.live:
        return None, "the validated run is the live run"
    try:
        return snapshots.read_manifest(live), ""
    except ShardyfusionError as exc:
        log.warning("live manifest %s is unreadable (%s)", live.manifest_ref, exc)
        return None, f"the live manifest {live.manifest_ref} is unreadable ({exc})"


def _baseline(snapshots: SnapshotRoot, manifest: Manifest, live: Manifest | None) -> tuple[int | None, str]:
    """Rows to compare with: the live snapshot for another run, else the newest older succeeded run."""
    if live is not None:
        return live.row_count, f"live run {live.run_id!r}"
    try:
        own_record = snapshots.read_run(manifest.run_id)
    except ShardyfusionError:
        own_record = None
    ours = _started(own_record, manifest)
    best: tuple[datetime, RunRecord] | None = None
    for other_id, record, _ in snapshots.iter_runs():
        if (record is None or other_id == manifest.run_id or record.status != SUCCEEDED
                or record.deleted_at is not None or not record.manifest_ref):
            continue
        if ours is not None and record.started_at >= ours:
            continue
        if best is None or record.started_at > best[0]:
            best = (record.started_at, record)
    if best is None:
        return None, "no live snapshot and no older succeeded run to compare with"
    record = best[1]
    try:
        rows = snapshots.read_manifest(record.manifest_ref or "").row_count
    except ShardyfusionError as exc:
        return None, f"the manifest of the older run {record.run_id!r} is unreadable ({exc})"
    return rows, f"older succeeded run {record.run_id!r}"


def chain_samples(reader: Any, manifest: Manifest, n: int) -> list[tuple[int, Any]]:
    """Up to ``n`` ``(db_id, key)``: the first and last key a chain shard really holds, read through
    its layers (its recorded key range may name keys a later layer deleted)."""
    out: list[tuple[int, Any]] = []
    for shard in sorted(manifest.shards, key=lambda s: s.db_id):
        if len(out) >= n:
            break
        if shard.row_count == 0 or not shard.layers:
            continue
        db = reader.open_shard(shard.db_id)
        ends = []
        for seek in ("seek_to_first", "seek_to_last"):
            it = db.iter()
            getattr(it, seek)()
            if it.valid():
                ends.append(bytes(it.key()))
        for raw in dict.fromkeys(ends):
            if len(out) < n:
                out.append((shard.db_id, decode_key(raw, manifest.key_encoding)))
    return out


def _unroutable_by_key(manifest: Manifest, expected: Sequence[Any], absent: Sequence[Any] = ()) -> Check | None:
    """The look-up check when the key alone cannot be routed (CEL over other columns), else None.

    The routing context of each row is not in the manifest: sampled look-ups are skipped, but keys
    the user asked for must not pass unchecked.
    """
    sharding = manifest.sharding
    if sharding.strategy != "cel" or not set(sharding.cel_columns or {}) - {sharding.key_column}:
        return None
    why = f"CEL routing over columns {sorted(sharding.cel_columns or {})} needs more than the key"
    asked = [name for name, keys in (("expected_keys", expected), ("absent_keys", absent)) if keys]
    if asked:
        return Check("lookups", False, detail=why, problems=(
            f"run {manifest.run_id!r}: {' and '.join(asked)} cannot be looked up by key alone: {why}; check them "
            "with ShardedReader.get(key, routing_context=...) instead",))
    return Check("lookups", True, skipped=True, detail=why)


def _lookup_problem(where: str, key: Any, source: str, home: int | None, db_id: int, hit: bool) -> str | None:
    """What one look-up says is wrong (a missing expected key is collected apart, to be listed once)."""
    if home is not None and db_id != home:
        return (f"{where}: key {show_value(key)} is stored in shard {home} but routes to shard {db_id}: reader and "
                "writer disagree on routing")
    if source == "absent" and hit:
        return f"{where}: key {show_value(key)} should be absent (deleted) but reads a value from shard {db_id}"
    if source == "sample" and not hit:
        return f"{where}: key {show_value(key)} (min/max key of shard {home}) is not found in shard {db_id}"
    return None


def _lookup_check(
    snapshots: SnapshotRoot,
    target: _Target,
    manifest: Manifest,
    sample_lookups: int,
    expected: Sequence[Any],
    cache_dir: str | None,
    storage_options: StorageOptions | Mapping[str, Any] | None,
    absent: Sequence[Any] = (),
) -> tuple[Check, list[Lookup]]:
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

    assert target.ref is not None
    unroutable = _unroutable_by_key(manifest, expected, absent)
    if unroutable is not None:
        return unroutable, []
    where = f"run {manifest.run_id!r}"
    problems: list[str] = []
    try:
        samples = sample_keys(manifest, sample_lookups)
    except ManifestValidationError as exc:
        samples = []
        problems.append(str(exc))
    wanted: list[tuple[int | None, Any, str]] = [(db_id, key, "sample") for db_id, key in samples]
    # Templates render lists of text: a text key is read as the snapshot's key type.
    wanted += [(None, key_from_text(key, manifest.key_encoding) if isinstance(key, str) else key, why)
               for keys, why in ((expected, "expected"), (absent, "absent")) for key in keys]
    lookups: list[Lookup] = []
    missing_expected: list[Any] = []
    try:
        # value_digest hashes the JSON form of a value: read values as JSON, not typed.
        with ShardedReader(snapshots.root, manifest_ref=target.ref.uri, cache_dir=cache_dir,
                           storage_options=storage_options, value_decoding="json") as reader:
            chained = chain_samples(reader, manifest, sample_lookups - len(samples))
            wanted[len(samples):len(samples)] = [(db_id, key, "sample") for db_id, key in chained]
            samples += chained
            for home, key, source in wanted:
                try:
                    db_id = reader.shard_for_key(key)
                    value = reader.get(key)
                except ShardyfusionError as exc:
                    problems.append(f"{where}: look-up of {source} key {show_value(key)} failed: {type(exc).__name__}: {exc}")
                    lookups.append(Lookup(key_to_show(key), source, None, False))
                    continue
                hit = value is not None
                lookups.append(Lookup(key_to_show(key), source, db_id, hit,
                                      value_digest(value, manifest.value_format) if hit else None))
                problem = _lookup_problem(where, key, source, home, db_id, hit)
                if problem:
                    problems.append(problem)
                elif source == "expected" and not hit:
                    missing_expected.append(key)
    except ShardyfusionError as exc:
        problems.append(f"{where}: the reader could not open {target.ref.uri}: {type(exc).__name__}: {exc}")
    if missing_expected:
        shown = ", ".join(show_value(k) for k in missing_expected[:_MAX_LISTED])
        more = f" and {len(missing_expected) - _MAX_LISTED} more" if len(missing_expected) > _MAX_LISTED else ""
        problems.append(f"{where}: {len(missing_expected)} of {len(expected)} expected keys are missing: {shown}{more}")
    found: int = sum(1 for lk in lookups if lk.found)
    # A key asked to be absent and not found is as expected: "2 of 4 read" would read like a failure.
    as_expected = sum(1 for lk in lookups if lk.found == (lk.source != "absent"))
    figure = {"sampled": len(samples), "expected": len(expected), "absent": len(absent), "found": found,
              "missing_expected": len(missing_expected)}
    detail = (f"{as_expected} of {len(wanted)} as expected ({found} present, {len(lookups) - found} absent), "
              "looked up through ShardedReader")
    return Check("lookups", not problems, figure=figure, detail=detail, problems=tuple(problems)), lookups
