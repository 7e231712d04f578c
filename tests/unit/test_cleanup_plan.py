"""``plan_cleanup`` (SPEC §8, DeferredCleanupOperator): every rule, case by case, on hand-built inputs.

The plan is pure, so each case states exactly what was read (listing, run records, manifests,
``_CURRENT``, winners) and ``now``, and checks which objects the plan deletes and which it keeps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import CleanupRefusedError, ConfigError
from airflow_provider_shardyfusion.core.lifecycle.cleanup_plan import (
    RULES,
    PlanContext,
    RunData,
    check_settings,
    live_until,
    plan_cleanup,
    rule_expired,
    rule_failed,
    rule_live,
    rule_losing_attempts,
    rule_orphan,
    rule_pinned,
    rule_recently_live,
    rule_referenced,
    rule_running,
    rule_unreadable,
    rule_young,
    runs_needing_winners,
)
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import (
    FAILED,
    PUBLISH_CLAIM_HONOURED,
    RUNNING,
    SUCCEEDED,
    RunError,
    RunRecord,
)
from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef
from airflow_provider_shardyfusion.core.storage.base import ObjectInfo

ROOT = "file:///data/out"
NOW = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
GRACE = timedelta(hours=1)
DAY = timedelta(days=1)


def record(run_id: str, status: str = SUCCEEDED, *, started: timedelta = DAY, lease_left: timedelta | None = None,
           published: bool = False, deleted: bool = False) -> RunRecord:
    started_at = NOW - started
    finished = None if status == RUNNING else started_at + timedelta(minutes=5)
    lease = NOW + lease_left if lease_left is not None else started_at + timedelta(minutes=10)
    return RunRecord(
        run_id=run_id, status=status, started_at=started_at, updated_at=lease - timedelta(minutes=10),
        lease_expires_at=lease, output_uri=ROOT, finished_at=finished,
        manifest_ref=f"{ROOT}/manifests/x_run_id={run_id}/manifest.json" if status == SUCCEEDED else None,
        error=RunError("ShardWriteError", "boom") if status == FAILED else None,
        published_at=finished if status == SUCCEEDED and published else None,
        deleted_at=NOW - timedelta(hours=2) if deleted else None,
    ).validate()


def shard_files(run_id: str, db_id: int = 0, attempt: int = 0, task: int | None = None, *, age: timedelta = DAY,
                sizes: tuple[int, ...] = (100, 7)) -> list[ObjectInfo]:
    prefix = layout.attempt_key(run_id, db_id, attempt, task)
    return [ObjectInfo(f"{prefix}/{name}", size, NOW - age) for name, size in zip(("000001.sst", "CURRENT"), sizes, strict=False)]


def manifest(run_id: str, *, age: timedelta = DAY, size: int = 500) -> tuple[ManifestRef, ObjectInfo]:
    key = layout.manifest_key(run_id, NOW - age)
    return ManifestRef(f"{ROOT}/{key}", key, run_id, NOW - age), ObjectInfo(key, size, NOW - age)


class Root:
    """What a cleanup would read from one output root."""

    def __init__(self):
        self.listing: list[ObjectInfo] = []
        self.runs: dict[str, RunRecord | None] = {}
        self.manifests: list[ManifestRef] = []
        self.winners: dict[str, set[str]] = {}
        self.pointer: CurrentPointer | None = None

    def run(self, rec: RunRecord | None, run_id: str | None = None, *, with_manifest: bool = True,
            attempts: tuple[tuple[int, int, int | None], ...] = ((0, 0, None),), winner: int = 0,
            age: timedelta = DAY) -> list[ObjectInfo]:
        run_id = rec.run_id if rec is not None else run_id
        self.runs[run_id] = rec
        objs = [o for db, att, task in attempts for o in shard_files(run_id, db, att, task, age=age)]
        self.listing += objs
        if with_manifest:
            ref, info = manifest(run_id, age=age)
            self.manifests.append(ref)
            self.listing.append(info)
            objs.append(info)
        db, att, task = attempts[winner]
        self.winners[run_id] = {layout.attempt_key(run_id, db, att, task)}
        return objs

    def publish(self, run_id: str) -> None:
        ref = next(m for m in self.manifests if m.run_id == run_id)
        self.pointer = CurrentPointer(manifest_ref=ref.uri, run_id=run_id, updated_at=NOW - timedelta(hours=3))

    def plan(self, **kw):
        kw.setdefault("grace_period", GRACE)
        kw.setdefault("keep_runs", 3)
        return plan_cleanup(self.listing, self.runs, self.manifests, self.pointer, kw.pop("now", NOW),
                            winners=self.winners, root=ROOT, **kw)


def deleted_keys(plan, category: str | None = None) -> set[str]:
    return {o.key for i in plan.items if category in (None, i.category) for o in i.objects}


def keys(objs) -> set[str]:
    return {o.key for o in objs}


# ---- never touched ---------------------------------------------------------------------------


def test_the_run_current_names_is_never_touched_even_failed_or_beyond_keep_runs():
    root = Root()
    live = root.run(record("live-old", started=10 * DAY), attempts=((0, 0, None), (0, 1, None)), winner=1)
    for n in range(3):
        root.run(record(f"newer-{n}", started=DAY + timedelta(hours=n)))
    root.publish("live-old")
    plan = root.plan(keep_runs=1)
    assert not keys(live) & deleted_keys(plan)
    assert ("live-old", "named by _CURRENT") in {(s.run_id, s.reason) for s in plan.skipped}
    assert {i.run_id for i in plan.of("expired_snapshots")} == {"newer-1", "newer-2"}


def test_a_live_failed_run_is_still_untouched():
    # Cannot happen through publish, but a hand-moved pointer must still be honoured.
    root = Root()
    objs = root.run(record("oops", FAILED))
    root.publish("oops")
    assert root.plan().items == ()
    assert keys(objs)


def test_the_run_current_named_until_less_than_the_grace_period_ago_is_kept():
    root = Root()
    for n in range(3):
        root.run(record(f"r{n}", started=(5 - n) * DAY))
    ref = next(m for m in root.manifests if m.run_id == "r2")
    root.pointer = CurrentPointer(manifest_ref=ref.uri, run_id="r2", updated_at=NOW - timedelta(minutes=10),
                                  previous_run_id="r1")
    assert [i.run_id for i in root.plan(keep_runs=0).items] == ["r0"]
    # Once the move is older than the grace period, readers had time to refresh: it goes.
    assert [i.run_id for i in root.plan(keep_runs=0, now=NOW + GRACE).items] == ["r0", "r1"]


def test_pinned_runs_are_never_touched():
    root = Root()
    pinned_old = root.run(record("pinned-old", started=9 * DAY))
    pinned_failed = root.run(record("pinned-failed", FAILED))
    for n in range(3):
        root.run(record(f"new-{n}", started=timedelta(hours=5 + n)))
    plan = root.plan(keep_runs=1, keep_run_ids=["pinned-old", "pinned-failed"])
    assert not (keys(pinned_old) | keys(pinned_failed)) & deleted_keys(plan)
    assert {i.run_id for i in plan.items} == {"new-1", "new-2"}
    assert plan.keep_run_ids == ("pinned-failed", "pinned-old")


def test_a_running_run_with_a_valid_lease_is_never_touched_however_old():
    root = Root()
    objs = root.run(record("busy", RUNNING, started=5 * DAY, lease_left=timedelta(minutes=3)), with_manifest=False)
    plan = root.plan(grace_period=timedelta(0))
    assert plan.items == () and keys(objs)
    assert [(s.run_id, s.reason) for s in plan.skipped] == [("busy", "running with a valid lease")]


def test_a_lease_expired_less_than_the_grace_period_ago_is_waited_for():
    root = Root()
    root.run(record("late", RUNNING, started=DAY, lease_left=-timedelta(minutes=30)), with_manifest=False)
    plan = root.plan()
    assert plan.items == ()
    assert plan.skipped[0].reason == "lease expired less than the grace period ago"


def test_runs_younger_than_the_grace_period_are_kept():
    root = Root()
    young_failed = root.run(record("young-failed", FAILED, started=timedelta(minutes=20)))
    root.run(record("old-failed", FAILED, started=3 * DAY))
    plan = root.plan()
    assert [i.run_id for i in plan.items] == ["old-failed"]
    assert not keys(young_failed) & deleted_keys(plan)
    # The same inputs an hour later: now it goes.
    later = root.plan(now=NOW + timedelta(hours=1))
    assert {i.run_id for i in later.items} == {"old-failed", "young-failed"}


def test_young_objects_of_an_old_failed_run_stay_and_the_run_is_not_marked_deleted():
    root = Root()
    old = root.run(record("f", FAILED, started=3 * DAY))
    zombie = shard_files("f", 1, 0, age=timedelta(minutes=5))  # a task still writing after the driver died
    root.listing += zombie
    (item,) = root.plan().items
    assert keys(item.objects) == keys(old) and not item.mark_deleted


def test_an_unreadable_run_record_leaves_the_run_alone():
    root = Root()
    objs = root.run(None, "broken")
    plan = root.plan(grace_period=timedelta(0))
    assert plan.items == () and keys(objs)
    assert plan.skipped[0].reason == "run record cannot be read"


def test_unknown_keys_under_shards_are_not_ours_and_stay():
    root = Root()
    root.listing.append(ObjectInfo("shards/README.txt", 5, NOW - DAY))
    root.listing.append(ObjectInfo("shards/run_id=x/notes.txt", 5, NOW - DAY))
    assert root.plan().items == ()


# ---- what goes -------------------------------------------------------------------------------


def test_failed_run_all_its_shards_and_manifest_go_and_its_record_is_marked_deleted():
    root = Root()
    objs = root.run(record("bad", FAILED), attempts=((0, 0, None), (1, 0, 4), (1, 1, 9)))
    (item,) = root.plan().items
    assert (item.category, item.run_id, item.mark_deleted) == ("failed_runs", "bad", True)
    assert keys(item.objects) == keys(objs)
    assert item.bytes == sum(o.size for o in objs) == 3 * 107 + 500


def test_abandoned_running_run_goes_and_is_listed_for_marking_failed_first():
    root = Root()
    rec = record("lost", RUNNING, started=DAY, lease_left=-timedelta(hours=2))
    objs = root.run(rec, with_manifest=False)
    plan = root.plan()
    (item,) = plan.items
    assert (item.category, item.mark_deleted, item.expect_updated_at) == ("abandoned_runs", True, rec.updated_at)
    assert keys(item.objects) == keys(objs)
    assert plan.abandoned_run_ids == ("lost",)


def test_abandoned_run_without_data_is_still_listed_to_be_marked_failed():
    root = Root()
    root.runs["empty"] = record("empty", RUNNING, started=DAY, lease_left=-timedelta(hours=2))
    assert root.plan().abandoned_run_ids == ("empty",)


def test_losing_attempts_of_kept_runs_go_winners_and_manifest_stay():
    root = Root()
    objs = root.run(record("kept"), attempts=((0, 0, 1), (0, 1, 2), (1, 0, 3)), winner=1)
    plan = root.plan()
    (item,) = plan.items
    assert (item.category, item.mark_deleted) == ("losing_attempts", False)
    winner = layout.attempt_key("kept", 0, 1, 2)
    # db 1 has no winner in this manifest (an empty shard): anything there is a loser too.
    assert keys(item.objects) == {o.key for o in objs if o.key.startswith("shards/") and not o.key.startswith(winner + "/")}
    assert len(item.objects) == 4


def test_winner_prefix_is_matched_as_a_folder_not_a_string_prefix():
    root = Root()
    # attempt=01-task=1 must not protect attempt=01-task=12
    objs = root.run(record("r"), attempts=((0, 1, 1), (0, 1, 12)), winner=0)
    (item,) = root.plan().items
    assert keys(item.objects) == {o.key for o in objs if "task=12/" in o.key}


def test_kept_run_with_unknown_winners_keeps_all_attempts():
    root = Root()
    root.run(record("r"), attempts=((0, 0, None), (0, 1, None)))
    del root.winners["r"]
    plan = root.plan()
    assert plan.items == ()
    assert "winning attempts unknown" in plan.skipped[0].reason


def test_orphan_shard_folders_go_once_all_their_objects_are_past_grace():
    root = Root()
    old = shard_files("ghost", 0, 0) + shard_files("ghost", 3, 1)
    young = shard_files("fresh", 0, 0, age=timedelta(minutes=1))
    mixed = shard_files("mixed", 0, 0) + shard_files("mixed", 1, 0, age=timedelta(minutes=1))
    root.listing += old + young + mixed
    orphan_manifest, info = manifest("no-record")
    root.manifests.append(orphan_manifest)
    root.listing.append(info)
    plan = root.plan()
    (item,) = plan.items
    assert (item.category, item.run_id, item.mark_deleted) == ("orphans", "ghost", False)
    assert keys(item.objects) == keys(old)
    assert {s.run_id for s in plan.skipped} == {"fresh", "mixed"}


def test_succeeded_runs_beyond_keep_runs_go_newest_start_kept_not_lexical_order():
    root = Root()
    # Run ids sort the other way round from their start times: the plan must order by started_at.
    starts = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}  # days ago
    data = {rid: root.run(record(rid, started=d * DAY)) for rid, d in starts.items()}
    plan = root.plan(keep_runs=2)
    assert {i.run_id for i in plan.of("expired_snapshots")} == {"c", "d", "e"}
    assert all(i.mark_deleted for i in plan.items)
    assert deleted_keys(plan) == keys(data["c"]) | keys(data["d"]) | keys(data["e"])
    assert runs_needing_winners(root.runs, 2) == ["a", "b"]


def test_a_staged_run_counts_as_a_succeeded_run():
    root = Root()
    root.run(record("staged-newest", started=DAY, published=False))
    root.run(record("published-mid", started=2 * DAY))
    root.run(record("published-old", started=3 * DAY))
    root.publish("published-mid")
    plan = root.plan(keep_runs=1)
    assert [i.run_id for i in plan.items] == ["published-old"]
    # keep_runs=0: only the live run stays, the staged one goes too.
    assert {i.run_id for i in root.plan(keep_runs=0).items} == {"published-old", "staged-newest"}


def test_runs_already_deleted_do_not_count_and_their_leftovers_go_without_marking_again():
    root = Root()
    leftover = root.run(record("gone", started=DAY, deleted=True))
    root.run(record("older", started=2 * DAY))
    plan = root.plan(keep_runs=1)
    assert [i.run_id for i in plan.items] == ["gone"]
    assert plan.items[0].category == "expired_snapshots" and not plan.items[0].mark_deleted
    assert keys(plan.items[0].objects) == keys(leftover)


def test_failed_run_without_any_data_is_marked_deleted_once():
    root = Root()
    root.runs["nothing"] = record("nothing", FAILED)
    (item,) = root.plan().items
    assert item.objects == () and item.mark_deleted
    root.runs["nothing"] = record("nothing", FAILED, deleted=True)
    assert root.plan().items == ()


def test_plan_is_json_and_totals_add_up():
    root = Root()
    root.run(record("bad", FAILED))
    root.run(record("kept"), attempts=((0, 0, None), (0, 1, None)), winner=1)
    root.listing += shard_files("ghost")
    root.run(record("lost", RUNNING, lease_left=-timedelta(hours=3)))
    for n in range(4):
        root.run(record(f"s{n}", started=timedelta(hours=30 + n)))
    plan = root.plan(keep_runs=3)
    out = json.loads(json.dumps(plan.to_dict()))
    totals = out["totals"]
    assert {c: t["runs"] for c, t in totals.items()} == {
        "losing_attempts": 1, "failed_runs": 1, "abandoned_runs": 1, "orphans": 1, "expired_snapshots": 2}
    assert out["bytes"] == sum(t["bytes"] for t in totals.values()) == sum(i["bytes"] for i in out["items"])
    assert totals["failed_runs"] == {"runs": 1, "objects": 3, "bytes": 607}
    assert out["abandoned_run_ids"] == ["lost"] and out["grace_period_seconds"] == 3600


@pytest.mark.parametrize(("keep_runs", "grace", "ids", "message"), [
    (-1, GRACE, (), "keep_runs"), (True, GRACE, (), "keep_runs"), (3, timedelta(seconds=-1), (), "grace_period"),
    (3, "1h", (), "grace_period"), (3, GRACE, ("ok", "no/slash"), "keep_run_ids entry"), (3, GRACE, 5, "keep_run_ids"),
])
def test_settings_are_checked(keep_runs, grace, ids, message):
    with pytest.raises(ConfigError, match=message):
        check_settings(keep_runs, grace, ids)


def test_settings_accept_seconds_and_a_single_run_id():
    assert check_settings(0, 90, "only") == (0, timedelta(seconds=90), ("only",))


# ---- rules added by the cleanup/publish fence (issue 22) ---------------------------------------


def test_every_run_live_within_the_grace_period_is_kept_not_only_the_previous_one():
    root = Root()
    root.run(record("v1", started=9 * DAY, published=True))
    stamps = {"v2": NOW - timedelta(minutes=2, seconds=1), "v3": NOW - timedelta(minutes=2)}
    for run_id, stamp in stamps.items():
        root.runs[run_id] = replace(record(run_id, started=timedelta(minutes=3)), published_at=stamp)
        root.listing += shard_files(run_id)
    root.pointer = CurrentPointer(manifest_ref=f"{ROOT}/manifests/x_run_id=v3/manifest.json", run_id="v3",
                                  updated_at=stamps["v3"], previous_run_id="v2")
    plan = root.plan(keep_runs=1)
    assert "v1" not in {i.run_id for i in plan.items}
    assert ("v1", "recently_live") in {(s.run_id, s.rule) for s in plan.skipped}
    # An hour after v2 replaced it, readers had time to refresh: v1 goes.
    later = root.plan(keep_runs=1, now=NOW + GRACE)
    assert [i.run_id for i in later.of("expired_snapshots")] == ["v1"]
    assert later.of("expired_snapshots")[0].rule == "expired"


def test_live_until_is_the_first_pointer_move_after_a_runs_own_stamp():
    t = NOW - DAY
    runs = {"a": replace(record("a"), published_at=t), "b": replace(record("b"), published_at=t + GRACE),
            "c": record("c")}
    pointer = CurrentPointer(manifest_ref=f"{ROOT}/x", run_id="b", updated_at=t + 2 * GRACE)
    assert live_until(runs, pointer) == {"a": t + GRACE, "b": t + 2 * GRACE}


def test_a_missing_pointer_with_published_runs_refuses_the_whole_plan():
    root = Root()
    root.run(record("old", started=5 * DAY, published=True))
    root.run(record("last", started=2 * DAY, published=True))
    with pytest.raises(CleanupRefusedError, match=r"_CURRENT is missing.*'last'.*--run-id last"):
        root.plan(keep_runs=0)
    # Never published anything: nothing to lose, the plan goes on.
    fresh = Root()
    fresh.run(record("staged", started=5 * DAY))
    assert [i.run_id for i in fresh.plan(keep_runs=0).items] == ["staged"]


@pytest.mark.parametrize(("rule", "expected"), [
    (rule_live, "live"), (rule_pinned, "pinned"), (rule_unreadable, "unreadable"),
])
def test_each_keep_rule_names_itself(rule, expected):
    run = RunData("r", True, None, (), ())
    ctx = PlanContext(now=NOW, cutoff=NOW - GRACE, pointer=CurrentPointer(manifest_ref=f"{ROOT}/x", run_id="r",
                      updated_at=NOW), pinned=frozenset({"r"}), kept=frozenset(), winners={}, live_until={})
    decision = rule(run, ctx)
    assert decision is not None and decision.rule == expected and decision.reason


# ---- each rule on its own: when it decides, what it says, and when it passes ------------------


def run_data(rec: RunRecord | None, run_id: str = "r", *, known: bool = True, age: timedelta = DAY) -> RunData:
    shards = tuple(shard_files(run_id, 0, 0, age=age) + shard_files(run_id, 0, 1, age=age))
    return RunData(run_id, known, rec, shards, (manifest(run_id, age=age)[1],))


def context(**kw) -> PlanContext:
    base = {"now": NOW, "cutoff": NOW - GRACE, "pointer": None, "pinned": frozenset(), "kept": frozenset(),
            "winners": {}, "live_until": {}}
    return PlanContext(**{**base, **kw})


LIVE = CurrentPointer(manifest_ref=f"{ROOT}/x", run_id="r", updated_at=NOW - DAY)
# (rule, run, context, expected rule name, expected category (None: kept with a reason)), and a
# case the rule passes on (returns None: a later rule decides).
RULE_CASES = [
    (rule_live, run_data(record("r")), context(pointer=LIVE), "live", None),
    (rule_pinned, run_data(record("r")), context(pinned=frozenset({"r"})), "pinned", None),
    (rule_recently_live, run_data(record("r")), context(live_until={"r": NOW - timedelta(minutes=5)}),
     "recently_live", None),
    (rule_recently_live, run_data(record("r")),
     context(pointer=replace(LIVE, run_id="s", previous_run_id="r", updated_at=NOW - timedelta(minutes=5))),
     "recently_live", None),
    (rule_referenced, run_data(record("r")), context(referenced_by={"r": "d2"}), "referenced", None),
    (rule_referenced, run_data(None, known=False), context(referenced_by={"r": "d2"}), "referenced", None),
    (rule_orphan, run_data(None, known=False), context(), "orphan", "orphans"),
    (rule_orphan, run_data(None, known=False, age=timedelta(minutes=5)), context(), "orphan", None),
    (rule_unreadable, run_data(None), context(), "unreadable", None),
    (rule_running, run_data(record("r", RUNNING, lease_left=timedelta(minutes=5))), context(), "running", None),
    (rule_running, run_data(record("r", RUNNING, lease_left=-timedelta(minutes=5))), context(), "running", None),
    (rule_running, run_data(record("r", RUNNING, lease_left=-2 * GRACE)), context(), "running", "abandoned_runs"),
    (rule_young, run_data(record("r", FAILED, started=timedelta(minutes=30))), context(), "young", None),
    (rule_failed, run_data(record("r", FAILED)), context(), "failed", "failed_runs"),
    (rule_expired, run_data(record("r")), context(), "expired", "expired_snapshots"),
    (rule_expired, run_data(record("r", deleted=True)), context(kept=frozenset({"r"})), "expired", "expired_snapshots"),
    (rule_losing_attempts, run_data(record("r")), context(winners={"r": {layout.attempt_key("r", 0, 0)}}),
     "losing_attempts", "losing_attempts"),
    (rule_losing_attempts, run_data(record("r")), context(), "losing_attempts", None),
]
PASS_CASES = [
    (rule_live, run_data(record("r")), context(pointer=replace(LIVE, run_id="s"))),
    (rule_pinned, run_data(record("r")), context(pinned=frozenset({"s"}))),
    (rule_recently_live, run_data(record("r")), context(live_until={"r": NOW - 2 * GRACE})),
    (rule_referenced, run_data(record("r")), context(referenced_by={"s": "d2"})),
    (rule_orphan, run_data(record("r")), context()),
    (rule_unreadable, run_data(record("r")), context()),
    (rule_running, run_data(record("r")), context()),
    (rule_young, run_data(record("r")), context()),
    (rule_failed, run_data(record("r")), context()),
    (rule_expired, run_data(record("r")), context(kept=frozenset({"r"}))),
]


@pytest.mark.parametrize(("rule", "run", "ctx", "name", "category"), RULE_CASES,
                         ids=[f"{c[0].__name__}-{n}" for n, c in enumerate(RULE_CASES)])
def test_each_rule_decides_and_names_itself(rule, run, ctx, name, category):
    decision = rule(run, ctx)
    assert decision is not None and decision.rule == name
    assert decision.category == category
    if category is None:
        assert decision.reason and not decision.objects
    else:
        assert decision.reason is None and decision.objects
    if category == "losing_attempts":  # only attempt 1 loses; attempt 0 is the winner
        assert keys(decision.objects) == keys(shard_files("r", 0, 1))


@pytest.mark.parametrize(("rule", "run", "ctx"), PASS_CASES, ids=[c[0].__name__ for c in PASS_CASES])
def test_each_rule_passes_what_is_not_its_business(rule, run, ctx):
    assert rule(run, ctx) is None


def test_rules_run_in_order_keep_rules_first():
    names = [r.__name__ for r in RULES]
    assert names == ["rule_live", "rule_pinned", "rule_recently_live", "rule_referenced", "rule_orphan", "rule_unreadable",
                     "rule_running", "rule_young", "rule_failed", "rule_expired", "rule_losing_attempts"]
    # First verdict wins: a live failed run is kept by rule_live, never reaches rule_failed.
    root = Root()
    root.run(record("r", FAILED))
    root.run(record("s", FAILED))
    root.pointer = replace(LIVE, manifest_ref=root.manifests[0].uri)
    plan = root.plan()
    assert [(i.run_id, i.rule) for i in plan.items] == [("s", "failed")]
    assert ("r", "live") in {(k.run_id, k.rule) for k in plan.skipped}


def test_the_plan_names_the_rule_behind_every_item_and_skip():
    root = Root()
    root.run(record("live", started=DAY))
    root.publish("live")
    root.run(record("gone", started=3 * DAY))
    root.run(record("bad", FAILED))
    root.run(record("kept", started=2 * DAY), attempts=((0, 0, None), (0, 1, None)))
    root.run(record("young", started=timedelta(minutes=5)))
    root.run(None, "ghost", with_manifest=False)
    root.runs.pop("ghost")
    plan = root.plan(keep_runs=3)
    assert {(i.run_id, i.category, i.rule) for i in plan.items} == {
        ("gone", "expired_snapshots", "expired"), ("bad", "failed_runs", "failed"),
        ("kept", "losing_attempts", "losing_attempts"), ("ghost", "orphans", "orphan")}
    assert {(k.run_id, k.rule) for k in plan.skipped} >= {("live", "live"), ("young", "young")}
    assert all(i["rule"] for i in plan.to_dict()["items"]) and all(k["rule"] for k in plan.to_dict()["skipped"])
    # Every run, also those with nothing to do (a kept run without losing attempts), names its rule.
    root.run(record("quiet", started=DAY + DAY / 2))
    assert root.plan(keep_runs=4).to_dict()["decided_by"] == {
        "bad": "failed", "ghost": "orphan", "gone": "expired", "kept": "losing_attempts", "live": "live",
        "quiet": "losing_attempts", "young": "young"}


def test_live_until_after_a_rollback_and_without_a_later_move():
    t = NOW - DAY
    # a live at t, b at t+1h, rollback to a at t+2h (a re-stamped): b stopped being live at t+2h.
    runs = {"a": replace(record("a"), published_at=t + 2 * GRACE), "b": replace(record("b"), published_at=t + GRACE)}
    pointer = CurrentPointer(manifest_ref=f"{ROOT}/x", run_id="a", updated_at=t + 2 * GRACE - timedelta(seconds=1))
    assert live_until(runs, pointer)["b"] == t + 2 * GRACE - timedelta(seconds=1)
    # No move after a run's own stamp (its publisher stamped late): every move came before it, so it
    # stopped being live no later than that stamp.
    assert live_until({"c": replace(record("c"), published_at=t)}, replace(pointer, updated_at=t - GRACE)) == {"c": t}


def test_live_until_of_a_run_whose_published_stamp_was_lost():
    t = NOW - DAY
    # b's publisher claimed it at t+1h and moved the pointer, but its published_at stamp was lost;
    # c and d went live seconds later. b was live in between: it counts as live until the first
    # move after its claim's window, not as a run never published.
    runs = {"a": replace(record("a"), published_at=t),
            "b": replace(record("b"), publishing_at=t + GRACE),
            "c": replace(record("c"), published_at=t + GRACE + PUBLISH_CLAIM_HONOURED + timedelta(seconds=1)),
            "d": replace(record("d"), published_at=t + GRACE + PUBLISH_CLAIM_HONOURED + timedelta(seconds=2))}
    pointer = CurrentPointer(manifest_ref=f"{ROOT}/x", run_id="d", updated_at=runs["d"].published_at)
    until = live_until(runs, pointer)
    assert until["b"] == runs["c"].published_at
    # A rollback whose new stamp was lost: the claim is newer than the old stamp, so it decides.
    rolled = replace(record("e"), published_at=t, publishing_at=t + 2 * GRACE)
    assert live_until({"e": rolled}, None) == {"e": t + 2 * GRACE + PUBLISH_CLAIM_HONOURED}
    # A claim is no move: a publish that never moved the pointer does not end a's bound.
    assert until["a"] == runs["c"].published_at


def test_a_lost_published_stamp_still_keeps_the_run_for_the_grace_period():
    root = Root()
    root.run(record("v1", started=5 * DAY, published=True))
    # v2 was staged 4 h ago and published half an hour ago: claimed, moved, its stamp lost.
    root.run(replace(record("v2", started=4 * GRACE), publishing_at=NOW - 2 * PUBLISH_CLAIM_HONOURED))
    for n, run_id in enumerate(("v3", "v4")):
        root.run(replace(record(run_id, started=GRACE), published_at=NOW - PUBLISH_CLAIM_HONOURED + timedelta(seconds=n)))
    root.publish("v4")
    root.pointer = replace(root.pointer, updated_at=NOW - PUBLISH_CLAIM_HONOURED + timedelta(seconds=1))
    plan = root.plan(keep_runs=1, now=NOW)
    assert "v2" not in {i.run_id for i in plan.items}, plan.to_dict()
    assert ("v2", "recently_live") in {(s.run_id, s.rule) for s in plan.skipped}
    # Once the grace period is over, it goes like any replaced run.
    later = root.plan(keep_runs=1, now=NOW + 2 * GRACE)
    assert "v2" in {i.run_id for i in later.of("expired_snapshots")}


def test_a_missing_pointer_with_only_deleted_published_runs_plans_on():
    root = Root()
    root.run(record("was-live", started=5 * DAY, published=True, deleted=True), with_manifest=False)
    root.run(record("staged", started=4 * DAY))
    assert {i.run_id for i in root.plan(keep_runs=0).items} == {"was-live", "staged"}


def test_a_referenced_run_is_kept_naming_its_keeper_record_or_not():
    """The base of a live chain whose record is missing is kept, not an orphan (issue 27 item 3)."""
    by = {"r": "d2"}
    assert rule_referenced(run_data(None, known=False), context(referenced_by=by)).reason == \
        "no run record, but its layers are read by kept run d2"
    unknown = context(referenced_by=by, unknown_reads={"d2": "run d2 has no manifest"})
    assert rule_referenced(run_data(record("r")), unknown).reason == \
        "kept run d2 may read its layers (run d2 has no manifest), so every run it may read is kept"
