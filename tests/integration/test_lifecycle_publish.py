"""Publishing staged runs and rolling back (SPEC §8, ``publish_run``), on the local store and S3.

Snapshots are real RocksDB shards laid out by the snapshot factory; readers follow every move of
``_CURRENT`` with ``refresh()`` and read exact values back.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import PublishManifestError, RunAbandoned
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.run_record import RUNNING, RunRecord
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot

KEYS = list(range(0, 400, 3))


def stage(root, options, name: str, minutes_ago: float):
    """A staged run: shards, manifest and a succeeded run record; ``_CURRENT`` untouched."""
    built = build_snapshot(root, [(k, f"{name}-{k}".encode()) for k in KEYS], num_dbs=4, storage_options=options,
                           run_id=name, publish=False,
                           published_at=layout.utc_now() - timedelta(minutes=minutes_ago))
    return built


def values(reader: ShardedReader) -> set[bytes]:
    return {v for v in reader.multi_get(KEYS)}


@pytest.fixture
def runs(any_root):
    root, options = any_root
    snapshots = SnapshotRoot(open_store(root, options))
    built = {name: stage(root, options, name, age) for name, age in (("run-a", 30), ("run-b", 20), ("run-c", 10))}
    return snapshots, options, built


def test_publish_rollback_and_roll_forward_are_followed_by_readers(runs, tmp_path):
    snapshots, options, _ = runs
    nowait = {"sleep": lambda s: None}
    first = publish_run(snapshots, run_id="run-a", **nowait)
    assert first.moved and first.previous_run_id is None and not first.rollback
    assert snapshots.read_run("run-a").published_at is not None
    with ShardedReader(snapshots.root, storage_options=options, cache_dir=tmp_path) as reader:
        assert values(reader) == {f"run-a-{k}".encode() for k in KEYS}

        forward = publish_run(snapshots, run_id="run-c", **nowait)
        assert forward.moved and forward.pointer.previous_run_id == "run-a"
        assert reader.refresh() is True and reader.run_id == "run-c"
        assert values(reader) == {f"run-c-{k}".encode() for k in KEYS}

        with pytest.raises(PublishManifestError, match=r"refusing to move it backwards.*allow_older=True"):
            publish_run(snapshots, run_id="run-a", **nowait)
        assert snapshots.current().run_id == "run-c" and reader.refresh() is False

        back = publish_run(snapshots, run_id="run-a", allow_older=True, **nowait)
        assert back.moved and back.rollback and back.pointer.previous_run_id == "run-c"
        assert reader.refresh() is True and reader.run_id == "run-a"
        assert values(reader) == {f"run-a-{k}".encode() for k in KEYS}

        again = publish_run(snapshots, run_id="run-c", **nowait)  # forward again: no allow_older needed
        assert again.moved and not again.rollback and again.pointer.previous_run_id == "run-a"
        assert reader.refresh() is True and values(reader) == {f"run-c-{k}".encode() for k in KEYS}

    noop = publish_run(snapshots, run_id="run-c", **nowait)
    assert not noop.moved and noop.pointer.manifest_ref == again.pointer.manifest_ref
    assert [p.run_id for p in snapshots.published_history()][:2] == ["run-c", "run-a"]


def test_publish_refuses_a_run_whose_record_is_not_succeeded(runs):
    snapshots, _, _built = runs
    publish_run(snapshots, run_id="run-a", sleep=lambda s: None)
    record = snapshots.read_run("run-b")
    snapshots.store.put(layout.run_record_key("run-b"), RunRecord(**{
        **{f: getattr(record, f) for f in record.__dataclass_fields__}, "status": RUNNING}).to_bytes())

    snapshots.mark_failed("run-b", RunAbandoned("abandoned: lease expired"))
    failed = r"run-b.*status is 'failed', not 'succeeded' \(RunAbandoned: abandoned: lease expired\).*_CURRENT unchanged"
    with pytest.raises(PublishManifestError, match=failed):
        publish_run(snapshots, run_id="run-b", sleep=lambda s: None)
    assert snapshots.current().run_id == "run-a"


def test_a_publisher_whose_clock_is_hours_off_is_refused_and_frees_its_claim(runs):
    from airflow_provider_shardyfusion.core.errors import ClockSkewError

    snapshots, _, _built = runs
    publish_run(snapshots, run_id="run-a", sleep=lambda s: None)
    # Cleanup judges a publish claim by its own clock: a claim stamped hours off would look expired.
    with pytest.raises(ClockSkewError, match=r"run_id=run-b/run.json.*synchronise the clock \(NTP\) of the "
                                              r"machine publishing"):
        publish_run(snapshots, run_id="run-b", sleep=lambda s: None,
                    clock=lambda: layout.utc_now() - timedelta(hours=3))
    assert snapshots.current().run_id == "run-a" and snapshots.read_run("run-b").publishing_at is None
    publish_run(snapshots, run_id="run-b", sleep=lambda s: None)
    assert snapshots.current().run_id == "run-b"


def test_a_concurrent_publisher_makes_the_move_decide_again(runs):
    """Between our read of ``_CURRENT`` and our conditional put, another publisher moves it to a
    newer run: the put fails, we re-read, and now refuse to move it backwards."""
    snapshots, _, _built = runs
    publish_run(snapshots, run_id="run-a", sleep=lambda s: None)
    store = snapshots.store
    raced: list[str] = []

    class Racer:
        def __getattr__(self, name):
            return getattr(store, name)

        def put_if_match(self, key, data, etag, **kwargs):
            if key == layout.CURRENT_KEY and not raced:
                raced.append("run-c")
                publish_run(snapshots, run_id="run-c", sleep=lambda s: None)
            return store.put_if_match(key, data, etag, **kwargs)

    racing = SnapshotRoot(Racer())  # type: ignore[arg-type]
    with pytest.raises(PublishManifestError, match="refusing to move it backwards"):
        publish_run(racing, run_id="run-b", sleep=lambda s: None)
    assert raced == ["run-c"] and snapshots.current().run_id == "run-c"
    assert snapshots.read_run("run-b").published_at is None
