"""The cleanup/publish fence (issue 22): no run goes live while cleanup deletes it.

Cleanup and a publish of the run cleanup is deleting (a rollback to it, or a staged run approved
late) are interleaved at every step of each: the storage calls of one side are counted, and before
its k-th call the other side runs to its end. Forced by a hook on the store, never by sleeps. At
every step `_CURRENT` must name a run whose files are all there, and a watching reader (refreshing
at every step) must read the live snapshot exactly. A control run with cleanup's claim switched
off shows the same hooks do reach the window. Both stores.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import CleanupRefusedError, PublishManifestError
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.lifecycle.integrity import check_storage
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot

NO_SLEEP = {"sleep": lambda s: None}
STORE_CALLS = {"get", "put", "put_if_match", "put_if_absent", "list", "delete_many", "head", "exists"}
KEYS = range(24)


def values(run_id: str) -> dict[int, bytes]:
    return {k: f"{run_id}:{k}".encode() for k in KEYS}


class HookedStore:
    """The store, with ``before(call_number)`` run before each of its storage calls."""

    def __init__(self, inner, before):
        self._inner = inner
        self._before = before
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in STORE_CALLS:
            return attr

        def call(*args, **kwargs):
            self.calls += 1
            self._before(self.calls)
            return attr(*args, **kwargs)

        return call


def build_root(root: str, options) -> None:
    """run-a live two hours ago, run-s written then but never published (staged, awaiting approval),
    run-b live an hour ago: cleanup (keep_runs=1) deletes run-a and run-s."""
    now = layout.utc_now()
    # (The factory dates a staged run's start and manifest by published_at too, not stamping it.)
    for run_id, age, publish in (("run-a", 2, True), ("run-s", 1.5, False), ("run-b", 1, True)):
        build_snapshot(root, sorted(values(run_id).items()), num_dbs=3, run_id=run_id, storage_options=options,
                       published_at=now - timedelta(hours=age), publish=publish, shard_layout="sst")


def cleanup(snapshots: SnapshotRoot) -> None:
    execute_cleanup(snapshots, make_plan(snapshots, keep_runs=1, grace_period=0))


def publisher(run_id: str):
    """A publish of ``run_id``, a run cleanup deletes: a rollback (run-a) or a late approval (run-s)."""

    def publish(snapshots: SnapshotRoot) -> None:
        # Refused when the fence or the integrity check saw cleanup at work: that is a right outcome.
        with contextlib.suppress(PublishManifestError):
            publish_run(snapshots, run_id=run_id, allow_older=True, **NO_SLEEP)

    return publish


class Watcher:
    """Checks, at every step, that the live run is whole and reads back exactly.

    ``strict=False`` counts the steps that found it broken instead of failing (the control run).
    """

    def __init__(self, root: str, options, tmp_path, *, strict: bool = True):
        self.snapshots = SnapshotRoot(open_store(root, options))
        self.reader = ShardedReader(root, storage_options=options, cache_dir=tmp_path / "watcher")
        self.strict = strict
        self.checks = self.rows = self.broken = 0

    def check(self) -> None:
        try:
            self._check()
        except Exception:
            if self.strict:
                raise
            self.broken += 1

    def _check(self) -> None:
        self.checks += 1
        live = self.snapshots.current()
        manifest = self.snapshots.read_manifest(live)
        assert check_storage(self.snapshots, manifest) == [], f"_CURRENT names {live.run_id} with missing data"
        self.reader.refresh()
        assert self.reader.manifest.run_id == live.run_id
        got = self.reader.multi_get(list(KEYS))
        assert dict(zip(KEYS, got, strict=True)) == values(live.run_id)
        self.rows += len(got)


def run_interleaved(root: str, options, tmp_path, first, second, k: int, *, strict: bool = True):
    """Build a root, run ``first`` with ``second`` run to its end before first's k-th storage call
    (after first ends if it makes fewer), the watcher checking before every call of ``first`` from
    the k-th on (k == 0: every call, and ``second`` after the end).
    Returns the watcher, how many calls ``first`` made, and the end state."""
    build_root(root, options)
    store = open_store(root, options)
    watcher = Watcher(root, options, tmp_path, strict=strict)
    done = False

    def before(call: int) -> None:
        nonlocal done
        if call == k and not done:
            done = True
            second(SnapshotRoot(store))
        # Before call k, ``first`` has made the same calls on the same root as in the run with
        # k == 0 (which checks every step), so the checks there would only repeat its checks.
        if call >= k:
            watcher.check()

    hooked = HookedStore(store, before)
    first(SnapshotRoot(hooked))
    if not done:
        second(SnapshotRoot(store))
    watcher.check()
    watcher.reader.close()
    return watcher, hooked.calls, SnapshotRoot(store)


def end_state(snapshots: SnapshotRoot, target: str) -> tuple[str, bool]:
    """The live run, and whether ``target`` is both live and deleted (what the fence forbids)."""
    live = snapshots.current().run_id
    return f"live={live},{target}={'deleted' if snapshots.read_run(target).deleted_at else 'kept'}", \
        live == target and snapshots.read_run(target).deleted_at is not None


ORDERS = {"publish-inside-cleanup": lambda pub: (cleanup, pub), "cleanup-inside-publish": lambda pub: (pub, cleanup)}


@pytest.mark.parametrize("target", ["run-a", "run-s"], ids=["rollback", "late-approval"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_cleanup_and_publish_interleaved_at_every_step(any_root, tmp_path, figure, order, target):
    base, options = any_root
    first, second = ORDERS[order](publisher(target))
    _, steps, _ = run_interleaved(f"{base}/count", options, tmp_path / "count", first, lambda s: None, 0)
    outcomes = set()
    checks = rows = 0
    for k in range(1, steps + 2):  # k == steps + 1: second runs after first has finished
        watcher, _, snapshots = run_interleaved(f"{base}/k{k:03d}", options, tmp_path / f"k{k}", first, second, k)
        outcome, forbidden = end_state(snapshots, target)
        assert not forbidden, f"interleaving {k}: {outcome}"
        outcomes.add(outcome)
        checks += watcher.checks
        rows += watcher.rows
    assert len(outcomes) >= 2, outcomes  # the interleavings really reach both orders
    figure(interleavings=steps + 1, live_checks=checks, rows_read=rows, outcomes=len(outcomes))


@pytest.mark.parametrize("target", ["run-a", "run-s"], ids=["rollback", "late-approval"])
def test_without_the_fence_the_same_interleavings_break_the_live_snapshot(any_root, tmp_path, figure, monkeypatch,
                                                                        target):
    """The control: cleanup's claim switched off, the hooks find _CURRENT naming a run being deleted.
    (Proves the interleavings above reach the window the fence closes.)"""
    from airflow_provider_shardyfusion.core.lifecycle import cleanup as cleanup_module

    monkeypatch.setattr(cleanup_module, "_claim_for_deletion", lambda snapshots, run_id, **kw: None)
    base, options = any_root
    first, second = ORDERS["publish-inside-cleanup"](publisher(target))
    _, steps, _ = run_interleaved(f"{base}/count", options, tmp_path / "count", first, lambda s: None, 0)
    broken = []
    for k in range(1, steps + 2):
        watcher, _, snapshots = run_interleaved(f"{base}/k{k:03d}", options, tmp_path / f"k{k}", first, second, k,
                                                strict=False)
        if watcher.broken or end_state(snapshots, target)[1]:
            broken.append(k)
    assert broken, "no interleaving reached the window between cleanup's pointer check and its deletion"
    figure(interleavings=steps + 1, broken_without_the_fence=len(broken))


def test_grace_covers_every_run_live_within_it(any_root, tmp_path, figure):
    """v1 live for hours, v2 and v3 published a second apart: a reader still on v1 keeps reading it."""
    root, options = any_root
    now = layout.utc_now()
    build_snapshot(root, sorted(values("v1").items()), num_dbs=3, run_id="v1", storage_options=options,
                   published_at=now - timedelta(hours=5), shard_layout="sst")
    reader = ShardedReader(root, storage_options=options, cache_dir=tmp_path / "reader")
    # v2 and v3 go live a second apart, an hour from now (the factory stamps published_at as a
    # pointer move does); the plan is made half an hour after that, so every object is old enough.
    for n, run_id in enumerate(("v2", "v3")):
        build_snapshot(root, sorted(values(run_id).items()), num_dbs=3, run_id=run_id, storage_options=options,
                       published_at=now + timedelta(hours=1, seconds=n), shard_layout="sst")
    snapshots = SnapshotRoot(open_store(root, options))
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(hours=1), now=now + timedelta(hours=1.5))
    report = execute_cleanup(snapshots, plan)
    assert "v1" not in {i.run_id for i in plan.items}
    assert any(s.run_id == "v1" and s.rule == "recently_live" for s in plan.skipped), plan.skipped
    assert dict(zip(KEYS, reader.multi_get(list(KEYS)), strict=True)) == values("v1")  # fresh shards too
    reader.close()
    later = make_plan(snapshots, keep_runs=1, grace_period=timedelta(hours=1), now=now + timedelta(hours=3))
    assert {i.run_id for i in later.of("expired_snapshots")} == {"v1", "v2"}
    done = execute_cleanup(snapshots, later)
    assert set(done.marked_deleted) == {"v1", "v2"} and snapshots.read_run("v1").deleted_at is not None
    assert not [o for o in snapshots.store.list(layout.SHARDS_DIR + "/") if "run_id=v1/" in o.key]
    assert snapshots.current().run_id == "v3"
    figure(runs_kept_by_the_grace=len([s for s in plan.skipped if s.rule == "recently_live"]),
           objects_deleted_now=report.to_dict()["deleted_objects"], runs_deleted_after_the_grace=len(done.marked_deleted),
           rows_checked=len(KEYS))


def test_grace_keeps_a_run_whose_published_stamp_was_lost(any_root, tmp_path, figure, monkeypatch):
    """v2 staged hours ago, then approved: the pointer moved but its published_at stamp was lost (the
    publish only warns). v3 and v4 go live a second apart an hour later: a reader still on v2 keeps
    reading it through the grace period, and then it goes."""
    from airflow_provider_shardyfusion.core.errors import StorageError

    root, options = any_root
    now = layout.utc_now()
    build_snapshot(root, sorted(values("v1").items()), num_dbs=3, run_id="v1", storage_options=options,
                   published_at=now - timedelta(hours=5), shard_layout="sst")
    build_snapshot(root, sorted(values("v2").items()), num_dbs=3, run_id="v2", storage_options=options,
                   published_at=now - timedelta(hours=4), publish=False, shard_layout="sst")
    snapshots = SnapshotRoot(open_store(root, options))
    lost = []

    def stamp_lost(self, run_id, *args, **kwargs):
        lost.append(run_id)
        raise StorageError(f"PUT runs/run_id={run_id}/run.json: connection reset")

    with monkeypatch.context() as patched:
        patched.setattr(SnapshotRoot, "mark_published", stamp_lost)
        publish_run(snapshots, run_id="v2", **NO_SLEEP)
    record = snapshots.read_run("v2")
    assert lost == ["v2"] and snapshots.current().run_id == "v2"
    assert record.published_at is None and record.publishing_at is not None
    reader = ShardedReader(root, storage_options=options, cache_dir=tmp_path / "reader")
    assert dict(zip(KEYS, reader.multi_get(list(KEYS)), strict=True)) == values("v2")
    reader.close()
    reader = ShardedReader(root, storage_options=options, cache_dir=tmp_path / "reader2",
                           manifest_ref=snapshots.current().manifest_ref)
    for n, run_id in enumerate(("v3", "v4")):
        build_snapshot(root, sorted(values(run_id).items()), num_dbs=3, run_id=run_id, storage_options=options,
                       published_at=now + timedelta(hours=1, seconds=n), shard_layout="sst")
    plan = make_plan(snapshots, keep_runs=1, grace_period=timedelta(hours=1), now=now + timedelta(hours=1.5))
    report = execute_cleanup(snapshots, plan)
    assert ("v2", "recently_live") in {(s.run_id, s.rule) for s in plan.skipped}, plan.to_dict()
    assert "v2" not in {i.run_id for i in plan.items}
    assert dict(zip(KEYS, reader.multi_get(list(KEYS)), strict=True)) == values("v2")  # fresh shards too
    reader.close()
    later = make_plan(snapshots, keep_runs=1, grace_period=timedelta(hours=1), now=now + timedelta(hours=3))
    assert {i.run_id for i in later.of("expired_snapshots")} == {"v1", "v2", "v3"}
    done = execute_cleanup(snapshots, later)
    # v2's claim is minutes old on the real clock (its stamp never cleared it): the execution keeps
    # it until the claim expires, as it would a publish under way.
    assert snapshots.current().run_id == "v4" and set(done.marked_deleted) == {"v1", "v3"}
    assert [s.run_id for s in done.skipped_runs] == ["v2"] and "a publish claimed it" in done.skipped_runs[0].reason
    figure(stamps_lost=len(lost), runs_kept_by_the_grace=len([s for s in plan.skipped if s.rule == "recently_live"]),
           objects_deleted_now=report.to_dict()["deleted_objects"], runs_deleted_after_the_grace=len(done.marked_deleted),
           rows_checked=2 * len(KEYS))


def test_missing_pointer_refuses_cleanup(any_root, figure):
    root, options = any_root
    now = layout.utc_now()
    for n, run_id in enumerate(("old", "last")):
        build_snapshot(root, sorted(values(run_id).items()), num_dbs=3, run_id=run_id, storage_options=options,
                       published_at=now - timedelta(hours=5 - n), shard_layout="sst")
    store = open_store(root, options)
    store.delete_many([layout.CURRENT_KEY])
    before = {o.key for o in store.list("")}
    snapshots = SnapshotRoot(store)
    with pytest.raises(CleanupRefusedError, match=r"_CURRENT is missing.*'last'.*shardyfusion publish .* --run-id last"):
        make_plan(snapshots, keep_runs=0, grace_period=0)
    assert {o.key for o in store.list("")} == before
    publish_run(snapshots, run_id="last", **NO_SLEEP)  # what the error says restores the snapshot
    assert snapshots.current().run_id == "last"
    figure(objects_before=len(before), objects_deleted=0)
