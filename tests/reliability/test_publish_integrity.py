"""Publish trusts nothing it has not checked (issue 22): edited staged manifests, swapped manifest
references, deleted or failed runs, the pointer a racing publish replaced, and cleanups that fail.
Both stores."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError, PublishManifestError, StorageError
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.lifecycle.validation import validate_snapshot
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot
from tests.snapshot_helpers import publish_written_run

NO_SLEEP = {"sleep": lambda s: None}


@pytest.fixture
def snapshots(any_root):
    root, options = any_root
    return SnapshotRoot(open_store(root, options))


def test_an_edited_staged_manifest_is_refused_by_publish_and_validation(snapshots, figure):
    publish_written_run(snapshots.store, "live", started_minutes_ago=10)
    staged = publish_written_run(snapshots.store, "staged", live=False)
    assert staged.manifest_checksum and staged.manifest_size
    ref = snapshots.manifest_ref(staged.manifest_ref)
    doc = json.loads(snapshots.store.get(ref.key).data)
    doc["num_dbs"] = 5  # self-consistent: every shard is empty, so the edited manifest still validates
    snapshots.store.put(ref.key, json.dumps(doc).encode())
    with pytest.raises(PublishManifestError, match=r"'staged'.*changed after the run was written.*_CURRENT unchanged"):
        publish_run(snapshots, run_id="staged", **NO_SLEEP)
    with pytest.raises(ManifestValidationError, match=r"changed after the run was written"):
        validate_snapshot(snapshots, run_id="staged")
    assert snapshots.current().run_id == "live"
    figure(manifests_edited=1, publishes_refused=1, validations_refused=1, pointer_moves=0)


def test_a_record_naming_another_runs_manifest_is_refused(snapshots, figure):
    publish_written_run(snapshots.store, "v1", started_minutes_ago=10)
    v2 = publish_written_run(snapshots.store, "v2", started_minutes_ago=5, live=False)
    v3 = publish_written_run(snapshots.store, "v3", live=False)
    swapped = replace(v2, manifest_ref=v3.manifest_ref)
    snapshots.store.put(layout.run_record_key("v2"), swapped.to_bytes())
    with pytest.raises(PublishManifestError, match=r"'v2' names manifest .*run 'v3''s"):
        publish_run(snapshots, run_id="v2", **NO_SLEEP)
    assert snapshots.current().run_id == "v1"
    figure(records_swapped=1, publishes_refused=1, pointer_moves=0)


def test_publishing_a_deleted_or_failed_run_says_so(snapshots, figure):
    build = snapshots.store.root
    now = layout.utc_now()
    for n, run_id in enumerate(("gone", "kept")):
        build_snapshot(build, [(1, b"x"), (2, b"y")], num_dbs=2, run_id=run_id,
                       storage_options=_options(snapshots), published_at=now - timedelta(hours=5 - n))
    execute_cleanup(snapshots, make_plan(snapshots, keep_runs=1, grace_period=0))
    deleted_at = snapshots.read_run("gone").deleted_at
    assert deleted_at is not None
    with pytest.raises(PublishManifestError, match=rf"deleted by cleanup at {layout.format_ts(deleted_at)}"):
        publish_run(snapshots, run_id="gone", allow_older=True, **NO_SLEEP)

    from airflow_provider_shardyfusion.core.errors import RunAbandoned
    from tests.snapshot_helpers import write_run_record

    write_run_record(snapshots.store, "broken")
    snapshots.mark_failed("broken", RunAbandoned("abandoned: lease expired"))
    with pytest.raises(PublishManifestError, match=r"run 'broken' failed \(RunAbandoned: abandoned: lease expired\)"):
        publish_run(snapshots, run_id="broken", **NO_SLEEP)
    assert snapshots.current().run_id == "kept"
    figure(publishes_refused=2, named_the_cleanup_time=1, named_the_runs_own_error=1, pointer_moves=0)


def test_previous_run_id_is_the_run_the_move_replaced(snapshots, figure):
    publish_written_run(snapshots.store, "a", started_minutes_ago=10, live=True)
    publish_written_run(snapshots.store, "b", started_minutes_ago=5, live=False)
    publish_written_run(snapshots.store, "c", live=False)
    store = snapshots.store
    raced = False

    class Racing:
        """The store; a concurrent publisher moves _CURRENT just before our conditional put."""

        def __getattr__(self, name):
            return getattr(store, name)

        def put_if_match(self, key, data, etag, **kw):
            nonlocal raced
            if key == layout.CURRENT_KEY and not raced:
                raced = True
                publish_run(SnapshotRoot(store), run_id="b", **NO_SLEEP)
            return store.put_if_match(key, data, etag, **kw)

    racing = SnapshotRoot(store)
    racing.store = Racing()
    result = publish_run(racing, run_id="c", **NO_SLEEP)
    assert raced and result.moved
    assert result.previous_run_id == "b" == result.pointer.previous_run_id
    assert snapshots.current().run_id == "c"
    figure(races=1, previous_run_id_reported=result.previous_run_id, previous_run_id_first_read="a")


def test_a_cleanup_whose_every_deletion_failed_fails(snapshots, figure):
    now = layout.utc_now()
    for n, run_id in enumerate(("old", "new")):
        build_snapshot(snapshots.store.root, [(1, b"x")], num_dbs=2, run_id=run_id,
                       storage_options=_options(snapshots), published_at=now - timedelta(hours=5 - n))
    store = snapshots.store

    class Refusing:
        def __getattr__(self, name):
            return getattr(store, name)

        def delete_many(self, keys):
            return [(k, "AccessDenied: not allowed") for k in keys]

    refusing = SnapshotRoot(store)
    refusing.store = Refusing()
    report = execute_cleanup(refusing, make_plan(refusing, keep_runs=1, grace_period=0))
    with pytest.raises(StorageError, match=r"deleted none of \d+ planned object\(s\).*AccessDenied"):
        report.raise_if_nothing_deleted()
    assert snapshots.read_run("old").deleted_at is None
    planned = sum(len(i.objects) for i in report.plan.items)
    figure(objects_planned=planned, deletions_refused=len(report.errors), cleanups_failed=1, runs_marked_deleted=0)


def _options(snapshots: SnapshotRoot):
    opts = snapshots.store.options if hasattr(snapshots.store, "options") else None
    return opts.to_dict() if opts is not None and hasattr(opts, "to_dict") else None
