"""Deferred cleanup (SPEC §8, ``DeferredCleanupOperator``): what may go, decided without I/O, then done.

``plan_cleanup`` is a pure function of what was read (listing, run records, manifests, ``_CURRENT``,
the winning attempts of the runs that stay) and ``now``; ``make_plan`` does the reading and
``execute_cleanup`` carries a plan out. A dry run returns exactly the plan a real run would execute.

What is never touched: the run ``_CURRENT`` names, pinned runs (``keep_run_ids``), anything younger
than the grace period, a ``running`` run whose lease is valid, a run whose record cannot be read,
and objects whose keys this package does not recognise. Run records are never deleted: a run whose
data is gone keeps its record with ``deleted_at`` set, so the history stays auditable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args

from . import layout
from .errors import ConfigError, ManifestValidationError, RunAbandoned, RunRecordError, StorageError
from .pointer import CurrentPointer
from .run_record import FAILED, RUNNING, SUCCEEDED, RunError, RunRecord
from .storage.base import ObjectInfo

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from .snapshot import ManifestRef, SnapshotRoot

log = logging.getLogger(__name__)

Category = Literal["losing_attempts", "failed_runs", "abandoned_runs", "orphans", "expired_snapshots"]
CATEGORIES: tuple[str, ...] = get_args(Category)
_DELETE_BATCH = 1000  # one progress line per batch keeps a long cleanup visible


MAX_KEYS_LISTED = 500  # per plan item, in to_dict

@dataclass(frozen=True)
class PlannedObject:
    key: str
    size: int


@dataclass(frozen=True)
class PlanItem:
    """The objects of one run (or orphan folder) that go, and why.

    ``mark_deleted``: every object of the run goes, so its record gets ``deleted_at`` afterwards.
    ``expect_updated_at``: an abandoned run is marked failed only if its record is still the one
    planned on (a late heartbeat means the writer is alive after all).
    """

    category: Category
    run_id: str
    objects: tuple[PlannedObject, ...]
    mark_deleted: bool = False
    expect_updated_at: datetime | None = None

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category, "run_id": self.run_id, "objects": len(self.objects), "bytes": self.bytes,
            "mark_deleted": self.mark_deleted,
            "expect_updated_at": layout.format_ts(self.expect_updated_at) if self.expect_updated_at else None,
            # Capped: the plan travels as XCom, and a run of 4000 shards has tens of thousands of keys.
            "keys": [o.key for o in self.objects[:MAX_KEYS_LISTED]],
            "keys_truncated": len(self.objects) > MAX_KEYS_LISTED,
        }


@dataclass(frozen=True)
class Skipped:
    run_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "reason": self.reason}


@dataclass(frozen=True)
class CleanupPlan:
    root: str
    made_at: datetime
    current: CurrentPointer | None  # the pointer the plan was made against
    keep_runs: int
    grace_period: timedelta
    keep_run_ids: tuple[str, ...]
    items: tuple[PlanItem, ...]
    skipped: tuple[Skipped, ...] = ()

    def of(self, category: str) -> tuple[PlanItem, ...]:
        return tuple(i for i in self.items if i.category == category)

    @property
    def abandoned_run_ids(self) -> tuple[str, ...]:
        """Running runs with a long-expired lease: marked failed ("abandoned") before their data goes."""
        return tuple(i.run_id for i in self.of("abandoned_runs"))

    def totals(self) -> dict[str, dict[str, int]]:
        return {c: {"runs": len(self.of(c)), "objects": sum(len(i.objects) for i in self.of(c)),
                    "bytes": sum(i.bytes for i in self.of(c))} for c in CATEGORIES}

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_uri": self.root, "made_at": layout.format_ts(self.made_at),
            "current_run_id": self.current.run_id if self.current else None,
            "current_manifest_ref": self.current.manifest_ref if self.current else None,
            "keep_runs": self.keep_runs, "grace_period_seconds": self.grace_period.total_seconds(),
            "keep_run_ids": list(self.keep_run_ids),
            "totals": self.totals(),
            "objects": sum(len(i.objects) for i in self.items), "bytes": sum(i.bytes for i in self.items),
            "abandoned_run_ids": list(self.abandoned_run_ids),
            "items": [i.to_dict() for i in self.items],
            "skipped": [s.to_dict() for s in self.skipped],
        }


@dataclass(frozen=True)
class CleanupReport:
    plan: CleanupPlan
    dry_run: bool
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)  # category -> objects, bytes
    errors: tuple[tuple[str, str], ...] = ()  # (key or run_id, message)
    marked_failed: tuple[str, ...] = ()
    marked_deleted: tuple[str, ...] = ()
    skipped_runs: tuple[Skipped, ...] = ()  # planned, then left alone at execution
    abandoned: bool = False  # _CURRENT moved after planning: the rest of the plan was not executed
    abandon_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        deleted = {c: dict(self.deleted.get(c, {"objects": 0, "bytes": 0})) for c in CATEGORIES}
        return {
            "dry_run": self.dry_run, "abandoned": self.abandoned, "abandon_reason": self.abandon_reason,
            "deleted": deleted,
            "deleted_objects": sum(d["objects"] for d in deleted.values()),
            "deleted_bytes": sum(d["bytes"] for d in deleted.values()),
            "errors": [{"target": k, "error": e} for k, e in self.errors],
            "marked_failed": list(self.marked_failed), "marked_deleted": list(self.marked_deleted),
            "skipped_at_execution": [s.to_dict() for s in self.skipped_runs],
            "plan": self.plan.to_dict(),
        }


# ---- the plan (pure) -------------------------------------------------------------------------


def check_settings(keep_runs: object, grace_period: object, keep_run_ids: object) -> tuple[int, timedelta, tuple[str, ...]]:
    """Validate cleanup settings; ``grace_period`` may be a timedelta or seconds, ``keep_run_ids`` one id or many."""
    if isinstance(keep_runs, bool) or not isinstance(keep_runs, int) or keep_runs < 0:
        raise ConfigError(f"keep_runs {keep_runs!r} must be an integer >= 0")
    if isinstance(grace_period, (int, float)) and not isinstance(grace_period, bool):
        grace_period = timedelta(seconds=grace_period)
    if not isinstance(grace_period, timedelta) or grace_period < timedelta(0):
        raise ConfigError(f"grace_period {grace_period!r} must be a timedelta (or seconds) >= 0")
    ids: Iterable[object]
    if keep_run_ids is None:
        ids = ()
    elif isinstance(keep_run_ids, str):
        ids = (keep_run_ids,)
    elif isinstance(keep_run_ids, (list, tuple, set, frozenset)):
        ids = keep_run_ids
    else:
        raise ConfigError(f"keep_run_ids {keep_run_ids!r} must be a list of run ids")
    return keep_runs, grace_period, tuple(sorted(layout.validate_run_id(r, what="keep_run_ids entry") for r in ids))


def _last_activity(record: RunRecord) -> datetime:
    # Not updated_at: bookkeeping (deleted_at, published_at stamps) moves it, and must not make an old
    # run look young again. A running run is judged by its lease instead.
    stamps = [record.started_at, record.finished_at, record.published_at]
    return max(s for s in stamps if s is not None)


def _succeeded_by_age(runs: Mapping[str, RunRecord | None]) -> list[str]:
    """Succeeded (and staged) runs whose data is still there, newest start first."""
    live = [(r.started_at, rid) for rid, r in runs.items()
            if r is not None and r.status == SUCCEEDED and r.deleted_at is None]
    return [rid for _, rid in sorted(live, reverse=True)]


def runs_needing_winners(runs: Mapping[str, RunRecord | None], keep_runs: int) -> list[str]:
    """The kept succeeded runs whose losing attempts the plan may delete: it needs their winners."""
    return _succeeded_by_age(runs)[:keep_runs]


def plan_cleanup(
    listing: Iterable[ObjectInfo],
    runs: Mapping[str, RunRecord | None],
    manifests: Iterable[ManifestRef],
    pointer: CurrentPointer | None,
    now: datetime,
    *,
    keep_runs: int = 3,
    grace_period: timedelta = timedelta(hours=1),
    keep_run_ids: Collection[str] = (),
    winners: Mapping[str, Collection[str]] | None = None,
    root: str = "",
) -> CleanupPlan:
    """Decide what a cleanup deletes. No I/O.

    ``listing``: objects under ``shards/`` and ``manifests/`` (sizes, last_modified); ``runs``: every
    run record by run id (``None``: the record exists but cannot be read, so the run is left alone);
    ``winners``: for the runs ``runs_needing_winners`` names, the attempt keys their manifest uses
    (``layout.attempt_key`` form); a run missing from it keeps all its attempts.
    """
    keep_runs, grace_period, pinned = check_settings(keep_runs, grace_period, tuple(keep_run_ids))
    winners = winners or {}
    cutoff = now - grace_period
    live_run = pointer.run_id if pointer is not None else None

    shard_objects: dict[str, list[ObjectInfo]] = {}
    sizes: dict[str, ObjectInfo] = {}
    for info in listing:
        sizes[info.key] = info
        parsed = layout.parse_shard_key(info.key)
        if parsed is not None and parsed.rest:  # only objects inside a db folder; unknown keys are not ours
            shard_objects.setdefault(parsed.run_id, []).append(info)
    manifests_of: dict[str, list[ObjectInfo]] = {}
    for ref in manifests:
        info = sizes.get(ref.key) or ObjectInfo(ref.key, 0, ref.published_at)
        manifests_of.setdefault(ref.run_id, []).append(info)

    kept = set(_succeeded_by_age(runs)[:keep_runs])
    items: list[PlanItem] = []
    skipped: list[Skipped] = []

    def old(objs: Iterable[ObjectInfo]) -> list[ObjectInfo]:
        # An object without a modification time is treated as young: never delete what we cannot date.
        return [o for o in objs if o.last_modified is not None and o.last_modified <= cutoff]

    def add(category: Category, run_id: str, objs: list[ObjectInfo], every: list[ObjectInfo],
            record: RunRecord | None, expect: datetime | None = None) -> None:
        doomed = old(objs)
        young = len(objs) - len(doomed)
        if young:
            skipped.append(Skipped(run_id, f"{young} object(s) younger than the grace period kept ({category})"))
        # The record says "deleted" only when nothing of the run is left behind.
        mark = record is not None and record.deleted_at is None and len(doomed) == len(every)
        if doomed or mark or expect is not None:
            planned = tuple(PlannedObject(o.key, o.size) for o in sorted(doomed, key=lambda o: o.key))
            items.append(PlanItem(category, run_id, planned,
                                  mark_deleted=mark, expect_updated_at=expect))

    for run_id in sorted(set(runs) | set(shard_objects) | set(manifests_of)):
        shards = shard_objects.get(run_id, [])
        data = shards + manifests_of.get(run_id, [])
        if run_id == live_run:
            skipped.append(Skipped(run_id, "named by _CURRENT"))
            continue
        if run_id in pinned:
            skipped.append(Skipped(run_id, "pinned (keep_run_ids)"))
            continue
        if pointer is not None and run_id == pointer.previous_run_id and pointer.updated_at > cutoff:
            # Live until the last move: readers that have not refreshed yet still read it.
            skipped.append(Skipped(run_id, "named by _CURRENT less than the grace period ago"))
            continue
        if run_id not in runs:
            # A manifest without a record is left alone: only shard folders are orphans. The whole
            # folder waits until its newest object is past the grace period.
            if shards and len(old(shards)) == len(shards):
                add("orphans", run_id, shards, shards, None)
            elif shards:
                skipped.append(Skipped(run_id, "orphan shard folder younger than the grace period"))
            continue
        record = runs[run_id]
        if record is None:
            skipped.append(Skipped(run_id, "run record cannot be read"))
            continue
        if record.status == RUNNING:
            if not record.lease_expired(now):
                skipped.append(Skipped(run_id, "running with a valid lease"))
            elif record.lease_expires_at > cutoff:
                skipped.append(Skipped(run_id, "lease expired less than the grace period ago"))
            else:
                add("abandoned_runs", run_id, data, data, record, expect=record.updated_at)
            continue
        if _last_activity(record) > cutoff:
            if data:
                skipped.append(Skipped(run_id, "younger than the grace period"))
            continue
        if record.status == FAILED:
            add("failed_runs", run_id, data, data, record)
        elif record.deleted_at is not None or run_id not in kept:
            add("expired_snapshots", run_id, data, data, record)
        elif run_id in winners:
            keep = tuple(w.rstrip("/") + "/" for w in winners[run_id])
            losing = [o for o in shards if not o.key.startswith(keep)]
            if losing:
                add("losing_attempts", run_id, losing, data, None)
        elif shards:
            skipped.append(Skipped(run_id, "winning attempts unknown (manifest unreadable); attempts kept"))

    order = {c: n for n, c in enumerate(CATEGORIES)}
    items.sort(key=lambda i: (order[i.category], i.run_id))
    return CleanupPlan(root=root, made_at=now, current=pointer, keep_runs=keep_runs, grace_period=grace_period,
                       keep_run_ids=pinned, items=tuple(items), skipped=tuple(skipped))


# ---- reading and executing -------------------------------------------------------------------


def read_winners(snapshots: SnapshotRoot, runs: Mapping[str, RunRecord | None], run_ids: Iterable[str]) -> dict[str, set[str]]:
    """Winning attempt keys of each run, from the manifest its record names; unreadable ones are left out."""
    out: dict[str, set[str]] = {}
    for run_id in run_ids:
        record = runs.get(run_id)
        try:
            ref = (snapshots.manifest_ref(record.manifest_ref) if record is not None and record.manifest_ref
                   else snapshots.find_manifest(run_id))
            if ref is None:
                raise ManifestValidationError("no manifest")
            manifest = snapshots.read_manifest(ref)
            out[run_id] = {snapshots.store.key_of(s.db_url).rstrip("/") for s in manifest.shards}
        except (StorageError, ManifestValidationError) as exc:
            log.warning("cleanup: winning attempts of run %s unknown (%s); its attempts are kept", run_id, exc)
    return out


def make_plan(snapshots: SnapshotRoot, *, now: datetime | None = None, keep_runs: int = 3,
              grace_period: timedelta | float = timedelta(hours=1), keep_run_ids: Collection[str] = ()) -> CleanupPlan:
    """Read the root (pointer first: anything published later is newer than the plan) and plan."""
    keep_runs, grace_period, pinned = check_settings(keep_runs, grace_period, tuple(keep_run_ids))
    pointer = snapshots.current()
    runs: dict[str, RunRecord | None] = {}
    for run_id, record, error in snapshots.iter_runs():
        if error is not None:
            log.warning("cleanup: run record of %s unreadable (%s); the run is left alone", run_id, error)
        runs[run_id] = record
    store = snapshots.store
    listing = [*store.list(layout.SHARDS_DIR + "/"), *store.list(layout.MANIFESTS_DIR + "/")]
    manifests = snapshots.list_manifests()
    winners = read_winners(snapshots, runs, runs_needing_winners(runs, keep_runs))
    plan = plan_cleanup(listing, runs, manifests, pointer, now or layout.utc_now(), keep_runs=keep_runs,
                        grace_period=grace_period, keep_run_ids=pinned, winners=winners, root=snapshots.root)
    for category, t in plan.totals().items():
        if t["runs"]:
            log.info("cleanup plan for %s: %s: %d run(s), %d object(s), %d bytes", snapshots.root, category,
                     t["runs"], t["objects"], t["bytes"])
    return plan


def _mark_abandoned(snapshots: SnapshotRoot, item: PlanItem) -> bool:
    """Mark a planned abandoned run failed, unless its record changed since planning."""
    error = RunAbandoned(f"abandoned: lease expired and reaped by cleanup (last heartbeat "
                         f"{layout.format_ts(item.expect_updated_at) if item.expect_updated_at else '?'})")
    done = False

    def change(record: RunRecord) -> RunRecord | None:
        nonlocal done
        done = False
        if record.status != RUNNING or record.updated_at != item.expect_updated_at:
            return None
        now = layout.utc_now()
        done = True
        return replace(record, status=FAILED, finished_at=now,
                       error=RunError(type=type(error).__name__, message=str(error)))

    snapshots.update_run(item.run_id, change)
    return done


def _mark_deleted(snapshots: SnapshotRoot, run_id: str) -> bool:
    marked = False

    def change(record: RunRecord) -> RunRecord | None:
        nonlocal marked
        marked = record.deleted_at is None
        return replace(record, deleted_at=layout.utc_now()) if marked else None

    snapshots.update_run(run_id, change)
    return marked


def execute_cleanup(snapshots: SnapshotRoot, plan: CleanupPlan, *, dry_run: bool = False) -> CleanupReport:
    """Carry ``plan`` out; ``dry_run`` writes and deletes nothing and reports the plan as is.

    Abandoned runs are marked failed first (skipped if their record changed since planning).
    ``_CURRENT`` is re-read before each run's deletions: if it moved since the plan was made, the
    rest of the plan is abandoned (a publish or rollback raced the cleanup; plan again). A deletion
    failure is reported and the rest goes on; a run whose data is all gone gets ``deleted_at``.
    """
    if dry_run:
        log.info("cleanup of %s: dry run; would delete %d object(s), %d bytes", plan.root,
                 sum(len(i.objects) for i in plan.items), sum(i.bytes for i in plan.items))
        return CleanupReport(plan=plan, dry_run=True)
    store = snapshots.store
    deleted = {c: {"objects": 0, "bytes": 0} for c in CATEGORIES}
    errors: list[tuple[str, str]] = []
    marked_failed: list[str] = []
    marked_deleted: list[str] = []
    skipped: list[Skipped] = []

    runnable: list[PlanItem] = []
    for item in plan.items:
        if item.category != "abandoned_runs":
            runnable.append(item)
            continue
        try:
            if _mark_abandoned(snapshots, item):
                marked_failed.append(item.run_id)
                log.info("cleanup: run %s marked failed (abandoned: lease expired)", item.run_id)
                runnable.append(item)
            else:
                skipped.append(Skipped(item.run_id, "run record changed since planning (writer alive?); kept"))
        except (StorageError, RunRecordError) as exc:
            errors.append((item.run_id, f"could not mark the run failed: {exc}"))

    expected = plan.current.to_dict() if plan.current is not None else None

    def report(abandon_reason: str | None = None) -> CleanupReport:
        for category, d in deleted.items():
            if d["objects"]:
                log.info("cleanup of %s: %s: %d object(s), %d bytes deleted", plan.root, category, d["objects"], d["bytes"])
        return CleanupReport(plan=plan, dry_run=False, deleted=deleted, errors=tuple(errors),
                             marked_failed=tuple(marked_failed), marked_deleted=tuple(marked_deleted),
                             skipped_runs=tuple(skipped), abandoned=abandon_reason is not None,
                             abandon_reason=abandon_reason)

    for item in runnable:
        try:
            now_current = snapshots.current()
        except (StorageError, ManifestValidationError) as exc:
            return report(f"_CURRENT could not be re-read before deleting ({exc}); nothing more deleted")
        if (now_current.to_dict() if now_current is not None else None) != expected:
            reason = (f"_CURRENT moved since the plan was made (was run "
                      f"{plan.current.run_id if plan.current else None}, now "
                      f"{now_current.run_id if now_current else None}); the rest of the plan is abandoned")
            log.warning("cleanup of %s: %s", plan.root, reason)
            return report(reason)
        failed: dict[str, str] = {}
        objs = list(item.objects)
        for start in range(0, len(objs), _DELETE_BATCH):
            batch = objs[start:start + _DELETE_BATCH]
            try:
                failed.update(store.delete_many([o.key for o in batch]))
            except Exception as exc:  # delete_many should report per key; a whole-batch failure still must not stop the rest
                failed.update({o.key: f"{type(exc).__name__}: {exc}" for o in batch})
            log.info("cleanup: %s of run %s: %d/%d object(s) processed", item.category, item.run_id,
                     min(start + _DELETE_BATCH, len(objs)), len(objs))
        for o in objs:
            if o.key in failed:
                errors.append((o.key, failed[o.key]))
            else:
                deleted[item.category]["objects"] += 1
                deleted[item.category]["bytes"] += o.size
        if item.mark_deleted and not failed:
            try:
                if _mark_deleted(snapshots, item.run_id):
                    marked_deleted.append(item.run_id)
            except (StorageError, RunRecordError) as exc:
                errors.append((item.run_id, f"data deleted but deleted_at not recorded: {exc}"))
    return report()
