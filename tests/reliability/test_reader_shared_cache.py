"""Several processes share one ``cache_dir``: each shard is fetched and built once, never read half-built (SPEC §19).

The processes are started with ``spawn`` (a fresh interpreter each, as separate service workers
are) and meet at a barrier, so they ask for the same shards at the same moment.
"""

from __future__ import annotations

import collections
import fcntl
import glob
import multiprocessing
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUT_SST
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.read.cache_lock import lock_path
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from tests.polling import wait_for
from tests.reliability.fault_proxy import FaultProxy
from tests.snapshot_factory import build_snapshot

NUM_DBS = 64
PROCESSES = 4
KEYS = 3000
SPAWN = multiprocessing.get_context("spawn")


def _value(key: int) -> bytes:
    return b"value-%d-" % key * 4


def _open_every_shard(root: str, options: dict[str, Any] | None, cache_dir: str, barrier: Any, results: Any) -> None:
    """One worker process: open all shards at once (16 threads), then read every key."""
    with ShardedReader(root, cache_dir=cache_dir, storage_options=options) as reader, ThreadPoolExecutor(16) as pool:
        barrier.wait(timeout=120)  # every process has its manifest: the opens start together
        list(pool.map(reader.open_shard, range(NUM_DBS)))
        values = reader.multi_get(list(range(KEYS)))
        wrong = [k for k, v in zip(range(KEYS), values, strict=True) if v != _value(k)]
        results.put((os.getpid(), len(values), wrong[:10], reader.cache_stats["layers_downloaded"]))


@pytest.mark.s3
def test_four_processes_fetch_each_object_once_and_read_exact_values(s3_server, s3_root, s3_options, tmp_path, figure):
    built = build_snapshot(s3_root, ((k, _value(k)) for k in range(KEYS)), num_dbs=NUM_DBS,
                           storage_options=s3_options, shard_layout=SHARD_LAYOUT_SST, ssts_per_shard=2)
    shard_files = {f"{s.db_url.split('://', 1)[1].split('/', 1)[1]}/{f.name}" for s in built.manifest.shards for f in s.files}
    cache_dir = str(tmp_path / "shared-cache")
    with FaultProxy(s3_server) as proxy:  # no rules: it only counts what crosses it
        options = {**s3_options, "endpoint_url": proxy.url}
        barrier, results = SPAWN.Barrier(PROCESSES), SPAWN.Queue()
        procs = [SPAWN.Process(target=_open_every_shard, args=(s3_root, options, cache_dir, barrier, results))
                 for _ in range(PROCESSES)]
        for proc in procs:
            proc.start()
        answers = [results.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert [proc.exitcode for proc in procs] == [0] * PROCESSES
        gets = collections.Counter(path.lstrip("/").split("?")[0] for method, path, _ in proxy.log
                                   if method == "GET" and "/shards/" in path)
    fetched = {re.sub(r"^[^/]+/", "", path): n for path, n in gets.items()}  # without the bucket
    assert set(fetched) == shard_files, "every shard file, and nothing else under shards/, was fetched"
    assert set(fetched.values()) == {1}, {p: n for p, n in fetched.items() if n != 1}
    assert all(n == KEYS and wrong == [] for _, n, wrong, _ in answers), answers
    built_by = [downloaded for *_, downloaded in answers]
    assert sum(built_by) == NUM_DBS  # each shard built by exactly one process
    figure(processes=PROCESSES, shards=NUM_DBS, objects=len(shard_files), gets=sum(gets.values()),
           shards_built_per_process="/".join(map(str, sorted(built_by))), values_checked=PROCESSES * KEYS)


def _crash_while_building(root: str, cache_dir: str, db_id: int, holding: Any) -> None:
    """Start building ``db_id``; after its first file is downloaded, signal and hang (to be killed)."""
    from airflow_provider_shardyfusion.core.storage.local import LocalStore

    original = LocalStore.download_file

    def download(self: Any, key: str, local_path: str) -> None:
        original(self, key, local_path)
        holding.set()
        time.sleep(600)

    LocalStore.download_file = download  # type: ignore[method-assign]
    ShardedReader(root, cache_dir=cache_dir).open_shard(db_id)


def _lock_is_free(path: str) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_builder_killed_holding_the_lock_is_recovered_by_the_next_opener(file_root, tmp_path, figure):
    built = build_snapshot(file_root, ((k, _value(k)) for k in range(500)), num_dbs=4,
                           shard_layout=SHARD_LAYOUT_SST, ssts_per_shard=3)
    cache_dir = str(tmp_path / "shared-cache")
    db_id = 2
    final = layout.local_cache_dir(cache_dir, built.run_id, db_id)
    holding = SPAWN.Event()
    builder = SPAWN.Process(target=_crash_while_building, args=(file_root, cache_dir, db_id, holding))
    builder.start()
    try:
        assert holding.wait(timeout=120), "the builder never started downloading"
        assert not _lock_is_free(lock_path(final))  # it holds the lock mid-build
        assert glob.glob(os.path.join(os.path.dirname(final), ".tmp-*")), "its staging folder exists"
        assert not os.path.exists(final)  # and nothing half-built is visible under the shard's name
    finally:
        builder.kill()
        builder.join(timeout=30)
    assert builder.exitcode == -9
    wait_for(lambda: _lock_is_free(lock_path(final)), what="the kernel to release the dead builder's lock")

    with ShardedReader(file_root, cache_dir=cache_dir) as reader:
        keys = [k for k in range(500) if route_key(k, 4) == db_id]
        assert reader.multi_get(keys) == [_value(k) for k in keys]
        assert reader.cache_stats["layers_downloaded"] == 1
        figure(builders_killed=1, shards_rebuilt=reader.cache_stats["shards_built"], values_checked=len(keys))
    assert not glob.glob(os.path.join(os.path.dirname(final), ".tmp-*")), "the dead builder's staging was removed"
    assert not os.path.exists(lock_path(final))  # and its lock file
    assert os.path.isdir(final)
