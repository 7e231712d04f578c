"""Chain manifests (SPEC §17): a delta stores only its change and is read through its base's manifest.

Snapshots are built through ``core`` alone (``tests.snapshot_factory``: real SST shards and delta
layers written by ``core.write.delta`` against the base shard, as the Spark writer does); the Spark
writer's own chains are proven in ``test_delta.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from datetime import timedelta

import pytest
from rocksdict import Options, Rdict

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.encoding import encode_key
from airflow_provider_shardyfusion.core.model.manifest import CHAIN_FORMAT_VERSION
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot, forget_decoded_manifests
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from tests.snapshot_factory import build_delta, build_snapshot, publish_current


def _apply(model: dict, upserts: dict, deletes=()) -> dict:
    out = {**model, **{k: v.encode() for k, v in upserts.items()}}
    for k in deletes:
        out.pop(k, None)
    return out


def _check(reader: ShardedReader, model: dict, absent=()) -> None:
    keys = sorted(model)
    assert reader.multi_get(keys) == [model[k] for k in keys]
    assert reader.multi_get(list(absent)) == [None] * len(absent)


def _stored(store, uri: str) -> tuple[bytes, dict]:
    data = store.get(store.key_of(uri)).data
    return data, json.loads(data)


def independent_read(store, manifest_uri: str, keys) -> dict:
    """Rebuild a snapshot from the stored JSON alone, following ``base_manifest_ref`` by hand:
    each shard's layers oldest first, ingested into a fresh RocksDB with rocksdict (no reader code)."""
    docs = []
    uri = manifest_uri
    while uri is not None:
        data, doc = _stored(store, uri)
        if docs:  # the checksum the newer document recorded for this one
            assert bytes_checksum(data) == docs[-1]["base_manifest_checksum"]
        docs.append(doc)
        uri = doc.get("base_manifest_ref")
    layers: dict[int, list[tuple[str, list[str]]]] = {}
    for doc in reversed(docs):  # oldest first
        for shard in doc["shards"]:
            own = shard.get("layers") or [{"db_url": shard["db_url"], "files": shard["files"]}]
            layers.setdefault(shard["db_id"], []).extend((x["db_url"], [f["name"] for f in x["files"]]) for x in own)
    top = docs[0]
    out = {}
    with tempfile.TemporaryDirectory() as work:
        dbs = {}
        for db_id, shard_layers in layers.items():
            db = dbs[db_id] = Rdict(os.path.join(work, f"db{db_id}"), Options(raw_mode=True))
            for i, (db_url, names) in enumerate(shard_layers):
                paths = []
                for name in names:
                    path = os.path.join(work, f"{db_id}-{i}-{name}")
                    with open(path, "wb") as f:
                        f.write(store.get(f"{store.key_of(db_url).rstrip('/')}/{name}").data)
                    paths.append(path)
                db.ingest_external_file(paths)
        for key in keys:
            db = dbs.get(route_key(key, top["num_dbs"]))
            value = db.get(encode_key(key, top["key_encoding"])) if db is not None else None
            if value is not None:
                out[key] = value
        for db in dbs.values():
            db.close()
    return out


def test_a_small_delta_stores_a_small_manifest_that_an_independent_reader_follows(any_root):
    root, options = any_root
    model = {k: f"v0-{k}".encode() for k in range(3000)}
    base = build_snapshot(root, model.items(), num_dbs=512, storage_options=options, run_id="base",
                          shard_layout="sst")
    upserts, deletes = {7: "v1-7", 5000: "new"}, [11]
    delta = build_delta(root, upserts, deletes, storage_options=options, run_id="delta")
    model = _apply(model, upserts, deletes)
    store = open_store(root, options)
    base_bytes, _ = _stored(store, base.manifest_ref)
    delta_bytes, doc = _stored(store, delta.manifest_ref)
    assert doc["format_version"] == 3 and doc["base_manifest_ref"] == base.manifest_ref
    assert len(doc["shards"]) <= 3 and all(len(s["layers"]) == 1 for s in doc["shards"])
    assert len(delta_bytes) <= 0.10 * len(base_bytes), (len(delta_bytes), len(base_bytes))
    keys = [*range(3000), 5000, 9999]
    assert independent_read(store, delta.manifest_ref, keys) == model
    with ShardedReader(root, storage_options=options) as reader:
        _check(reader, model, absent=[11, 9999])
        assert reader.manifest.row_count == len(model) == reader.manifest.stats["rows"]


@pytest.fixture
def manifest_reads(monkeypatch):
    """Counts reads of manifest objects through the local store (the reader's own store included)."""
    seen: list[str] = []
    original = LocalStore.get

    def counting(self, key):
        if key.startswith(layout.MANIFESTS_DIR + "/"):
            seen.append(key)
        return original(self, key)

    monkeypatch.setattr(LocalStore, "get", counting)
    return seen


def test_a_reader_follows_a_chain_of_depth_16_reading_one_manifest_per_refresh(file_root, manifest_reads):
    model = {k: f"v0-{k}".encode() for k in range(400)}
    build_snapshot(file_root, model.items(), num_dbs=16, run_id="d00", shard_layout="sst")
    reader = ShardedReader(file_root)
    for depth in range(1, 17):
        upserts = {k: f"v{depth}-{k}" for k in range(depth, 400, 37)} | {1000 + depth: "new"}
        deletes = [depth * 3, 2000]
        build_delta(file_root, upserts, deletes, run_id=f"d{depth:02d}")
        model = _apply(model, upserts, deletes)
        manifest_reads.clear()
        assert reader.refresh() is True and reader.manifest.chain_depth == depth
        assert len(manifest_reads) == 1, manifest_reads  # only the new document: its base is cached
        _check(reader, model, absent=[2000])
    reader.close()
    manifest_reads.clear()
    with ShardedReader(file_root) as again:  # this process decoded the chain already: only the pointer's manifest
        assert len(manifest_reads) == 1
        _check(again, model)
    forget_decoded_manifests()
    manifest_reads.clear()
    with ShardedReader(file_root) as fresh:
        assert len(manifest_reads) == 17  # a fresh open reads chain_depth + 1 manifests
        _check(fresh, model)
        assert fresh.manifest.row_count == len(model)
        assert fresh.manifest.shard(0).layers[0].run_id == "d00"


def test_a_format_2_chain_continued_by_a_format_3_delta(any_root):
    root, options = any_root
    model = {k: f"v0-{k}".encode() for k in range(300)}
    build_snapshot(root, model.items(), num_dbs=8, storage_options=options, run_id="full", shard_layout="sst")
    build_delta(root, {1: "v1-1"}, [2], storage_options=options, run_id="old-delta")
    model = _apply(model, {1: "v1-1"}, [2])
    # As a writer before format 3 stored it: the whole chain restated, format 2.
    store = open_store(root, options)
    snapshots = SnapshotRoot(store)
    whole = snapshots.read_manifest(snapshots.find_manifest("old-delta"))
    v2 = replace(whole, format_version=CHAIN_FORMAT_VERSION, base_manifest_ref=None, base_manifest_checksum=None)
    assert v2.stored_document() is v2 and len(v2.shards) == 8
    key = layout.manifest_key("old-delta", layout.utc_now() + timedelta(seconds=1))
    store.put(key, v2.to_bytes())
    publish_current(store, key, "old-delta")
    new = build_delta(root, {3: "v2-3"}, [4], storage_options=options, run_id="new-delta")
    model = _apply(model, {3: "v2-3"}, [4])
    _, doc = _stored(store, new.manifest_ref)
    assert doc["format_version"] == 3 and doc["base_manifest_ref"] == store.uri(key)
    with ShardedReader(root, storage_options=options) as reader:
        _check(reader, model, absent=[2, 4])
        assert reader.manifest.chain_depth == 2
    assert independent_read(store, new.manifest_ref, range(300)) == model


def test_rollback_within_a_chain_and_cleanup_keep_what_it_reads(file_root):
    models = [{k: f"v0-{k}".encode() for k in range(200)}]
    build_snapshot(file_root, models[0].items(), num_dbs=4, run_id="r0",
                   published_at=layout.utc_now() - timedelta(minutes=5), shard_layout="sst")
    for i in range(1, 4):
        upserts = {k: f"v{i}-{k}" for k in range(i, 200, 9)}
        build_delta(file_root, upserts, [i * 7 + 100], run_id=f"r{i}",
                    published_at=layout.utc_now() - timedelta(minutes=5 - i))
        models.append(_apply(models[-1], upserts, [i * 7 + 100]))
    # An empty delta: a chain document with no shards, and later runs read through it.
    build_delta(file_root, {}, [], run_id="r4", published_at=layout.utc_now() - timedelta(minutes=1))
    models.append(models[-1])
    snapshots = SnapshotRoot.open(file_root)
    publish_run(snapshots, run_id="r2", allow_older=True)
    with ShardedReader(file_root) as reader:
        assert reader.run_id == "r2"
        _check(reader, models[2])
    # keep_runs=1 and no grace: the newest run, r4, is kept, and with it every run its chain reads
    # (r3 wrote layers; r4 wrote none but is read through r3's manifest); r2 is live.
    plan = make_plan(snapshots, keep_runs=1, grace_period=0)
    assert {i.run_id for i in plan.items if i.category != "losing_attempts"} == set()
    reasons = {s.run_id: s.reason for s in plan.skipped}
    assert reasons["r3"] == "its layers are read by kept run r4", reasons
    execute_cleanup(snapshots, plan)
    with ShardedReader(file_root) as reader:
        _check(reader, models[2])
    # Forward again along the chain (r4 goes live only on its base r3): it reads exactly.
    publish_run(snapshots, run_id="r3")
    publish_run(snapshots, run_id="r4")
    with ShardedReader(file_root) as reader:
        assert reader.run_id == "r4"
        _check(reader, models[4])


def test_an_empty_delta_in_a_kept_chain_keeps_its_manifest(file_root):
    build_snapshot(file_root, [(k, b"v") for k in range(50)], num_dbs=4, run_id="e0",
                   published_at=layout.utc_now() - timedelta(minutes=3), shard_layout="sst")
    build_delta(file_root, {}, [], run_id="e1", published_at=layout.utc_now() - timedelta(minutes=2))
    build_delta(file_root, {1: "x"}, [], run_id="e2", published_at=layout.utc_now() - timedelta(minutes=1))
    store = open_store(file_root)
    _, doc = _stored(store, SnapshotRoot(store).find_manifest("e1").uri)
    assert doc["shards"] == []  # it changed nothing, but e2 is read through it
    snapshots = SnapshotRoot(store)
    execute_cleanup(snapshots, make_plan(snapshots, keep_runs=1, grace_period=0))
    with ShardedReader(file_root) as reader:
        assert reader.get(1) == b"x" and reader.get(2) == b"v"


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_missing_or_altered_ancestor_is_an_error_naming_it(file_root, damage):
    build_snapshot(file_root, [(k, b"v") for k in range(50)], num_dbs=4, run_id="a0", shard_layout="sst")
    build_delta(file_root, {1: "one"}, [], run_id="a1")
    store = open_store(file_root)
    with ShardedReader(file_root) as follower:
        build_delta(file_root, {2: "two"}, [], run_id="a2")
        victim = SnapshotRoot(store).find_manifest("a1")
        if damage == "missing":
            store.delete_many([victim.key])
        else:
            store.put(victim.key, store.get(victim.key).data + b" ")  # still valid JSON, other bytes
        # This process verified a1 before the damage: a refresh builds on that copy, one manifest read.
        assert follower.refresh() is True and follower.run_id == "a2"
        assert (follower.get(1), follower.get(2), follower.get(3)) == (b"one", b"two", b"v")
        forget_decoded_manifests()  # as a new process: a1 must be read again, and that is refused
        with pytest.raises(ManifestValidationError) as failed:
            SnapshotRoot(store).read_manifest(SnapshotRoot(store).current())
        text = str(failed.value)
        assert victim.uri in text and "'a1'" in text and "'a2'" in text
        assert ("does not exist" if damage == "missing" else "altered") in text
        with pytest.raises(ManifestValidationError, match="'a1'"):
            ShardedReader(file_root)


def test_a_fresh_load_of_a_chain_hashes_each_manifest_once(file_root, monkeypatch):
    """The pointer's manifest was hashed three times per load (pointer check, cache key, parse check):
    at 100k shards each pass is a sizeable part of the decode. Counted on the real hash, not replaced."""
    from airflow_provider_shardyfusion.core.model import checksum as checksum_module

    build_snapshot(file_root, [(k, b"v") for k in range(60)], num_dbs=4, run_id="h0", shard_layout="sst")
    build_delta(file_root, {1: "one"}, [2], run_id="h1")
    hashed: list[bytes] = []
    real = checksum_module.xxhash

    class Counting:
        @staticmethod
        def xxh3_128(data):
            hashed.append(bytes(data))
            return real.xxh3_128(data)

    snapshots = SnapshotRoot(open_store(file_root))
    store = snapshots.store
    mine, base = (store.get(snapshots.find_manifest(run).key).data for run in ("h1", "h0"))
    # As a publish records it (move_pointer): the manifest's checksum and size, which a load checks.
    published = replace(snapshots.current(), manifest_checksum=bytes_checksum(mine), manifest_size=len(mine))
    store.put(layout.CURRENT_KEY, published.to_bytes())
    pointer = snapshots.current()
    assert pointer == published
    forget_decoded_manifests()
    monkeypatch.setattr(checksum_module, "xxhash", Counting)
    resolved = snapshots.read_manifest_chain(pointer)
    monkeypatch.setattr(checksum_module, "xxhash", real)
    assert resolved.manifest.run_id == "h1" and resolved.checksum == bytes_checksum(mine)
    assert sorted(hashed) == sorted([mine, base])  # each manifest of the chain once, nothing else


@pytest.mark.parametrize("key_index", [True, False], ids=["key-indexes", "base-without-key-indexes"])
def test_one_task_database_answers_each_shard_of_a_chain_exactly(file_root, tmp_path, key_index):
    """A delta task's base shards share one local database (core.write.delta.TaskBase): a key routes to one
    shard, so each shard's existence answers stay exact, tombstones of later layers included. A layer
    with a key index is read as it alone; a layer written before key indexes (here the base's full
    layers) as its data."""
    from airflow_provider_shardyfusion.core.write.delta import Change, TaskBase, base_exists
    from airflow_provider_shardyfusion.core.write.key_index import KEY_INDEX_FILE

    model = {k: b"v" for k in range(200)}
    build_snapshot(file_root, model.items(), num_dbs=6, run_id="t0", shard_layout="sst", key_index=key_index)
    build_delta(file_root, {500: "new", 7: "x"}, [3, 4, 5, 999], run_id="t1")
    model = _apply(model, {500: "new", 7: "x"}, [3, 4, 5])
    snapshots = SnapshotRoot(open_store(file_root))
    base = snapshots.read_manifest(snapshots.find_manifest("t1"))
    store = snapshots.store
    downloaded: list[tuple[str, int]] = []
    real_download, real_get = store.download_file, store.get

    def recording_download(key: str, local: str) -> None:
        real_download(key, local)
        downloaded.append((key.rsplit("/", 1)[1], os.path.getsize(local)))

    def recording_get(key: str):
        found = real_get(key)
        downloaded.append((key.rsplit("/", 1)[1], len(found.data)))
        return found

    # The real reads, counted: small files are fetched with one GET, larger ones downloaded.
    store.download_file = recording_download  # type: ignore[method-assign]
    store.get = recording_get  # type: ignore[method-assign]
    shared = TaskBase(store, base, str(tmp_path / "task"))
    probes = [*range(0, 210), 500, 501, 999]
    try:
        for db_id in range(base.num_dbs):
            mine = [k for k in probes if route_key(k, base.num_dbs) == db_id]
            changes = [Change(encode_key(k, base.key_encoding), b"y") for k in mine]
            assert base_exists(shared.shard_db(db_id), changes) == [k in model for k in mine], db_id
        assert os.listdir(tmp_path / "task") == ["db"]  # one database; every verified file moved into it
    finally:
        shared.close()
    layers = [layer for s in base.shards for layer in s.all_layers()]
    assert all(layer.key_index is None for layer in layers if layer.run_id == "t1")  # small: read as data
    assert all((layer.key_index is not None) is key_index for layer in layers if layer.run_id == "t0")
    expected = [(f.name, f.size) for layer in layers
                for f in ((layer.key_index,) if layer.key_index is not None else layer.files)]
    assert sorted(downloaded) == sorted(expected)
    assert shared.bytes_read == sum(size for _, size in downloaded)
    if key_index:
        assert {name for name, _ in downloaded} == {KEY_INDEX_FILE, "layer-00000.sst"}
        assert shared.bytes_read < sum(layer.byte_size for layer in layers)
