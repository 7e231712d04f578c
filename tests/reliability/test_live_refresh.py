"""A live reader's refresh is atomic for reads racing it, and a failed one keeps the old snapshot (SPEC §13).

A reader that ingests refreshes (``ShardedReader(ingest_refreshes=True)``) ingests a delta's layers into the databases it serves,
so the old snapshot's reads go through RocksDB snapshots until the swap. Here reader threads run
``multi_get`` over every key of every shard without pause while the follower refreshes along a
chain of deltas that each rewrite every key: one refresh meets a tampered layer on the store (a
real checksum fault: nothing may be ingested), one fails half-way through its ingestions (injected
by patching ``LiveShards.ingest``: RocksDB's ingestion cannot be made to fail on demand).
Every read must see one snapshot whole, in order; values are compared with the model of each run.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError, ReaderError
from airflow_provider_shardyfusion.core.read import live_shards
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

NUM_DBS = 6


def test_reads_racing_live_refreshes_and_their_failures_see_one_snapshot_whole(file_root, monkeypatch, figure):
    keys = sorted(k for shard_keys in keys_by_shard(NUM_DBS, 4).values() for k in shard_keys)
    build_snapshot(file_root, [(k, b"t0") for k in keys], num_dbs=NUM_DBS, run_id="t0", shard_layout="sst")
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    with ShardedReader(file_root, ingest_refreshes=True) as reader:
        def reader_loop() -> None:
            last = b"t0"
            try:
                while not stop.is_set():
                    values = set(reader.multi_get(keys))
                    assert len(values) == 1, values  # never a mix of two runs
                    (tag,) = values
                    assert tag >= last, (tag, last)  # never back to an older run
                    last = tag
                    reads[0] += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader_loop) for _ in range(2)]
        for t in threads:
            t.start()
        store = open_store(file_root)
        kept = 0
        for step in (1, 2, 3):
            delta = build_delta(file_root, {k: f"t{step}" for k in keys}, run_id=f"t{step}", publish=False)
            publish_current(store, delta.manifest_key, delta.run_id)
            if step == 2:  # a layer altered on the store after publishing: refused before anything is ingested
                layer = delta.manifest.shards[0].layers[-1]
                path = Path(layer.db_url.removeprefix("file://")) / layer.files[0].name
                good = path.read_bytes()
                path.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])
                with pytest.raises(ChecksumMismatchError):
                    reader.refresh()
                kept += reader.run_id == "t1"
                path.write_bytes(good)
            if step == 3:  # an ingestion fails after another shard took its layer
                ingest = live_shards.LiveShards.ingest
                calls: list[int] = []

                def fail_second(self, live, files, shard, run_id, *, reused_layers, calls=calls, ingest=ingest):
                    calls.append(shard.db_id)
                    if len(calls) == 2:
                        live.broken = True  # as a real failure inside LiveShards.ingest leaves it
                        raise ReaderError("injected ingestion failure")
                    ingest(self, live, files, shard, run_id, reused_layers=reused_layers)

                monkeypatch.setattr(live_shards.LiveShards, "ingest", fail_second)
                with pytest.raises(ReaderError, match="injected"):
                    reader.refresh()
                kept += reader.run_id == "t2" and reader.multi_get(keys) == [b"t2"] * len(keys)
                monkeypatch.undo()
            assert reader.refresh() and reader.run_id == f"t{step}"
            assert reader.multi_get(keys) == [f"t{step}".encode()] * len(keys)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert kept == 2 and reads[0] > 0
        assert {k: reader.get(k) for k in keys} == dict.fromkeys(keys, b"t3")
    figure(refreshes=3, failed_refreshes_kept_old=kept, values_checked=reads[0] * len(keys))
