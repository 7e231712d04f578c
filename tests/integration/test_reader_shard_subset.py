"""A host serving a subset of the shards: ``ShardedReader(shard_ids=…)``, ``route()``, ``ShardNotServedError`` (SPEC §19)."""

from __future__ import annotations

import collections
import pickle
import threading

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, ReaderError, ShardNotServedError
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.read.shard_subset import compact_ids
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from tests.snapshot_factory import build_snapshot

NUM_DBS = 16
KEYS = range(400)


def _value(i: int) -> bytes:
    return b"v%d" % i


def _shard_of_download(key: str) -> int:
    return int(key.split("db=")[1][:5])


@pytest.fixture
def downloads(monkeypatch):
    """The shard id of every shard file downloaded from now on."""
    seen: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    original = LocalStore.download_file

    def download(self, key: str, local_path: str) -> None:
        with lock:
            seen[_shard_of_download(key)] += 1
        original(self, key, local_path)

    monkeypatch.setattr(LocalStore, "download_file", download)
    return seen


def _publish(root: str, offset: int = 0, num_dbs: int = NUM_DBS) -> None:
    build_snapshot(root, ((k, _value(k + offset)) for k in KEYS), num_dbs=num_dbs)


def test_a_subset_serves_its_keys_and_refuses_the_others_naming_the_shard(file_root, downloads):
    _publish(file_root)
    served = range(4, 8)
    with ShardedReader(file_root, shard_ids=served) as reader:
        assert reader.shard_ids == frozenset(served)
        mine = [k for k in KEYS if route_key(k, NUM_DBS) in served]
        others = [k for k in KEYS if route_key(k, NUM_DBS) not in served]
        assert mine and others
        assert [reader.get(k) for k in mine] == [_value(k) for k in mine]
        assert reader.multi_get(mine) == [_value(k) for k in mine]
        for key in others[:20]:
            assert reader.route(key) == route_key(key, NUM_DBS)  # route() answers for every key
            with pytest.raises(ShardNotServedError) as caught:
                reader.get(key)
            assert (caught.value.key, caught.value.db_id, caught.value.served) == (key, route_key(key, NUM_DBS), "4-7")
            assert f"key {key!r} routes to shard {route_key(key, NUM_DBS)}" in str(caught.value)
            assert "shard_ids 4-7" in str(caught.value)
        with pytest.raises(ShardNotServedError) as caught:
            reader.open_shard(0)
        assert caught.value.db_id == 0
    # Only the served shards were ever downloaded.
    assert set(downloads) == set(served)


def test_multi_get_refuses_a_batch_with_a_key_outside_before_reading_anything(file_root, downloads):
    _publish(file_root)
    with ShardedReader(file_root, shard_ids=[3]) as reader:
        inside = [k for k in KEYS if route_key(k, NUM_DBS) == 3][:5]
        outside = next(k for k in KEYS if route_key(k, NUM_DBS) != 3)
        with pytest.raises(ShardNotServedError) as caught:
            reader.multi_get([*inside, outside, *inside])
        assert caught.value.key == outside
        assert not downloads  # refused whole: not even shard 3 was fetched
        assert reader.multi_get(inside) == [_value(k) for k in inside]
        assert set(downloads) == {3}


def test_refresh_builds_only_the_served_shards(file_root, downloads):
    _publish(file_root)
    with ShardedReader(file_root, shard_ids={1, 2}) as reader:
        keys = [k for k in KEYS if route_key(k, NUM_DBS) in (1, 2)]
        assert reader.multi_get(keys) == [_value(k) for k in keys]
        _publish(file_root, offset=1000)
        assert reader.refresh()
        assert reader.multi_get(keys) == [_value(k + 1000) for k in keys]
        assert set(downloads) == {1, 2}  # both runs: never another shard
        assert {s.db_id for s in reader.describe().open_shards} <= {1, 2}


def test_shard_ids_outside_the_manifest_are_a_config_error(file_root):
    _publish(file_root)
    with pytest.raises(ConfigError, match=r"shard_ids 14-16 name shard\(s\) 16 outside \[0, 16\)"):
        ShardedReader(file_root, shard_ids=range(14, 17))
    with ShardedReader(file_root, shard_ids=[15]) as reader:
        _publish(file_root, num_dbs=8)  # a new run with fewer shards: this host's shard is gone
        with pytest.raises(ConfigError, match="outside"):
            reader.refresh()
        assert reader.get(next(k for k in KEYS if route_key(k, NUM_DBS) == 15)) is not None  # old snapshot kept


@pytest.mark.parametrize("bad", [[], [-1], ["3"], [True], "0-3", 5])
def test_malformed_shard_ids_are_refused(file_root, bad):
    _publish(file_root)
    with pytest.raises(ConfigError):
        ShardedReader(file_root, shard_ids=bad)


def test_error_is_a_reader_error_and_pickles():
    err = ShardNotServedError("msg", key=5, db_id=3, served="0-1")
    assert isinstance(err, ReaderError)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.key, back.db_id, back.served) == ("msg", 5, 3, "0-1")


def test_compact_ids():
    assert compact_ids(range(16)) == "0-15"
    assert compact_ids([40, 41, 32, 0, 1, 2, 47, 42]) == "0-2,32,40-42,47"
    assert compact_ids([7]) == "7"


def test_a_fleet_splits_the_shards_and_a_client_routes(file_root):
    """Four hosts of four shards each answer every key exactly once, routed by ``route``."""
    _publish(file_root)
    hosts = [ShardedReader(file_root, shard_ids=range(i * 4, i * 4 + 4)) for i in range(4)]
    try:
        by_shard = {db_id: host for host in hosts for db_id in host.shard_ids or ()}
        assert sorted(by_shard) == list(range(NUM_DBS))
        for key in KEYS:
            assert by_shard[hosts[0].route(key)].get(key) == _value(key)
    finally:
        for host in hosts:
            host.close()
