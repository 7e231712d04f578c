"""``AsyncShardedReader``: the same answers as ``ShardedReader``, never blocking the loop, nothing leaked (SPEC §19)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from pathlib import Path

import pytest

from airflow_provider_shardyfusion import AsyncShardedReader
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ReaderError, ShardNotServedError
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from tests.polling import wait_for
from tests.snapshot_factory import build_snapshot, publish_current

ROOT = Path(__file__).resolve().parents[2]
NUM_DBS = 8
KEYS = list(range(600))


def _value(key: int) -> bytes:
    return b"async-%d" % key


def _publish(root: str, offset: int = 0) -> None:
    build_snapshot(root, ((k, _value(k + offset)) for k in KEYS), num_dbs=NUM_DBS)


def _pool_threads(reader: AsyncShardedReader) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(reader.thread_name_prefix + "_")]


def _fds_under(path: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path + os.sep):
            found.append(target)
    return found


def test_answers_what_the_sync_reader_answers(file_root):
    _publish(file_root)

    async def scenario() -> None:
        async with await AsyncShardedReader.open(file_root, max_workers=3) as reader:
            with ShardedReader(file_root) as sync:
                got = await asyncio.gather(*(reader.get(k) for k in KEYS))
                assert got == [sync.get(k) for k in KEYS] == [_value(k) for k in KEYS]
                assert await reader.multi_get(iter([5, 10_000, 7])) == sync.multi_get([5, 10_000, 7])
                assert reader.route(42) == sync.route(42) == route_key(42, NUM_DBS)
                assert reader.run_id == sync.run_id
                assert not await reader.refresh()
                _publish(file_root, offset=1)
                assert await reader.refresh()
                assert await reader.get(3) == _value(4)
                assert reader.describe().run_id == reader.run_id
                health = await reader.health()
                assert health.status == "healthy" and health.run_id == reader.run_id
                assert health.shards_open == reader.reader.health().shards_open > 0
        with pytest.raises(ReaderError, match="closed"):
            await reader.get(1)
        await reader.aclose()  # idempotent

    asyncio.run(scenario())


def test_errors_reach_the_caller_and_shard_ids_pass_through(file_root):
    _publish(file_root)

    async def scenario() -> None:
        async with AsyncShardedReader(file_root, shard_ids=[0]) as reader:
            outside = next(k for k in KEYS if route_key(k, NUM_DBS) != 0)
            with pytest.raises(ShardNotServedError):
                await reader.get(outside)
            assert reader.shard_ids == frozenset({0})

    asyncio.run(scenario())
    with pytest.raises(ReaderError, match="max_workers"):
        AsyncShardedReader(file_root, max_workers=0)


def test_the_loop_keeps_ticking_while_a_cold_shard_downloads(file_root, monkeypatch):
    _publish(file_root)
    started, release = threading.Event(), threading.Event()
    original = LocalStore.download_file

    def slow_download(self, key: str, local_path: str) -> None:
        started.set()
        assert release.wait(60), "the test never released the download"
        original(self, key, local_path)

    monkeypatch.setattr(LocalStore, "download_file", slow_download)

    async def scenario() -> None:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        async def until(condition, what: str) -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not condition():
                assert loop.time() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.005)

        async with AsyncShardedReader(file_root) as reader:
            beat = asyncio.create_task(heartbeat())
            get = asyncio.create_task(reader.get(1))
            await until(started.is_set, "the download to start")
            at_start = ticks
            await until(lambda: ticks >= at_start + 50, "50 heartbeats during the download")
            assert not get.done()  # still downloading, and the loop ran all along
            release.set()
            assert await get == _value(1)
            beat.cancel()

    asyncio.run(scenario())


def test_cancelled_calls_leak_nothing(file_root, monkeypatch):
    _publish(file_root)
    gate = threading.Event()
    original = LocalStore.download_file

    def gated_download(self, key: str, local_path: str) -> None:
        assert gate.wait(60)
        original(self, key, local_path)

    monkeypatch.setattr(LocalStore, "download_file", gated_download)

    async def scenario() -> tuple[str, set[int | None]]:
        reader = AsyncShardedReader(file_root, max_workers=4, max_open_shards=4)
        cache = reader.reader.cache_dir
        threads_before = {t.ident for t in threading.enumerate()}
        calls = [asyncio.create_task(reader.get(k)) for k in KEYS[:400]]
        calls += [asyncio.create_task(reader.multi_get(KEYS[i:i + 20])) for i in range(0, 200, 20)]
        await asyncio.sleep(0.05)  # let the workers pick up the first calls (they wait at the gate)
        for call in calls:
            call.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        gate.set()  # the calls already on a worker run on; their results are dropped
        # The reader still answers, within its bounds, after the storm of cancellations.
        assert await reader.multi_get(KEYS) == [_value(k) for k in KEYS]
        description = reader.describe()
        assert len(description.open_shards) <= 4
        assert len(_pool_threads(reader)) <= 4
        await reader.aclose()
        assert _pool_threads(reader) == []
        assert _fds_under(cache) == []
        with pytest.raises(ReaderError, match="closed"):
            reader.describe()
        return cache, threads_before

    cache, threads_before = asyncio.run(scenario())
    assert not os.path.exists(cache)  # the private cache is gone: no download was left running
    # aclose()'s own helper thread may still be returning when the loop resumes.
    wait_for(lambda: {t.ident for t in threading.enumerate()} <= threads_before,
             what=f"no thread left of those the reader started: {threading.enumerate()}")


def test_fastapi_example_serves_a_real_snapshot(file_root, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient

    first = build_snapshot(file_root, ((k, _value(k)) for k in KEYS), num_dbs=NUM_DBS)
    monkeypatch.setenv("SHARDYFUSION_ROOT", file_root)
    monkeypatch.setenv("SHARDYFUSION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SHARDYFUSION_SHARD_IDS", "0-3")
    spec = importlib.util.spec_from_file_location("fastapi_service", ROOT / "docs" / "examples" / "fastapi_service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mine = [k for k in KEYS if route_key(k, NUM_DBS) < 4]
    other = next(k for k in KEYS if route_key(k, NUM_DBS) >= 4)
    with TestClient(module.app) as client:
        answer = client.get(f"/keys/{mine[0]}")
        assert answer.status_code == 200
        run_id = answer.json()["run_id"]
        assert answer.json() == {"run_id": run_id, "key": str(mine[0]), "found": True, "value": _value(mine[0]).decode()}
        absent = next(k for k in range(10_000, 20_000) if route_key(k, NUM_DBS) < 4)
        assert client.get(f"/keys/{absent}").status_code == 404
        assert client.get(f"/keys/{other}").status_code == 421
        many = client.post("/multi_get", json={"keys": [str(k) for k in mine]})
        assert many.json() == {"run_id": run_id, "values": [_value(k).decode() for k in mine]}
        assert client.post("/refresh").json() == {"run_id": run_id, "refreshed": False}
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {
            "ready": True, "status": "healthy", "run_id": run_id, "last_error": None, "reason": None}
        # Every answer names the run its value came from, also while refreshes swap runs under it.
        second = build_snapshot(file_root, ((k, _value(k + 1000)) for k in KEYS), num_dbs=NUM_DBS)
        runs = {run_id: 0, second.run_id: 1000}
        store = LocalStore(file_root)
        stop = threading.Event()

        def swap_runs() -> None:  # publish the two runs in turn, refreshing after each
            reader = module.app.state.reader.reader
            built = [first, second]
            n = 0
            while not stop.is_set():
                n += 1
                publish_current(store, built[n % 2].manifest_key, built[n % 2].run_id)
                reader.refresh()

        swapper = threading.Thread(target=swap_runs)
        swapper.start()
        try:
            answers = [client.get(f"/keys/{mine[n % len(mine)]}").json() for n in range(400)]
        finally:
            stop.set()
            swapper.join()
        assert {a["run_id"] for a in answers} == set(runs), "both runs answered"
        for n, a in enumerate(answers):
            assert a["value"] == _value(mine[n % len(mine)] + runs[a["run_id"]]).decode(), a
        # _CURRENT names a missing manifest: a failed check, still ready (degraded) within max_staleness_s.
        publish_current(store, layout.manifest_key("r-gone", layout.utc_now()), "r-gone")
        assert client.post("/refresh").json()["refreshed"] is False
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.json()
        assert "names run r-gone" in ready.json()["last_error"] and ready.json()["reason"] is None
        # The reader closed: no snapshot, 503 saying so.
        module.app.state.reader.reader.close()
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["reason"] == "no snapshot is loaded (the reader is closed)"
