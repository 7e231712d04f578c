"""Deferred cleanup end to end on both stores (SPEC §8): real runs published through ``core.write.commit``,
real shard objects under their attempt folders, then plan + execute, proven by listing the root.

Run records are written with a clock in the past (the lifecycle's ``clock``) and the plan is made
at ``NOW`` = a few hours after the objects were written, so the grace period can be exercised
without waiting: objects are ``OFFSET`` old at plan time, records as old as their clock says.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardWriteError
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunRecordLifecycle
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.cleanup_runs import NO_SLEEP, objects, succeeded_run, write_attempt
from tests.snapshot_helpers import write_run_record

OFFSET = timedelta(hours=3)
GRACE = timedelta(hours=1)


@pytest.fixture
def store(any_root):
    root, options = any_root
    return open_store(root, options)


def of_run(listing: dict[str, int], run_id: str) -> set[str]:
    """The run's data: shards and manifests (its record under runs/ is never deleted)."""
    return {k for k in listing if f"run_id={run_id}/" in k and not k.startswith(layout.RUNS_DIR + "/")}


def build_root(store):
    """Every kind of run SPEC §8 names, under one root."""
    t = layout.utc_now()
    day = timedelta(days=1)
    succeeded_run(store, "s-oldest", t - 6 * day)
    succeeded_run(store, "pinned", t - 5 * day)
    succeeded_run(store, "s-old", t - 4 * day)
    lose = succeeded_run(store, "s-losing", t - 2 * day, losing=True)
    succeeded_run(store, "live", t - day)
    # Staged, and started 30 minutes before the plan is made: younger than the grace period.
    succeeded_run(store, "young", t + OFFSET - timedelta(minutes=30), live=False)

    failed = RunRecordLifecycle(store, "failed", heartbeat_seconds=3600, clock=lambda: t - 3 * day).start()
    write_attempt(store, "failed", 0, 0, 1, 1)
    write_attempt(store, "failed", 1, 0, 2, 2)
    failed.fail(ShardWriteError("disk full"))

    # The driver died two days ago: its lease (10 min) expired long before the grace period.
    write_run_record(store, "abandoned", RUNNING, lease_seconds=600, now=t - 2 * day)
    write_attempt(store, "abandoned", 0, 0, 5, 3)
    # Died recently: its lease expired 20 minutes before the plan, so it is waited for.
    write_run_record(store, "lost-recently", RUNNING, lease_seconds=600, now=t + OFFSET - timedelta(minutes=30))
    write_attempt(store, "lost-recently", 0, 0, 5, 4)
    # A writer alive right now (its lease runs past the plan time).
    write_run_record(store, "busy", RUNNING, lease_seconds=OFFSET.total_seconds() + 600, now=t)
    write_attempt(store, "busy", 0, 0, 5, 5)

    write_attempt(store, "ghost", 0, 0, 7, 6)  # a shard folder without any run record
    write_attempt(store, "ghost", 3, 2, 8, 7)
    return lose["losers"][0]


def test_cleanup_deletes_exactly_what_the_rules_say(store):
    losing_prefix = build_root(store)
    snapshots = SnapshotRoot(store)
    before = objects(store)
    bytes_before = {k: store.get(k).data for k in before}
    now = layout.utc_now() + OFFSET

    plan = make_plan(snapshots, now=now, keep_runs=3, grace_period=GRACE, keep_run_ids=["pinned"])
    dry = execute_cleanup(snapshots, plan, dry_run=True)
    assert objects(store) == before and dry.to_dict()["deleted_objects"] == 0
    assert dry.plan is plan
    assert snapshots.read_run("abandoned").status == RUNNING  # a dry run writes nothing either

    report = execute_cleanup(snapshots, plan)
    after = objects(store)
    gone = set(before) - set(after)

    expected = (
        of_run(before, "s-oldest") | of_run(before, "s-old") | of_run(before, "failed")
        | of_run(before, "abandoned") | of_run(before, "ghost")
        | {k for k in before if k.startswith(losing_prefix + "/")}
    )
    assert gone == expected
    assert not set(after) - set(before)
    # Kept untouched, byte for byte: live, pinned, the kept run's winners and manifest, young, busy, lost-recently.
    for key in after:
        if not key.startswith(layout.RUNS_DIR + "/"):
            assert store.get(key).data == bytes_before[key]
    for run_id in ("live", "pinned", "young", "busy", "lost-recently"):
        assert of_run(after, run_id) == of_run(before, run_id)
    assert len(of_run(after, "s-losing")) == len(of_run(before, "s-losing")) - 3
    assert snapshots.current().run_id == "live"

    out = report.to_dict()
    assert not out["abandoned"] and out["errors"] == []
    assert out["deleted_bytes"] == sum(before[k] for k in gone)
    assert out["deleted_objects"] == len(gone)
    per_run = {"losing_attempts": {losing_prefix}, "failed_runs": of_run(before, "failed"),
               "abandoned_runs": of_run(before, "abandoned"), "orphans": of_run(before, "ghost"),
               "expired_snapshots": of_run(before, "s-oldest") | of_run(before, "s-old")}
    for category, keys in per_run.items():
        keys = {k for k in gone if any(k == p or k.startswith(p + "/") for p in keys)}
        assert out["deleted"][category] == {"objects": len(keys), "bytes": sum(before[k] for k in keys)}, category
    assert out["plan"]["totals"] == {c: {"runs": out["plan"]["totals"][c]["runs"], **d} for c, d in out["deleted"].items()}

    # Records stay: marked, never deleted; the abandoned one failed first with the reason.
    assert set(snapshots.list_run_ids()) == {"s-oldest", "pinned", "s-old", "s-losing", "live", "young", "failed",
                                             "abandoned", "lost-recently", "busy"}
    abandoned = snapshots.read_run("abandoned")
    assert abandoned.status == FAILED and abandoned.error.type == "RunAbandoned"
    assert abandoned.error.message.startswith("abandoned:")
    assert report.marked_failed == ("abandoned",)
    assert set(report.marked_deleted) == {"s-oldest", "s-old", "failed", "abandoned"}
    for run_id in ("s-oldest", "s-old"):
        rec = snapshots.read_run(run_id)
        assert rec.status == SUCCEEDED and rec.deleted_at is not None
    for run_id in ("live", "pinned", "s-losing", "young", "busy"):
        assert snapshots.read_run(run_id).deleted_at is None
    assert snapshots.read_run("busy").status == RUNNING and snapshots.read_run("lost-recently").status == RUNNING

    # Nothing left to do: a second cleanup at the same time plans nothing (no double marking either).
    again = make_plan(snapshots, now=now, keep_runs=3, grace_period=GRACE, keep_run_ids=["pinned"])
    assert [i.run_id for i in again.items] == []


def test_a_cleanup_racing_a_publish_deletes_nothing(store):
    t = layout.utc_now()
    for n in range(4):
        succeeded_run(store, f"run-{n}", t - timedelta(days=5 - n))
    snapshots = SnapshotRoot(store)
    plan = make_plan(snapshots, now=t + OFFSET, keep_runs=1, grace_period=GRACE)
    assert {i.run_id for i in plan.items} == {"run-0", "run-1", "run-2"}
    before = objects(store)
    # A rollback to a run the plan would delete, between planning and executing.
    from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run

    publish_run(snapshots, run_id="run-1", allow_older=True, **NO_SLEEP)
    report = execute_cleanup(snapshots, plan)
    assert report.abandoned and "_CURRENT moved" in report.abandon_reason
    assert report.to_dict()["deleted_objects"] == 0
    assert set(objects(store)) == set(before)
    assert snapshots.current().run_id == "run-1"
    assert all(snapshots.read_run(f"run-{n}").deleted_at is None for n in range(4))


def test_an_abandoned_run_whose_writer_came_back_is_kept(store):
    t = layout.utc_now()
    write_run_record(store, "zombie", RUNNING, lease_seconds=600, now=t - timedelta(days=1))
    write_attempt(store, "zombie", 0, 0, 1, 1)
    snapshots = SnapshotRoot(store)
    plan = make_plan(snapshots, now=t + OFFSET, grace_period=GRACE)
    assert plan.abandoned_run_ids == ("zombie",)
    # A heartbeat lands after planning: the record changed, so the run is neither failed nor deleted.
    write_run_record(store, "zombie", RUNNING, lease_seconds=600, now=t)
    before = objects(store)
    report = execute_cleanup(snapshots, plan)
    assert report.marked_failed == () and report.skipped_runs[0].run_id == "zombie"
    assert objects(store) == before and snapshots.read_run("zombie").status == RUNNING


# ---- the operator (file://, no connection needed) --------------------------------------------


def test_operator_dry_run_then_real_run_on_a_local_root(file_root):
    from airflow_provider_shardyfusion.core.errors import ConfigError
    from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator

    store = open_store(file_root)
    t = layout.utc_now()
    for n, run_id in enumerate(("old-a", "old-b", "live")):
        succeeded_run(store, run_id, t - timedelta(days=3 - n))
    failed = RunRecordLifecycle(store, "failed", heartbeat_seconds=3600, clock=lambda: t - timedelta(days=2)).start()
    write_attempt(store, "failed", 0, 0, 1, 1)
    failed.fail(ShardWriteError("disk full"))
    before = objects(store)

    def op(**kw):
        # grace_period as seconds: what a templated value rendered natively looks like
        return DeferredCleanupOperator(task_id="cleanup", output_uri=file_root, keep_runs=1, grace_period=0, **kw)

    dry = op(dry_run=True).execute({})
    assert objects(store) == before
    assert dry["dry_run"] and dry["deleted_objects"] == 0
    planned = {k for item in dry["plan"]["items"] for k in item["keys"]}
    expected = of_run(before, "old-a") | of_run(before, "old-b") | of_run(before, "failed")
    assert planned == expected
    assert dry["plan"]["bytes"] == sum(before[k] for k in expected)

    real = op().execute({})
    assert set(before) - set(objects(store)) == expected
    assert real["deleted_bytes"] == dry["plan"]["bytes"] and real["errors"] == [] and not real["abandoned"]
    assert {k for item in real["plan"]["items"] for k in item["keys"]} == planned  # the plan the dry run showed
    assert SnapshotRoot(store).read_run("old-a").deleted_at is not None

    bad = DeferredCleanupOperator(task_id="c", output_uri=file_root, keep_runs=-1)  # checked at execute, not parse
    with pytest.raises(ConfigError, match="DeferredCleanupOperator 'c': keep_runs -1"):
        bad.execute({})


def test_cli_cleanup_dry_run_then_real_run_on_both_stores(any_root, capsys):
    import json

    from airflow_provider_shardyfusion.cli import main

    root, options = any_root
    store = open_store(root, options)
    t = layout.utc_now()
    for n, run_id in enumerate(("c-old", "c-pinned", "c-mid", "c-live")):
        succeeded_run(store, run_id, t - timedelta(days=4 - n))
    before = objects(store)
    flags = ["--keep-runs", "1", "--grace-period-seconds", "0", "--keep-run-id", "c-pinned"]
    if options:
        flags += ["--endpoint-url", options["endpoint_url"], "--region", options["region_name"], "--path-style"]

    def cli(*extra):
        code = main(["cleanup", root, *flags, *extra])
        out = capsys.readouterr()
        assert code == 0, out.err
        return json.loads(out.out)

    dry = cli("--dry-run")
    assert objects(store) == before and dry["dry_run"]
    expected = of_run(before, "c-old") | of_run(before, "c-mid")
    assert {k for item in dry["plan"]["items"] for k in item["keys"]} == expected
    real = cli()
    assert set(before) - set(objects(store)) == expected
    assert real["deleted_bytes"] == sum(before[k] for k in expected) == dry["plan"]["bytes"]
    assert sorted(real["marked_deleted"]) == ["c-mid", "c-old"]

    assert main(["cleanup", root, "--keep-runs", "-2"]) == 1
    assert "keep_runs -2 must be an integer >= 0" in capsys.readouterr().err


# ---- the cleanup side of the fence with publish (issue 22) -----------------------------------


def three_runs(store):
    """run-0 and run-1 beyond keep_runs=1 (the plan deletes both), run-2 live."""
    t = layout.utc_now()
    for n in range(3):
        succeeded_run(store, f"run-{n}", t - timedelta(days=5 - n))
    return SnapshotRoot(store)


class OnRecordPut:
    """The store, with ``hook(phase)`` run just before ("before") and after ("after") the first
    conditional put on one run's record: the step where cleanup claims it."""

    def __init__(self, inner, run_id: str, hook):
        self._inner, self._key, self._hook, self.fired = inner, layout.run_record_key(run_id), hook, False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def put_if_match(self, key, data, etag, **kw):
        first = key == self._key and not self.fired
        self.fired = self.fired or first
        if first:
            self._hook("before")
        out = self._inner.put_if_match(key, data, etag, **kw)
        if first:
            self._hook("after")
        return out


def test_a_run_a_publish_claimed_is_left_alone_until_the_claim_expires(store):
    from airflow_provider_shardyfusion.core.model.run_record import PUBLISH_CLAIM_HONOURED

    snapshots = three_runs(store)
    before = objects(store)
    claimed = layout.utc_now() - timedelta(minutes=1)
    snapshots.update_run("run-0", lambda r: replace(r, publishing_at=claimed))
    report = execute_cleanup(snapshots, make_plan(snapshots, keep_runs=1, grace_period=0))
    assert [(s.run_id, s.rule) for s in report.skipped_runs] == [("run-0", "fence")]
    assert "a publish claimed it" in report.skipped_runs[0].reason
    assert set(objects(store)) == set(before) - of_run(before, "run-1")
    assert snapshots.read_run("run-0").deleting_at is None and report.marked_deleted == ("run-1",)
    # A publisher that died holding the claim delays the cleanup by PUBLISH_CLAIM_HONOURED, no more.
    snapshots.update_run("run-0", lambda r: replace(r, publishing_at=claimed - PUBLISH_CLAIM_HONOURED))
    again = execute_cleanup(snapshots, make_plan(snapshots, keep_runs=1, grace_period=0))
    assert again.marked_deleted == ("run-0",) and not of_run(objects(store), "run-0")
    assert snapshots.read_run("run-0").deleting_at is not None  # stays: the run can never be published again


def test_a_cleanup_whose_clock_is_hours_off_deletes_nothing(store, monkeypatch):
    from airflow_provider_shardyfusion.core.errors import ClockSkewError

    snapshots = three_runs(store)
    before = objects(store)
    plan = make_plan(snapshots, keep_runs=1, grace_period=0)
    real_now = layout.utc_now
    monkeypatch.setattr(layout, "utc_now", lambda: real_now() + timedelta(hours=3))
    # Its clock judges publish claims: hours ahead, every claim would look expired to it.
    with pytest.raises(ClockSkewError, match=r"synchronise the clock \(NTP\) of the machine running the cleanup"):
        execute_cleanup(snapshots, plan)
    monkeypatch.undo()
    assert objects(store) == before
    assert all(snapshots.read_run(r).deleting_at is None for r in ("run-0", "run-1", "run-2"))


def test_a_record_claimed_by_a_publish_between_read_and_put_is_left_alone(store):
    snapshots = three_runs(store)
    plan = make_plan(snapshots, keep_runs=1, grace_period=0)
    before = objects(store)

    def publisher_claims(phase):
        if phase == "before":  # after cleanup read the record, before its conditional put lands
            snapshots.update_run("run-0", lambda r: replace(r, publishing_at=layout.utc_now()))

    racing = SnapshotRoot(OnRecordPut(store, "run-0", publisher_claims))
    report = execute_cleanup(racing, plan)
    assert [s.run_id for s in report.skipped_runs] == ["run-0"]
    assert "record changed while claiming" in report.skipped_runs[0].reason
    record = snapshots.read_run("run-0")
    assert record.deleting_at is None and record.publishing_at is not None  # the publisher's claim stands
    assert of_run(objects(store), "run-0") == of_run(before, "run-0")
    assert report.marked_deleted == ("run-1",)


def test_a_run_made_live_after_its_claim_keeps_its_data_and_loses_the_claim(store):
    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer

    snapshots = three_runs(store)
    plan = make_plan(snapshots, keep_runs=1, grace_period=0)
    before = objects(store)

    def pointer_moves_to_it(phase):
        # A publisher that does not honour the fence (an older release): the re-read of _CURRENT
        # after the claim is the defence that remains.
        if phase == "after":
            ref = snapshots.find_manifest("run-0")
            store.put(layout.CURRENT_KEY, CurrentPointer(manifest_ref=ref.uri, run_id="run-0",
                                                         updated_at=layout.utc_now()).to_bytes())

    report = execute_cleanup(SnapshotRoot(OnRecordPut(store, "run-0", pointer_moves_to_it)), plan)
    assert report.abandoned and "run run-0 is live" in report.abandon_reason
    assert objects(store).keys() == before.keys()  # run-0 whole, and run-1 not touched either
    assert snapshots.read_run("run-0").deleting_at is None  # publishable again
    assert report.to_dict()["deleted_objects"] == 0 and report.marked_deleted == ()


def test_a_cleanup_whose_every_deletion_failed_fails_in_the_operator_and_the_cli(file_root, monkeypatch, capsys):
    import json

    from airflow_provider_shardyfusion.cli import main
    from airflow_provider_shardyfusion.core.errors import StorageError
    from airflow_provider_shardyfusion.core.storage.local import LocalStore
    from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator

    store = open_store(file_root)
    three_runs(store)
    before = objects(store)
    # A store that refuses deletes (a bucket policy): not reproducible with local files as root.
    monkeypatch.setattr(LocalStore, "delete_many", lambda self, keys: [(k, "AccessDenied: not allowed") for k in keys])
    op = DeferredCleanupOperator(task_id="cleanup", output_uri=file_root, keep_runs=1, grace_period=0)
    with pytest.raises(StorageError, match=r"deleted none of \d+ planned object\(s\): \d+ error\(s\): .*AccessDenied"):
        op.execute({})
    capsys.readouterr()  # the operator's log lines
    assert main(["cleanup", file_root, "--keep-runs", "1", "--grace-period-seconds", "0"]) == 1
    out = capsys.readouterr()
    assert "deleted none of" in out.err and "AccessDenied" in out.err
    printed = out.out[out.out.index("{\n"):]  # after Airflow's log lines (the operator set its logging up)
    assert json.JSONDecoder().raw_decode(printed)[0]["errors"]  # the report is still printed, failures listed
    assert {k: v for k, v in objects(store).items() if not k.startswith(layout.RUNS_DIR)} == \
        {k: v for k, v in before.items() if not k.startswith(layout.RUNS_DIR)}
    for n in range(3):  # nothing of them went, so they stay publishable
        record = SnapshotRoot(store).read_run(f"run-{n}")
        assert record.deleted_at is None and record.deleting_at is None


def test_a_missing_pointer_is_refused_by_the_dry_run_too(file_root, capsys):
    from airflow_provider_shardyfusion.cli import main
    from airflow_provider_shardyfusion.core.errors import CleanupRefusedError
    from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator

    store = open_store(file_root)
    three_runs(store)
    store.delete_many([layout.CURRENT_KEY])
    before = objects(store)
    for dry_run in (True, False):
        capsys.readouterr()
        op = DeferredCleanupOperator(task_id="c", output_uri=file_root, keep_runs=0, grace_period=0, dry_run=dry_run)
        with pytest.raises(CleanupRefusedError, match=r"_CURRENT is missing.*--run-id run-2"):
            op.execute({})
        assert main(["cleanup", file_root, "--keep-runs", "0", "--grace-period-seconds", "0",
                     *(["--dry-run"] if dry_run else [])]) == 1
        assert "shardyfusion publish" in capsys.readouterr().err
    assert objects(store) == before


def test_what_a_kept_run_may_read_is_kept_when_its_manifest_cannot_tell(store):
    """A delta still being written has no manifest yet, but its record names its base: the base stays.
    A kept run whose manifest is gone and whose record names no base may read anything: nothing goes."""
    t = layout.utc_now()
    day = timedelta(days=1)
    for n, run_id in enumerate(("s1", "s2", "live")):
        succeeded_run(store, run_id, t - (3 - n) * day)
    busy = RunRecordLifecycle(store, "delta-busy", heartbeat_seconds=3600,
                              lease_seconds=(OFFSET + day).total_seconds()).start()
    busy.update(stats={"base_run_id": "s1", "write_mode": "delta"})
    plan = make_plan(SnapshotRoot(store), now=t + OFFSET, keep_runs=1, grace_period=GRACE)
    assert {i.run_id for i in plan.of("expired_snapshots")} == {"s2"}, plan.to_dict()
    assert {s.run_id: s.reason for s in plan.skipped}["s1"] == "its layers are read by kept run delta-busy"

    busy.fail(ShardWriteError("stopped"))
    store.delete_many([store.key_of(SnapshotRoot(store).read_run("s2").manifest_ref)])
    plan = make_plan(SnapshotRoot(store), now=t + OFFSET, keep_runs=1, grace_period=GRACE, keep_run_ids=["s2"])
    assert not plan.of("expired_snapshots"), plan.to_dict()
    assert {s.run_id: s.reason for s in plan.skipped}["s1"].startswith("kept run s2 may read its layers (")
    before = objects(store)
    execute_cleanup(SnapshotRoot(store), plan)
    assert of_run(objects(store), "s1") == of_run(before, "s1") != set()
