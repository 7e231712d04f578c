"""A live reader's refresh to a delta ingests the new layers into the databases it serves (SPEC §13, issue #26).

Building and opening every changed shard again cost about as much as opening the new snapshot
fresh; a live reader (``live=True``) serves its shards from private read-write databases
and ingests each new layer into the open one, the old snapshot pinned to a RocksDB snapshot until
the swap. Snapshots are real (``tests.snapshot_factory``), on the local store.
"""

from __future__ import annotations

import pytest
from rocksdict import Rdict

from airflow_provider_shardyfusion.core.errors import ReaderError
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read import shard_cache
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

NUM_DBS = 4


def _chain(file_root: str) -> tuple[dict[int, bytes], dict[int, bytes | None], list[int], object]:
    """A base of a few keys a shard and a staged delta changing every shard (an update and a deletion each)."""
    keys = keys_by_shard(NUM_DBS, 3)
    base = {k: f"base-{k}".encode() for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, list(base.items()), num_dbs=NUM_DBS, run_id="base", shard_layout="sst")
    upserts = {shard_keys[0]: f"delta-{shard_keys[0]}" for shard_keys in keys.values()}
    deletes = [shard_keys[1] for shard_keys in keys.values()]
    delta = build_delta(file_root, upserts, deletes, run_id="delta", publish=False)
    expected = {**base, **{k: v.encode() for k, v in upserts.items()}, **dict.fromkeys(deletes)}
    order = [keys[db_id][0] for db_id in sorted(keys)]  # one changed key a shard, in shard order
    return base, expected, order, delta


def test_a_refresh_ingests_into_the_served_databases_without_opening_any(file_root, monkeypatch):
    base, expected, _, delta = _chain(file_root)
    opened: list[str] = []

    def recording_rdict(path, *args, **kwargs):
        opened.append(path)
        return Rdict(path, *args, **kwargs)

    with ShardedReader(file_root, live=True) as reader:
        assert {k: reader.get(k) for k in base} == base
        served = dict(reader._state.handles)
        assert len(served) == NUM_DBS
        monkeypatch.setattr(shard_cache, "Rdict", recording_rdict)
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert reader.refresh() and reader.run_id == "delta"
        report = reader.last_refresh
        assert report is not None and report.shards_rebuilt == NUM_DBS and report.layers_downloaded == NUM_DBS
        assert report.layers_reused == NUM_DBS
        assert opened == []  # no database opened, for building or for serving
        assert all(reader._state.handles[db_id] is db for db_id, db in served.items())
        assert {k: reader.get(k) for k in expected} == expected  # updates read, deletions hide the base value
        assert reader.multi_get(list(expected)) == list(expected.values())
        assert opened == []


def test_a_read_racing_a_failed_refresh_sees_the_old_snapshot_whole(file_root, monkeypatch):
    """A multi_get takes the handle of the first shard, then a refresh ingests into it and fails on the
    next shard (a fault injected with a patched ``ingest_live``: RocksDB cannot be made to fail there):
    the read must not mix that shard's new value with the others' old ones, and the old snapshot
    stays served until a later refresh succeeds."""
    base, expected, order, delta = _chain(file_root)
    ingest = shard_cache.ShardCache.ingest_live
    calls: list[int] = []

    def fail_second(self, live, files, shard, run_id, *, reused_layers):
        calls.append(shard.db_id)
        if len(calls) == 2:
            live.broken = True  # as a real failure inside ingest_live leaves it
            raise ReaderError("injected ingestion failure")
        ingest(self, live, files, shard, run_id, reused_layers=reused_layers)

    with ShardedReader(file_root, live=True) as reader:
        assert reader.multi_get(order) == [base[k] for k in order]
        state = reader._state
        taken: list[int] = []

        class RefreshOnFirstHandle(dict):
            def get(self, db_id, default=None):
                db = super().get(db_id, default)
                if not taken:  # this read holds the raw handle of its first shard now
                    taken.append(db_id)
                    publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
                    with pytest.raises(ReaderError, match="injected"):
                        reader.refresh()
                return db

        monkeypatch.setattr(shard_cache.ShardCache, "ingest_live", fail_second)
        state.handles = RefreshOnFirstHandle(state.handles)
        assert reader.multi_get(order) == [base[k] for k in order]
        # the shard whose handle the read held took its new layer before the failure
        assert taken and calls[0] == taken[0] and len(calls) == 2 and reader.run_id == "base"
        assert {k: reader.get(k) for k in base} == base
        state.handles = dict(state.handles)
        during: list[list[bytes | None]] = []

        def read_then_ingest(self, live, files, shard, run_id, *, reused_layers):
            # The next refresh has pinned the old snapshot again: the shard that took its layer in
            # the failed refresh must still read as before.
            if not during:
                during.append(reader.multi_get(order))
            ingest(self, live, files, shard, run_id, reused_layers=reused_layers)

        monkeypatch.setattr(shard_cache.ShardCache, "ingest_live", read_then_ingest)
        assert reader.refresh() and reader.run_id == "delta"
        assert during == [[base[k] for k in order]]
        assert {k: reader.get(k) for k in expected} == expected
        assert reader.multi_get(list(expected)) == list(expected.values())


def test_only_a_live_reader_opens_live_databases(file_root, monkeypatch):
    """Live databases cost descriptors and memory: a reader asks for them; a pinned one never refreshes."""
    base, _, _, _ = _chain(file_root)
    written: list[str] = []

    def recording_rdict(path, *args, **kwargs):
        if "access_type" not in kwargs and "shardyfusion-live-" in path:
            written.append(path)
        return Rdict(path, *args, **kwargs)

    monkeypatch.setattr(shard_cache, "Rdict", recording_rdict)
    manifest_ref = SnapshotRoot(open_store(file_root)).read_run("base").manifest_ref
    with ShardedReader(file_root, manifest_ref=manifest_ref) as pinned, ShardedReader(file_root) as reader:
        assert {k: pinned.get(k) for k in base} == base
        assert {k: reader.get(k) for k in base} == base
    assert written == []
    with pytest.raises(ReaderError, match="live=True is for a reader that follows _CURRENT"):
        ShardedReader(file_root, manifest_ref=manifest_ref, live=True)
    with ShardedReader(file_root, live=True) as follower:  # the recording sees live databases where there are some
        assert {k: follower.get(k) for k in base} == base
    assert len(written) == NUM_DBS
