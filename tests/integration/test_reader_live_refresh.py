"""A live reader's refresh to a delta ingests the new layers into the databases it serves (SPEC §13, issue #26).

Building and opening every changed shard again cost about as much as opening the new snapshot
fresh; a reader that ingests refreshes (``ingest_refreshes=True``) serves its shards from live shards (column families of private
read-write databases) and ingests each new layer into the open one, the old snapshot pinned to a RocksDB snapshot until
the swap. Snapshots are real (``tests.snapshot_factory``), on the local store.
"""

from __future__ import annotations

import os
import time

import pytest
from rocksdict import Rdict

from airflow_provider_shardyfusion.core.errors import ReaderError
from airflow_provider_shardyfusion.core.model.rocksdb_options import live_shard_options
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read import live_shards
from airflow_provider_shardyfusion.core.read.live_shards import LIVE_CF_FILES, live_fixed_files
from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.reader_probes import record_databases
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


def _live_shards(reader: ShardedReader) -> dict[int, str]:
    """The live shard (its never-reused name) serving each open shard that has one."""
    return {shard.db_id: shard.live_shard for shard in reader.describe().live_shards}


def test_a_refresh_ingests_into_the_served_databases_without_opening_any(file_root, monkeypatch):
    base, expected, _, delta = _chain(file_root)
    opened: list[str] = []

    def recording_rdict(path, *args, **kwargs):
        opened.append(path)
        return Rdict(path, *args, **kwargs)

    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        assert {k: reader.get(k) for k in base} == base
        served = _live_shards(reader)
        assert len(served) == NUM_DBS
        record_databases(monkeypatch, recording_rdict)
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert reader.refresh() and reader.run_id == "delta"
        report = reader.last_refresh
        assert report is not None and report.shards_rebuilt == NUM_DBS and report.layers_downloaded == NUM_DBS
        assert report.layers_reused == NUM_DBS
        assert opened == []  # no database opened, for building or for serving
        assert _live_shards(reader) == served  # the very live shards, ingested into
        assert {k: reader.get(k) for k in expected} == expected  # updates read, deletions hide the base value
        assert reader.multi_get(list(expected)) == list(expected.values())
        assert opened == []


def test_a_read_racing_a_failed_refresh_sees_the_old_snapshot_whole(file_root, monkeypatch):
    """A multi_get takes the handle of the first shard, then a refresh ingests into it and fails on the
    next shard (a fault injected with a patched ``LiveShards.ingest``: RocksDB cannot be made to fail
    there): the read must not mix that shard's new value with the others' old ones, and the old
    snapshot stays served until a later refresh succeeds. The read is caught between taking a
    handle and reading it through the handles of every snapshot (a dict that runs the refresh)."""
    base, expected, order, delta = _chain(file_root)
    ingest = live_shards.LiveShards.ingest
    calls: list[int] = []

    def fail_second(self, live, files, shard, run_id, *, reused_layers):
        calls.append(shard.db_id)
        if len(calls) == 2:
            live.broken = True  # as a real failure inside LiveShards.ingest leaves it
            raise ReaderError("injected ingestion failure")
        ingest(self, live, files, shard, run_id, reused_layers=reused_layers)

    taken: list[int] = []
    armed = [False]

    class RefreshOnFirstHandle(dict):
        def get(self, db_id, default=None):
            db = super().get(db_id, default)
            if armed[0] and not taken:  # this read holds the raw handle of its first shard now
                taken.append(db_id)
                publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
                with pytest.raises(ReaderError, match="injected"):
                    reader.refresh()
            return db

    init = LoadedSnapshot.__init__

    def handles_that_refresh(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.handles = RefreshOnFirstHandle()

    monkeypatch.setattr(LoadedSnapshot, "__init__", handles_that_refresh)
    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        assert reader.multi_get(order) == [base[k] for k in order]
        monkeypatch.setattr(live_shards.LiveShards, "ingest", fail_second)
        armed[0] = True
        assert reader.multi_get(order) == [base[k] for k in order]
        # the shard whose handle the read held took its new layer before the failure
        assert taken and calls[0] == taken[0] and len(calls) == 2 and reader.run_id == "base"
        held = reader.describe()  # the old snapshot stays pinned: its live shards may hold more now
        assert len(held.live_shards) == NUM_DBS and all(shard.pinned for shard in held.live_shards)
        assert {k: reader.get(k) for k in base} == base
        during: list[list[bytes | None]] = []

        def read_then_ingest(self, live, files, shard, run_id, *, reused_layers):
            # The next refresh has pinned the old snapshot again: the shard that took its layer in
            # the failed refresh must still read as before.
            if not during:
                during.append(reader.multi_get(order))
            ingest(self, live, files, shard, run_id, reused_layers=reused_layers)

        monkeypatch.setattr(live_shards.LiveShards, "ingest", read_then_ingest)
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

    record_databases(monkeypatch, recording_rdict)
    manifest_ref = SnapshotRoot(open_store(file_root)).read_run("base").manifest_ref
    with ShardedReader(file_root, manifest_ref=manifest_ref) as pinned, ShardedReader(file_root) as reader:
        assert {k: pinned.get(k) for k in base} == base
        assert {k: reader.get(k) for k in base} == base
    assert written == []
    with pytest.raises(ReaderError, match="ingest_refreshes=True is for a reader that follows _CURRENT"):
        ShardedReader(file_root, manifest_ref=manifest_ref, ingest_refreshes=True)
    with ShardedReader(file_root, ingest_refreshes=True) as follower:  # the recording sees live databases where there are some
        assert {k: follower.get(k) for k in base} == base
    assert len(written) == 1  # one live database holds up to LIVE_SHARDS_PER_DB live shards


def test_the_former_name_live_is_refused_naming_ingest_refreshes(file_root):
    """``live`` means the run ``_CURRENT`` names: the option that ingests refreshes is not called so."""
    _chain(file_root)
    for value in (True, False):
        with pytest.raises(ReaderError, match=rf"ShardedReader\(live={value}\) is now ShardedReader\(ingest_refreshes={value}\)"):
            ShardedReader(file_root, live=value)  # type: ignore[arg-type]


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_live_reader_holds_its_ssts_and_a_few_descriptors_more(file_root):
    """Live shards share live databases (column families): a live reader of many shards holds about
    one descriptor per SST and one per shard more, not a database's six per shard (issue #26)."""
    num_dbs = 48
    keys = keys_by_shard(num_dbs, 2)
    base = {k: f"base-{k}".encode() for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, list(base.items()), num_dbs=num_dbs, run_id="base", shard_layout="sst")
    idle = _descriptors()
    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        assert {k: reader.get(k) for k in base} == base
        held_now = reader.describe()
        assert len(held_now.open_shards) == num_dbs and len(held_now.live_shards) == num_dbs
        ssts = sum(len(shard.files) for shard in reader.manifest.shards)  # as published, ingested as they are
        held = _descriptors() - idle
        print("descriptors:", {"shards": num_dbs, "ssts": ssts, "held": held, "counted": held_now.files_held})
        assert ssts >= num_dbs
        assert ssts <= held <= ssts + num_dbs * LIVE_CF_FILES + live_fixed_files(num_dbs)
        assert held_now.files_held == ssts + num_dbs * LIVE_CF_FILES
    assert _descriptors() <= idle  # closing releases every one


def test_evicting_a_live_shard_releases_its_descriptors(file_root):
    """A live shard evicted to stay within ``max_open_files`` drops its column family: its SSTs close."""
    num_dbs = 24
    keys = keys_by_shard(num_dbs, 2)
    base = {k: f"base-{k}".encode() for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, list(base.items()), num_dbs=num_dbs, run_id="base", shard_layout="sst")
    bound = 8 * (1 + LIVE_CF_FILES) + live_fixed_files(num_dbs)  # room for 8 live shards of one SST
    idle = _descriptors()
    with ShardedReader(file_root, ingest_refreshes=True, max_open_files=bound) as reader:
        assert {k: reader.get(k) for k in base} == base  # every shard opened, most evicted again
        assert len(reader.describe().open_shards) <= 8
        held = _descriptors() - idle
        print("descriptors:", {"shards": num_dbs, "held": held, "bound": bound})
        assert held <= bound
        assert {k: reader.get(k) for k in base} == base  # evicted shards open again, exactly
        # A refresh still builds every shard the reader served, closed meanwhile or not, refresh after refresh.
        expected = dict(base)
        for step in (1, 2):
            upserts = {shard_keys[0]: f"step{step}-{shard_keys[0]}".encode() for shard_keys in keys.values()}
            build_delta(file_root, upserts, run_id=f"delta{step}")
            assert reader.refresh() and reader.last_refresh is not None
            assert reader.last_refresh.shards_rebuilt == num_dbs
            expected.update(upserts)
            live = set(_live_shards(reader))  # the shards the refresh ingested into, served last
            # Reads of the other shards close those live shards again before the next refresh.
            others = {k: v for k, v in expected.items() if reader.shard_for_key(k) not in live}
            assert {k: reader.get(k) for k in others} == others
            assert _descriptors() - idle <= bound
        assert {k: reader.get(k) for k in expected} == expected


def _merging_off() -> object:
    """The live shards' options without RocksDB's background merging (see ``live_shard_options``), so
    what the bound on sorted runs does alone is seen, not a race with the background."""
    opts = live_shard_options()
    opts.set_disable_auto_compactions(True)
    return opts


def test_a_live_shard_past_max_local_layers_is_compacted_in_place(file_root, monkeypatch):
    """A refresh leaving a live shard with more than ``max_local_layers`` sorted runs compacts it in
    place (no database opened), under the pin of the old snapshot, which keeps reading its values:
    the first such refresh pins a live database never written to (RocksDB sequence number 0)."""
    keys = keys_by_shard(NUM_DBS, 3)
    base = {k: f"base-{k}".encode() for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, list(base.items()), num_dbs=NUM_DBS, run_id="base", shard_layout="sst")
    monkeypatch.setattr(live_shards, "live_shard_options", _merging_off)
    opened: list[str] = []
    refreshing = [False]  # build_delta reads the base with a reader of its own: not recorded

    def recording_rdict(path, *args, **kwargs):
        if refreshing[0]:
            opened.append(path)
        return Rdict(path, *args, **kwargs)

    ingest = live_shards.LiveShards.ingest
    pinned_reads: list[list[bytes | None]] = []

    def read_old_then_ingest(self, live, files, shard, run_id, *, reused_layers):
        ingest(self, live, files, shard, run_id, reused_layers=reused_layers)  # compacted in there
        pinned_reads.append(reader.multi_get(list(expected)))  # the old snapshot, through its pin

    expected = dict(base)
    with ShardedReader(file_root, ingest_refreshes=True, max_local_layers=1) as reader:
        assert {k: reader.get(k) for k in base} == base
        served = _live_shards(reader)
        record_databases(monkeypatch, recording_rdict)
        monkeypatch.setattr(live_shards.LiveShards, "ingest", read_old_then_ingest)
        compacted = []
        for step in (1, 2):
            upserts = {shard_keys[0]: f"step{step}-{shard_keys[0]}" for shard_keys in keys.values()}
            deletes = [shard_keys[step] for shard_keys in keys.values()]
            build_delta(file_root, upserts, deletes, run_id=f"delta{step}")
            pinned_reads[:] = []
            refreshing[0] = True
            assert reader.refresh() and reader.run_id == f"delta{step}"
            refreshing[0] = False
            assert pinned_reads == [list(expected.values())] * NUM_DBS
            assert reader.last_refresh is not None
            compacted.append(reader.last_refresh.shards_compacted)
            expected.update({k: v.encode() for k, v in upserts.items()})
            expected.update(dict.fromkeys(deletes))
            assert {k: reader.get(k) for k in expected} == expected
        assert compacted == [NUM_DBS, NUM_DBS]  # 2 sorted runs > 1 each time: compacted into one
        assert opened == []  # compacted where it is: no database built or opened
        assert _live_shards(reader) == served
        assert [shard.sorted_runs for shard in reader.describe().live_shards] == [1] * NUM_DBS
        assert reader.multi_get(list(expected)) == list(expected.values())


def test_a_live_shard_merges_a_refreshs_layers_in_the_background(file_root):
    """Between bounds, RocksDB merges each ingested layer into the level below in the background, so
    a follower's shards read from one sorted run again, as a fresh reader's compacted ones do."""
    _, expected, _, delta = _chain(file_root)
    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        reader.multi_get(list(expected))
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert reader.refresh() and reader.last_refresh is not None
        assert reader.last_refresh.shards_compacted == 0  # 2 runs: within max_local_layers
        deadline = time.monotonic() + 30
        while any(s.sorted_runs > 1 for s in reader.describe().live_shards) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [s.sorted_runs for s in reader.describe().live_shards] == [1] * NUM_DBS
        assert {k: reader.get(k) for k in expected} == expected
        assert reader.multi_get(list(expected)) == list(expected.values())


@pytest.mark.parametrize("room", ["none", "one shard"])
def test_a_live_reader_short_of_memory_serves_the_other_shards_read_only(file_root, monkeypatch, caplog, room):
    """Merges rewrite a live shard into the memory-backed folder: a reader keeps its live shards within
    half of the room that folder had (a container's /dev/shm may be 64 MB) and reads the rest from the
    cache, exactly, before and after a refresh."""
    base, expected, _, delta = _chain(file_root)
    with ShardedReader(file_root) as plain:
        sizes = [shard.byte_size for shard in plain.manifest.shards]
    free = 0 if room == "none" else 2 * max(sizes)  # half of it is the budget: the largest shard alone
    monkeypatch.setattr(live_shards, "_free_bytes", lambda folder: free)
    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        assert {k: reader.get(k) for k in base} == base
        held = reader.describe()
        live = len(held.live_shards)
        assert len(held.open_shards) == NUM_DBS
        assert live == 0 if room == "none" else 1 <= live < NUM_DBS
        assert "no room for shard" in caplog.text
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert reader.refresh() and reader.run_id == "delta"
        assert reader.last_refresh is not None and reader.last_refresh.shards_rebuilt == NUM_DBS
        assert {k: reader.get(k) for k in expected} == expected
        assert reader.multi_get(list(expected)) == list(expected.values())
