"""Deferred cleanup carried out (SPEC §8, ``DeferredCleanupOperator``): a root read into a plan, then done.

``make_plan`` reads the root (and what each kept run's chain reads) into ``core.lifecycle.cleanup_plan``'s
pure rules; ``execute_cleanup`` carries a plan out, fenced against a publish that lands meanwhile.
A dry run returns exactly the plan a real run would execute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ClockSkewError,
    ManifestValidationError,
    RunAbandoned,
    RunRecordError,
    StorageError,
)
from airflow_provider_shardyfusion.core.lifecycle.cleanup_plan import (
    CATEGORIES,
    CleanupPlan,
    PlanItem,
    Skipped,
    check_settings,
    plan_cleanup,
    runs_needing_winners,
)
from airflow_provider_shardyfusion.core.model.run_record import (
    FAILED,
    PUBLISH_CLAIM_HONOURED,
    RUNNING,
    RunError,
    RunRecord,
    check_storage_clock,
)
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.write.job_contract import RunStats

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer

__all__ = [
    "CleanupReport", "chain_reads", "execute_cleanup", "layer_references", "make_plan", "read_winners",
]

log = logging.getLogger(__name__)

_DELETE_BATCH = 1000  # one progress line per batch keeps a long cleanup visible


@dataclass(frozen=True)
class CleanupReport:
    """What executing a plan did: objects and bytes deleted per category, errors, runs marked, and why it stopped early."""

    plan: CleanupPlan
    dry_run: bool
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)  # category -> objects, bytes
    errors: tuple[tuple[str, str], ...] = ()  # (key or run_id, message)
    marked_failed: tuple[str, ...] = ()
    marked_deleted: tuple[str, ...] = ()
    skipped_runs: tuple[Skipped, ...] = ()  # planned, then left alone at execution
    abandoned: bool = False  # _CURRENT moved after planning: the rest of the plan was not executed
    abandon_reason: str | None = None

    def raise_if_nothing_deleted(self) -> None:
        """A cleanup that deleted nothing and met errors failed (not a quiet success)."""
        planned = sum(len(i.objects) for i in self.plan.items)
        if self.dry_run or not self.errors or any(d["objects"] for d in self.deleted.values()):
            return
        listed = "; ".join(f"{target}: {error}" for target, error in self.errors[:10])
        more = f" (and {len(self.errors) - 10} more)" if len(self.errors) > 10 else ""
        raise StorageError(f"cleanup of {self.plan.root} deleted none of {planned} planned object(s): "
                           f"{len(self.errors)} error(s): {listed}{more}")

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
            out[run_id] = {snapshots.store.key_of(layer.db_url).rstrip("/")
                           for s in manifest.shards for layer in s.all_layers() if layer.run_id == run_id}
        except (StorageError, ManifestValidationError) as exc:
            log.warning("cleanup: winning attempts of run %s unknown (%s); its attempts are kept", run_id, exc)
    return out


class _ReadsUnknown(Exception):
    """What a kept run reads cannot be told: it keeps every run cleanup would delete."""


def chain_reads(snapshots: SnapshotRoot, run_id: str, runs: Mapping[str, RunRecord | None],
                pointer: CurrentPointer | None = None, *, seen: frozenset[str] = frozenset()) -> set[str]:
    """The other runs whose layers or manifests ``run_id``'s snapshot reads (or will read, while it is written).

    From its manifest (the one ``_CURRENT`` names for the live run); without one, from the base its
    run record names (a chain run records it before writing any layer) and what that base reads.
    Raises ``_ReadsUnknown`` when neither tells.
    """
    record = runs.get(run_id)
    if record is not None and (record.status == FAILED or record.deleted_at is not None):
        return set()  # nothing may read it
    uri = pointer.manifest_ref if pointer is not None and pointer.run_id == run_id else (record.manifest_ref if record else None)
    try:
        ref = snapshots.manifest_ref(uri) if uri else snapshots.find_manifest(run_id)
        if ref is not None:
            # A delta's manifest is read through its base's (SPEC §17): those runs keep their manifests
            # too, including a run that wrote no layer.
            resolved = snapshots.read_manifest_chain(ref)
            ancestors = {snapshots.manifest_ref(uri).run_id for uri in resolved.ancestors}
            return (resolved.manifest.layer_run_ids() | ancestors) - {run_id}
        why = f"run {run_id} has no manifest"
    except (StorageError, ManifestValidationError) as exc:
        why = f"the manifest of run {run_id} cannot be read: {exc}"
    base = RunStats.from_dict(record.stats).base_run_id if record is not None else None
    if base is not None and base != run_id and base not in seen:
        return {base} | chain_reads(snapshots, base, runs, seen=seen | {run_id})
    if record is not None and record.status == RUNNING:
        return set()  # a full write, or a chain not yet on its base: no layer of another run written on yet
    raise _ReadsUnknown(why if record is not None else f"{why} and its run record cannot be read")


def layer_references(snapshots: SnapshotRoot, runs: Mapping[str, RunRecord | None], kept: Iterable[str], *,
                     within: Collection[str], pointer: CurrentPointer | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Runs of ``within`` whose layers a ``kept`` run reads -> that run; and the kept runs whose reads
    cannot be told (``chain_reads``) -> why: each of those keeps every run of ``within`` not already kept.
    """
    out: dict[str, str] = {}
    unknown: dict[str, str] = {}
    if not within:
        return out, unknown
    for run_id in sorted(kept):
        try:
            for layer_run in sorted(chain_reads(snapshots, run_id, runs, pointer) & set(within)):
                out.setdefault(layer_run, run_id)
        except _ReadsUnknown as exc:
            log.warning("cleanup: what kept run %s reads is unknown (%s); every run cleanup would delete is kept",
                        run_id, exc)
            unknown[run_id] = str(exc)
    for run_id in sorted(unknown):
        for layer_run in sorted(within):
            out.setdefault(layer_run, run_id)
    return out, unknown


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
    now = now or layout.utc_now()

    plan = plan_cleanup(listing, runs, manifests, pointer, now, keep_runs=keep_runs, grace_period=grace_period,
                        keep_run_ids=pinned, winners=winners, root=snapshots.root)
    # A chain's layers live in the folders of the runs that wrote them: a run the plan keeps may
    # read layers of a run it deletes, whatever that run's record says (or if it has none). Plan
    # again with those runs kept (references only point to older runs, and a kept run's manifest
    # lists every layer it reads, so once is enough).
    doomed = {i.run_id for i in plan.items if i.category != "losing_attempts"}
    readable = {*runs, *(m.run_id for m in manifests), *pinned, *([pointer.run_id] if pointer else [])}
    referenced, unknown = layer_references(snapshots, runs, readable - doomed, within=doomed, pointer=pointer)
    if referenced:
        plan = plan_cleanup(listing, runs, manifests, pointer, now, keep_runs=keep_runs, grace_period=grace_period,
                            keep_run_ids=pinned, winners=winners, root=snapshots.root, referenced_by=referenced,
                            unknown_reads=unknown)
    for skipped in plan.skipped:
        if skipped.rule == "referenced" and skipped.run_id not in runs:
            log.warning("cleanup: run %s has no run record, but it is kept: %s", skipped.run_id, skipped.reason)
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


def _claim_for_deletion(snapshots: SnapshotRoot, run_id: str, *, check_clock: bool = False) -> str | None:
    """Stamp ``deleting_at`` on the run's record (one conditional put); the reason it was refused, if so.

    The cleanup side of the fence with publish: a publisher claims ``publishing_at`` the same way
    before it checks the files and moves ``_CURRENT``, and refuses a run claimed for deletion. A
    claim younger than ``PUBLISH_CLAIM_HONOURED`` (the publisher's ``PUBLISH_CLAIM_TTL`` plus room for
    both clocks' skew and the pointer move's retries) means a publish may be under way: the run is left alone.
    One attempt only: a record that changed since it was read (a publisher claimed it, a pointer
    move stamped it) is left alone too; the next cleanup plans it again. ``check_clock``: compare
    this machine's clock with the storage's stamp of the claim (``ClockSkewError``, the claim
    released): claims are judged by this clock.
    """
    refusal: list[str] = []
    stamped: list[datetime] = []

    def claim(record: RunRecord) -> RunRecord | None:
        now = layout.utc_now()
        stamped[:] = [now]
        if record.publishing_at is not None and now - record.publishing_at < PUBLISH_CLAIM_HONOURED:
            refusal.append(f"a publish claimed it at {layout.format_ts(record.publishing_at)}; kept")
            return None
        return replace(record, deleting_at=now)

    try:
        snapshots.update_run(run_id, claim, attempts=1)
    except RunRecordError as exc:
        return f"run record changed while claiming it for deletion (a publish may have claimed it); kept: {exc}"
    if refusal:
        return refusal[0]
    if check_clock and stamped:
        try:
            check_storage_clock(snapshots.store, layout.run_record_key(run_id), stamped[0],
                                "the machine running the cleanup")
        except ClockSkewError:
            _release_claim(snapshots, run_id)
            raise
    return None


def _release_claim(snapshots: SnapshotRoot, run_id: str) -> None:
    try:
        snapshots.update_run(run_id, lambda r: replace(r, deleting_at=None) if r.deleted_at is None else None)
    except (StorageError, RunRecordError) as exc:
        log.warning("cleanup: run %s is left undeleted; could not clear its deleting_at: %s", run_id, exc)


# Categories whose run may otherwise be published (or whose record says what the run is): claimed
# before their data goes. Losing attempts belong to kept runs, orphans have no record.
_CLAIMED: frozenset[str] = frozenset({"expired_snapshots", "failed_runs", "abandoned_runs"})


@dataclass
class _Execution:
    """What one ``execute_cleanup`` has done so far (mutable while it runs)."""

    snapshots: SnapshotRoot
    plan: CleanupPlan
    deleted: dict[str, dict[str, int]] = field(default_factory=lambda: {c: {"objects": 0, "bytes": 0} for c in CATEGORIES})
    errors: list[tuple[str, str]] = field(default_factory=list)
    marked_failed: list[str] = field(default_factory=list)
    marked_deleted: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    clock_checked: bool = False  # once per execution, on the first claim it stamps

    def report(self, abandon_reason: str | None = None) -> CleanupReport:
        for category, d in self.deleted.items():
            if d["objects"]:
                log.info("cleanup of %s: %s: %d object(s), %d bytes deleted", self.plan.root, category, d["objects"],
                         d["bytes"])
        return CleanupReport(plan=self.plan, dry_run=False, deleted=self.deleted, errors=tuple(self.errors),
                             marked_failed=tuple(self.marked_failed), marked_deleted=tuple(self.marked_deleted),
                             skipped_runs=tuple(self.skipped), abandoned=abandon_reason is not None,
                             abandon_reason=abandon_reason)

    def pointer_moved(self, run_id: str | None = None) -> str | None:
        """Why the plan no longer holds (``_CURRENT`` unreadable or moved since planning), if so."""
        plan = self.plan
        try:
            now_current = self.snapshots.current()
        except (StorageError, ManifestValidationError) as exc:
            return f"_CURRENT could not be re-read before deleting ({exc}); nothing more deleted"
        expected = plan.current.to_dict() if plan.current is not None else None
        if (now_current.to_dict() if now_current is not None else None) == expected:
            return None
        if now_current is not None and now_current.run_id == run_id:
            return (f"run {run_id} is live: _CURRENT moved to it since the plan was made (a publish or rollback "
                    "raced the cleanup); it was not deleted, and the rest of the plan is abandoned")
        return (f"_CURRENT moved since the plan was made (was run {plan.current.run_id if plan.current else None}, "
                f"now {now_current.run_id if now_current else None}); the rest of the plan is abandoned")

    def mark_abandoned(self, item: PlanItem) -> bool:
        try:
            if _mark_abandoned(self.snapshots, item):
                self.marked_failed.append(item.run_id)
                log.info("cleanup: run %s marked failed (abandoned: lease expired)", item.run_id)
                return True
            self.skipped.append(Skipped(item.run_id, "run record changed since planning (writer alive?); kept"))
        except (StorageError, RunRecordError) as exc:
            self.errors.append((item.run_id, f"could not mark the run failed: {exc}"))
        return False

    def claim(self, item: PlanItem) -> bool:
        """Claim the run before deleting its data (``_CLAIMED`` categories); False: leave it alone."""
        if item.category not in _CLAIMED:
            return True
        try:
            refused = _claim_for_deletion(self.snapshots, item.run_id, check_clock=not self.clock_checked)
        except ClockSkewError:
            raise  # every claim of this cleanup would be judged by that clock: stop before deleting anything
        except (StorageError, RunRecordError) as exc:
            self.errors.append((item.run_id, f"could not claim the run for deletion: {exc}"))
            return False
        if refused is not None:
            self.skipped.append(Skipped(item.run_id, refused, rule="fence"))
            return False
        self.clock_checked = True
        return True

    def _count(self, item: PlanItem, failed: Mapping[str, str]) -> None:
        for o in item.objects:
            if o.key in failed:
                self.errors.append((o.key, failed[o.key]))
            else:
                self.deleted[item.category]["objects"] += 1
                self.deleted[item.category]["bytes"] += o.size

    def delete(self, item: PlanItem) -> str | None:
        """Delete one item's objects in batches, re-checking ``_CURRENT`` before each batch."""
        failed: dict[str, str] = {}
        objs = list(item.objects)
        for start in range(0, len(objs), _DELETE_BATCH):
            moved = self.pointer_moved(item.run_id) if start else None  # the caller checked before the first batch
            if moved is not None:
                return moved
            batch = objs[start:start + _DELETE_BATCH]
            try:
                failed.update(self.snapshots.store.delete_many([o.key for o in batch]))
            except Exception as exc:  # delete_many should report per key; a whole-batch failure still must not stop the rest
                failed.update({o.key: f"{type(exc).__name__}: {exc}" for o in batch})
            log.info("cleanup: %s of run %s: %d/%d object(s) processed", item.category, item.run_id,
                     min(start + _DELETE_BATCH, len(objs)), len(objs))
        self._count(item, failed)
        if objs and len(failed) == len(objs) and item.category in _CLAIMED:
            _release_claim(self.snapshots, item.run_id)  # nothing of it deleted: publishable again
        if item.mark_deleted and not failed:
            try:
                if _mark_deleted(self.snapshots, item.run_id):
                    self.marked_deleted.append(item.run_id)
            except (StorageError, RunRecordError) as exc:
                self.errors.append((item.run_id, f"data deleted but deleted_at not recorded: {exc}"))
        return None


def execute_cleanup(snapshots: SnapshotRoot, plan: CleanupPlan, *, dry_run: bool = False) -> CleanupReport:
    """Carry ``plan`` out; ``dry_run`` writes and deletes nothing and reports the plan as is.

    Abandoned runs are marked failed first (skipped if their record changed since planning). A
    succeeded, failed or abandoned run is claimed (``deleting_at``) before its data goes, and left
    alone if a publish claimed it or its record changed meanwhile; ``_CURRENT`` is re-read after the
    claim and before every batch of deletions: if it moved since the plan was made, the rest of the
    plan is abandoned, and a run it now names keeps its data and loses its claim (a publish or
    rollback raced the cleanup; plan again). A deletion failure is reported and the rest goes on; a run whose data
    is all gone gets ``deleted_at``.
    """
    if dry_run:
        log.info("cleanup of %s: dry run; would delete %d object(s), %d bytes", plan.root,
                 sum(len(i.objects) for i in plan.items), sum(i.bytes for i in plan.items))
        return CleanupReport(plan=plan, dry_run=True)
    run = _Execution(snapshots, plan)
    runnable = [i for i in plan.items if i.category != "abandoned_runs" or run.mark_abandoned(i)]
    for item in runnable:
        if not run.claim(item):
            continue
        stop = run.pointer_moved(item.run_id)
        if stop is not None and item.category in _CLAIMED:
            _release_claim(snapshots, item.run_id)  # nothing of it deleted yet: publishable again
        stop = stop or run.delete(item)
        if stop is not None:
            log.warning("cleanup of %s: %s", plan.root, stop)
            return run.report(stop)
    return run.report()
