"""Deferred cleanup's rules (SPEC §8): what may go, decided from what was read, without any I/O.

``plan_cleanup`` is a pure function of what was read (listing, run records, manifests, ``_CURRENT``,
the winning attempts of the runs that stay) and ``now``: each run is judged by ``RULES``, first
verdict wins. ``core.lifecycle.cleanup`` reads a root into it and carries the plan out.

What is never touched: the run ``_CURRENT`` names, pinned runs (``keep_run_ids``), anything younger
than the grace period, a ``running`` run whose lease is valid, a run whose record cannot be read,
and objects whose keys this package does not recognise. Run records are never deleted: a run whose
data is gone keeps its record with ``deleted_at`` set, so the history stays auditable.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.arguments import as_duration, as_int, as_list
from airflow_provider_shardyfusion.core.errors import (
    CleanupRefusedError,
    ConfigError,
)
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import (
    FAILED,
    PUBLISH_CLAIM_HONOURED,
    RUNNING,
    SUCCEEDED,
    RunRecord,
)
from airflow_provider_shardyfusion.core.storage.base import ObjectInfo

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef

__all__ = [
    "CATEGORIES", "MAX_KEYS_LISTED", "RULES", "Category", "CleanupPlan", "Decision", "PlanContext", "PlanItem",
    "PlannedObject", "Rule", "RunData", "Skipped", "check_settings", "live_until", "plan_cleanup",
    "refuse_without_pointer", "rule_expired", "rule_failed", "rule_live", "rule_losing_attempts", "rule_orphan",
    "rule_pinned", "rule_recently_live", "rule_referenced", "rule_running", "rule_unreadable", "rule_young",
    "runs_needing_winners",
]

Category = Literal["losing_attempts", "failed_runs", "abandoned_runs", "orphans", "expired_snapshots"]
CATEGORIES: tuple[str, ...] = get_args(Category)


MAX_KEYS_LISTED = 500  # per plan item, in to_dict

@dataclass(frozen=True)
class PlannedObject:
    """One object a plan deletes: its key and size (for the byte counts of the report)."""

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
    rule: str | None = None  # the rule of the plan that decided it

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category, "run_id": self.run_id, "objects": len(self.objects), "bytes": self.bytes,
            "mark_deleted": self.mark_deleted, "rule": self.rule,
            "expect_updated_at": layout.format_ts(self.expect_updated_at) if self.expect_updated_at else None,
            # Capped: the plan travels as XCom, and a run of 4000 shards has tens of thousands of keys.
            "keys": [o.key for o in self.objects[:MAX_KEYS_LISTED]],
            "keys_truncated": len(self.objects) > MAX_KEYS_LISTED,
        }


@dataclass(frozen=True)
class Skipped:
    """A run (or some of its objects) the plan leaves alone, why, and which rule said so."""

    run_id: str
    reason: str
    rule: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "reason": self.reason, "rule": self.rule}


@dataclass(frozen=True)
class CleanupPlan:
    """What a cleanup will delete and leave alone, decided against one ``_CURRENT``; the same plan a dry run reports."""

    root: str
    made_at: datetime
    current: CurrentPointer | None  # the pointer the plan was made against
    keep_runs: int
    grace_period: timedelta
    keep_run_ids: tuple[str, ...]
    items: tuple[PlanItem, ...]
    skipped: tuple[Skipped, ...] = ()
    decided_by: Mapping[str, str] = field(default_factory=dict)  # run id -> the rule that decided it

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
            "decided_by": dict(sorted(self.decided_by.items())),
        }


# ---- the plan (pure) -------------------------------------------------------------------------


def check_settings(keep_runs: object, grace_period: object, keep_run_ids: object) -> tuple[int, timedelta, tuple[str, ...]]:
    """Validate cleanup settings (``core.arguments`` rules: rendered text is read as its value);
    ``grace_period`` may be a timedelta or seconds, ``keep_run_ids`` one id or many."""
    runs = as_int("keep_runs", keep_runs, minimum=0)
    grace = as_duration("grace_period", grace_period)
    ids: Iterable[object]
    if keep_run_ids is None:
        ids = ()
    elif isinstance(keep_run_ids, str):
        ids = as_list("keep_run_ids", keep_run_ids) if keep_run_ids.lstrip().startswith(("[", "(")) else (keep_run_ids,)
    elif isinstance(keep_run_ids, (list, tuple, set, frozenset)):
        ids = keep_run_ids
    else:
        raise ConfigError(f"keep_run_ids {keep_run_ids!r} must be a list of run ids")
    return runs, grace, tuple(sorted(layout.validate_run_id(r, what="keep_run_ids entry") for r in ids))


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


@dataclass(frozen=True)
class RunData:
    """What the listing holds of one run: its shard objects and its manifest(s)."""

    run_id: str
    known: bool  # a run record exists (readable or not)
    record: RunRecord | None
    shards: tuple[ObjectInfo, ...]
    manifests: tuple[ObjectInfo, ...]

    @property
    def data(self) -> list[ObjectInfo]:
        return [*self.shards, *self.manifests]


@dataclass(frozen=True)
class PlanContext:
    """Everything a rule may consult besides the run itself (fixed for one plan)."""

    now: datetime
    cutoff: datetime  # now - grace period: anything newer is left alone
    pointer: CurrentPointer | None
    pinned: frozenset[str]
    kept: frozenset[str]  # the newest keep_runs succeeded runs
    winners: Mapping[str, Collection[str]]
    live_until: Mapping[str, datetime]  # when each run that was ever live stopped being live (at the latest)
    # Runs whose layers a kept run's manifest reads (SPEC §13) -> that kept run.
    referenced_by: Mapping[str, str] = field(default_factory=dict)
    # Kept runs whose reads cannot be told (manifest missing or unreadable) -> why: they keep every candidate.
    unknown_reads: Mapping[str, str] = field(default_factory=dict)

    def old(self, objs: Iterable[ObjectInfo]) -> list[ObjectInfo]:
        # An object without a modification time is treated as young: never delete what we cannot date.
        return [o for o in objs if o.last_modified is not None and o.last_modified <= self.cutoff]


@dataclass(frozen=True)
class Decision:
    """A rule's verdict on one run: skip it (``reason``), or delete ``objects`` as ``category``."""

    rule: str
    reason: str | None = None
    category: Category | None = None
    objects: tuple[ObjectInfo, ...] = ()
    every: tuple[ObjectInfo, ...] = ()  # all of the run's data: its record is marked deleted only if all goes
    record: RunRecord | None = None
    expect_updated_at: datetime | None = None


Rule = Callable[[RunData, PlanContext], "Decision | None"]


def _skip(rule: str, reason: str) -> Decision:
    return Decision(rule, reason=reason)


def _delete(rule: str, category: Category, run: RunData, objs: Iterable[ObjectInfo], *,
            record: RunRecord | None = None, expect: datetime | None = None) -> Decision:
    return Decision(rule, category=category, objects=tuple(objs), every=tuple(run.data), record=record,
                    expect_updated_at=expect)


def rule_live(run: RunData, ctx: PlanContext) -> Decision | None:
    """The run ``_CURRENT`` names is never touched."""
    if ctx.pointer is not None and run.run_id == ctx.pointer.run_id:
        return _skip("live", "named by _CURRENT")
    return None


def rule_pinned(run: RunData, ctx: PlanContext) -> Decision | None:
    """Runs pinned by ``keep_run_ids`` are never touched."""
    return _skip("pinned", "pinned (keep_run_ids)") if run.run_id in ctx.pinned else None


def rule_recently_live(run: RunData, ctx: PlanContext) -> Decision | None:
    """Every run that was live within the grace period stays: readers may not have refreshed yet."""
    until = ctx.live_until.get(run.run_id)
    if until is not None and until > ctx.cutoff:
        return _skip("recently_live", f"live until {layout.format_ts(until)}, less than the grace period ago")
    pointer = ctx.pointer
    if pointer is not None and run.run_id == pointer.previous_run_id and pointer.updated_at > ctx.cutoff:
        return _skip("recently_live", "named by _CURRENT less than the grace period ago")
    return None


def rule_referenced(run: RunData, ctx: PlanContext) -> Decision | None:
    """A run whose layers a kept run's manifest reads stays, however old: that snapshot needs them."""
    keeper = ctx.referenced_by.get(run.run_id)
    if keeper is None:
        return None
    why = ctx.unknown_reads.get(keeper)
    reason = (f"kept run {keeper} may read its layers ({why}), so every run it may read is kept" if why
              else f"its layers are read by kept run {keeper}")
    return _skip("referenced", reason if run.known else f"no run record, but {reason}")


def rule_orphan(run: RunData, ctx: PlanContext) -> Decision | None:
    """A shard folder without a run record is an orphan once all of it is past the grace period.

    A manifest without a record is left alone: only shard folders are orphans.
    """
    if run.known:
        return None
    if not run.shards:
        return Decision("orphan")
    if len(ctx.old(run.shards)) < len(run.shards):
        return _skip("orphan", "orphan shard folder younger than the grace period")
    return _delete("orphan", "orphans", replace(run, manifests=()), run.shards)


def rule_unreadable(run: RunData, ctx: PlanContext) -> Decision | None:
    """A run whose record cannot be read is left alone."""
    return _skip("unreadable", "run record cannot be read") if run.record is None else None


def rule_running(run: RunData, ctx: PlanContext) -> Decision | None:
    """A running run goes only once its lease expired more than the grace period ago (abandoned)."""
    record = run.record
    if record is None or record.status != RUNNING:
        return None
    if not record.lease_expired(ctx.now):
        return _skip("running", "running with a valid lease")
    if record.lease_expires_at > ctx.cutoff:
        return _skip("running", "lease expired less than the grace period ago")
    return _delete("running", "abandoned_runs", run, run.data, record=record, expect=record.updated_at)


def rule_young(run: RunData, ctx: PlanContext) -> Decision | None:
    """A run active (started, finished, published) within the grace period stays."""
    if run.record is not None and _last_activity(run.record) > ctx.cutoff:
        return _skip("young", "younger than the grace period") if run.data else Decision("young")
    return None


def rule_failed(run: RunData, ctx: PlanContext) -> Decision | None:
    """A failed run's data goes."""
    if run.record is not None and run.record.status == FAILED:
        return _delete("failed", "failed_runs", run, run.data, record=run.record)
    return None


def rule_expired(run: RunData, ctx: PlanContext) -> Decision | None:
    """A succeeded run beyond the newest ``keep_runs`` (or already marked deleted) goes."""
    record = run.record
    if record is not None and (record.deleted_at is not None or run.run_id not in ctx.kept):
        return _delete("expired", "expired_snapshots", run, run.data, record=record)
    return None


def rule_losing_attempts(run: RunData, ctx: PlanContext) -> Decision | None:
    """A kept run keeps its winning attempts; the others go (kept whole when the winners are unknown)."""
    if run.run_id not in ctx.winners:
        return _skip("losing_attempts", "winning attempts unknown (manifest unreadable); attempts kept") \
            if run.shards else Decision("losing_attempts")
    keep = tuple(w.rstrip("/") + "/" for w in ctx.winners[run.run_id])
    losing = [o for o in run.shards if not o.key.startswith(keep)]
    return _delete("losing_attempts", "losing_attempts", run, losing) if losing else Decision("losing_attempts")


# Evaluated in order; the first rule with a verdict decides. Keep-rules come first, so nothing
# later can delete what they protect.
RULES: tuple[Rule, ...] = (
    rule_live, rule_pinned, rule_recently_live, rule_referenced, rule_orphan, rule_unreadable, rule_running, rule_young,
    rule_failed, rule_expired, rule_losing_attempts,
)


def live_until(runs: Mapping[str, RunRecord | None], pointer: CurrentPointer | None) -> dict[str, datetime]:
    """When each run ever published stopped being live, at the latest.

    Every pointer move stamps ``published_at`` on the run it names (a rollback stamps it again),
    so a run stopped being live by the first move after its own stamp; the pointer's own
    ``updated_at`` is a move too. Without a later move the run's own stamp is the best bound.

    That stamp is written after the move and may be lost (an outage, a killed publisher): the
    publisher's claim (``publishing_at``, written before the move and cleared by the stamp) then
    remains, and the move happened within ``PUBLISH_CLAIM_HONOURED`` of it. Such a run counts as live
    from the end of that window, which can only make its bound later. Claims never count as moves:
    one whose publish did not move the pointer would cut another run's bound short.
    """
    moves = sorted([r.published_at for r in runs.values() if r is not None and r.published_at is not None]
                   + ([pointer.updated_at] if pointer is not None else []))
    out = {}
    for run_id, record in runs.items():
        if record is None:
            continue
        since = record.published_at
        if record.publishing_at is not None and (since is None or record.publishing_at > since):
            since = record.publishing_at + PUBLISH_CLAIM_HONOURED
        if since is None:
            continue
        later = [m for m in moves if m > since]
        out[run_id] = later[0] if later else since
    return out


def refuse_without_pointer(runs: Mapping[str, RunRecord | None], pointer: CurrentPointer | None, root: str) -> None:
    """With ``_CURRENT`` missing but runs once published, deleting could lose the last snapshot."""
    if pointer is not None:
        return
    published = sorted(((r.published_at, rid) for rid, r in runs.items()
                        if r is not None and r.published_at is not None and r.deleted_at is None), reverse=True)
    if published:
        last = published[0][1]
        raise CleanupRefusedError(
            f"_CURRENT is missing at {root or 'the root'} although run {last!r} was published (published_at "
            f"{layout.format_ts(published[0][0])}); refusing to delete anything. Restore the pointer first: "
            f"'shardyfusion publish {root or '<output_uri>'} --run-id {last}' (or PublishSnapshotOperator(run_id={last!r}))"
        )


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
    referenced_by: Mapping[str, str] | None = None,
    unknown_reads: Mapping[str, str] | None = None,
) -> CleanupPlan:
    """Decide what a cleanup deletes. No I/O: each run is judged by ``RULES``, first verdict wins.

    ``listing``: objects under ``shards/`` and ``manifests/`` (sizes, last_modified); ``runs``: every
    run record by run id (``None``: the record exists but cannot be read, so the run is left alone);
    ``winners``: for the runs ``runs_needing_winners`` names, the attempt keys their manifest uses
    (``layout.attempt_key`` form); a run missing from it keeps all its attempts; ``referenced_by``:
    runs whose layers a kept run's manifest reads, and that run; ``unknown_reads``: kept runs whose
    reads cannot be told, and why (both from ``layer_references``).
    """
    keep_runs, grace_period, pinned = check_settings(keep_runs, grace_period, tuple(keep_run_ids))
    refuse_without_pointer(runs, pointer, root)
    ctx = PlanContext(now=now, cutoff=now - grace_period, pointer=pointer, pinned=frozenset(pinned),
                      kept=frozenset(_succeeded_by_age(runs)[:keep_runs]), winners=winners or {},
                      live_until=live_until(runs, pointer), referenced_by=referenced_by or {},
                      unknown_reads=unknown_reads or {})
    items: list[PlanItem] = []
    skipped: list[Skipped] = []
    decided_by: dict[str, str] = {}
    for run in _runs_in(listing, runs, manifests):
        decision = next((d for rule in RULES if (d := rule(run, ctx)) is not None), None)
        if decision is not None:
            decided_by[run.run_id] = decision.rule
            _apply(decision, run, ctx, items, skipped)
    order = {c: n for n, c in enumerate(CATEGORIES)}
    items.sort(key=lambda i: (order[i.category], i.run_id))
    return CleanupPlan(root=root, made_at=now, current=pointer, keep_runs=keep_runs, grace_period=grace_period,
                       keep_run_ids=pinned, items=tuple(items), skipped=tuple(skipped), decided_by=decided_by)


def _runs_in(listing: Iterable[ObjectInfo], runs: Mapping[str, RunRecord | None],
             manifests: Iterable[ManifestRef]) -> list[RunData]:
    shard_objects: dict[str, list[ObjectInfo]] = {}
    sizes: dict[str, ObjectInfo] = {}
    for info in listing:
        sizes[info.key] = info
        parsed = layout.parse_shard_key(info.key)
        if parsed is not None and parsed.rest:  # only objects inside a db folder; unknown keys are not ours
            shard_objects.setdefault(parsed.run_id, []).append(info)
    manifests_of: dict[str, list[ObjectInfo]] = {}
    for ref in manifests:
        manifests_of.setdefault(ref.run_id, []).append(sizes.get(ref.key) or ObjectInfo(ref.key, 0, ref.published_at))
    return [RunData(run_id, run_id in runs, runs.get(run_id), tuple(shard_objects.get(run_id, ())),
                    tuple(manifests_of.get(run_id, ())))
            for run_id in sorted(set(runs) | set(shard_objects) | set(manifests_of))]


def _apply(decision: Decision, run: RunData, ctx: PlanContext, items: list[PlanItem], skipped: list[Skipped]) -> None:
    if decision.reason is not None:
        skipped.append(Skipped(run.run_id, decision.reason, rule=decision.rule))
        return
    if decision.category is None:
        return
    doomed = ctx.old(decision.objects)
    young = len(decision.objects) - len(doomed)
    if young:
        skipped.append(Skipped(run.run_id, f"{young} object(s) younger than the grace period kept ({decision.category})",
                               rule=decision.rule))
    record = decision.record
    # The record says "deleted" only when nothing of the run is left behind.
    mark = record is not None and record.deleted_at is None and len(doomed) == len(decision.every)
    if doomed or mark or decision.expect_updated_at is not None:
        planned = tuple(PlannedObject(o.key, o.size) for o in sorted(doomed, key=lambda o: o.key))
        items.append(PlanItem(decision.category, run.run_id, planned, mark_deleted=mark,
                              expect_updated_at=decision.expect_updated_at, rule=decision.rule))
