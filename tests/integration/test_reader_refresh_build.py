"""What ``refresh()`` to a delta does to the shards a reader serves (SPEC §13, issue #26).

A live reader with a memory-backed folder ingests the new layer into the database it serves
(``test_reader_live_refresh``). Without one, a changed shard is built in the cache on the database
the reader serves by ingesting only the new layer (the served SSTs linked in). Snapshots are real
(``tests.snapshot_factory``: shard databases and delta layers written by ``core``), on the local
store; ``Rdict`` is wrapped only to record which folders are opened for writing.
"""

from __future__ import annotations

import os

import pytest
from rocksdict import Rdict

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read import local_copy
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reader_probes import record_databases
from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

NUM_DBS = 6


def _base_ref(root: str) -> str:
    return SnapshotRoot(open_store(root)).read_run("base").manifest_ref


def _ssts(folder: str) -> set[int]:
    return {os.stat(os.path.join(folder, n)).st_ino for n in os.listdir(folder) if n.endswith(".sst")}


@pytest.mark.parametrize("mode", ["live", "in-memory", "on-disk"])
def test_a_refresh_builds_each_changed_shard_on_the_served_files_and_pinned_readers_keep_theirs(
        file_root, tmp_path, monkeypatch, mode):
    keys = keys_by_shard(NUM_DBS, 5)
    base = {k: f"base-{k}".encode() for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, list(base.items()), num_dbs=NUM_DBS, run_id="base", shard_layout="sst")
    upserts = {shard_keys[1]: f"delta-{shard_keys[1]}" for shard_keys in keys.values()}  # every shard changes
    deletes = [shard_keys[2] for shard_keys in keys.values()]
    delta = build_delta(file_root, upserts, deletes, run_id="delta", publish=False)
    expected = {**base, **{k: v.encode() for k, v in upserts.items()}, **dict.fromkeys(deletes)}
    if mode == "on-disk":  # no memory-backed folder: the build runs in the cache's staging folder
        monkeypatch.setattr(local_copy.scratch, "memory_dir", lambda: None)
    written: list[str] = []

    def recording_rdict(path, *args, **kwargs):
        if "access_type" not in kwargs:
            written.append(os.path.abspath(path))
        return Rdict(path, *args, **kwargs)

    cache = str(tmp_path / "cache")
    with ShardedReader(file_root, cache_dir=cache, ingest_refreshes=mode == "live") as follower, \
            ShardedReader(file_root, cache_dir=cache, manifest_ref=_base_ref(file_root)) as pinned:
        assert {k: follower.get(k) for k in base} == base
        assert {k: pinned.get(k) for k in base} == base
        served = {db_id: _ssts(layout.local_cache_dir(cache, "base", db_id)) for db_id in range(NUM_DBS)}
        record_databases(monkeypatch, recording_rdict)
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert follower.refresh() and follower.run_id == "delta"
        report = follower.last_refresh
        assert report is not None and report.shards_rebuilt == NUM_DBS and report.layers_downloaded == NUM_DBS
        assert report.layers_reused == NUM_DBS  # each built on the served database, not from every layer
        if mode == "live":  # the layer went into the live database: nothing built, nothing opened
            assert written == []
            assert not os.path.exists(layout.local_cache_dir(cache, "delta", 0))
        else:
            assert len(written) == NUM_DBS
            in_cache = [p for p in written if p.startswith(cache + os.sep)]
            assert in_cache == ([] if mode == "in-memory" else written)
            for db_id in range(NUM_DBS):  # the served SSTs are shared (hard links), not copied
                assert served[db_id] < _ssts(layout.local_cache_dir(cache, "delta", db_id))
        assert {k: follower.get(k) for k in expected} == expected
        assert follower.multi_get(list(expected)) == list(expected.values())
        assert {k: pinned.get(k) for k in base} == base  # the old run's folders are untouched
    # A reader opening the old run later re-checks its cached copy (marker checksums) and reuses it.
    with ShardedReader(file_root, cache_dir=cache, manifest_ref=_base_ref(file_root)) as later:
        assert {k: later.get(k) for k in base} == base
        assert later.cache_stats["layers_downloaded"] == 0
