"""The stream both kill tests drive (spark-submit and Spark Connect): its batches, their models,
and a follower that checks every snapshot it sees against the model of its batch id.

The spark-submit test drives batches 0-2; the Connect test kills one point per batch and needs
batch 3 as well. Batch 3 touches only keys of the earlier batches, so ``ALL_KEYS`` is the same
for both."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.stream.batches import parse_batch_run_id
from tests.polling import wait_for

if TYPE_CHECKING:
    from pathlib import Path

STREAM = "kill.stream"
# batch id -> (upserts, deletes); batch 0 is the full snapshot
BATCHES = {
    0: ({k: f"b0-{k}" for k in range(300)}, []),
    1: ({k: f"b1-{k}" for k in range(50)}, list(range(100, 120))),
    2: ({**{k: f"b2-{k}" for k in range(300, 350)}, **{k: f"b2-{k}" for k in range(100, 105)}}, list(range(10))),
    # re-inserts keys deleted by batches 1 and 2, updates some, deletes some of batch 2's
    3: ({**{k: f"b3-{k}" for k in range(110, 130)}, **{k: f"b3-{k}" for k in range(5)}}, [*range(300, 310), 200]),
}


def models() -> dict[int, dict[int, bytes]]:
    out, model = {}, {}
    for batch_id, (upserts, deletes) in BATCHES.items():
        model = {**model, **{k: v.encode() for k, v in upserts.items()}}
        for k in deletes:
            model.pop(k, None)
        out[batch_id] = dict(model)
    return out


ALL_KEYS = sorted({k for upserts, deletes in BATCHES.values() for k in [*upserts, *deletes]})


class Follower:
    """A reader refreshing in a thread: the batch ids it saw, each snapshot checked against its model."""

    def __init__(self, root: str):
        self.reader = ShardedReader(root)
        self.models = models()
        self.seen: list[int] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._check()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _check(self) -> None:
        batch_id = int(self.reader.manifest.writer["batch_id"])
        self.seen.append(batch_id)
        got = dict(zip(ALL_KEYS, self.reader.multi_get(ALL_KEYS), strict=True))
        want = {k: self.models[batch_id].get(k) for k in ALL_KEYS}
        if got != want:
            self.problems.append(f"batch {batch_id}: {sum(got[k] != want[k] for k in ALL_KEYS)} keys differ")

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                if self.reader.refresh():
                    self._check()
            except Exception as exc:  # any failure is a finding, reported at the end
                self.problems.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.reader.close()
        assert not self.problems, self.problems
        return self.seen


def add_batch(tmp_path: Path, batch_id: int) -> None:
    upserts, deletes = BATCHES[batch_id]
    keys = [*upserts, *deletes]
    table = pa.table({"id": pa.array(keys, pa.int64()), "payload": [upserts.get(k) for k in keys],
                      "deleted": [k in deletes for k in keys]})
    staged = tmp_path / f"staged-{batch_id}.parquet"
    pq.write_table(table, staged)
    os.replace(staged, tmp_path / "source" / f"part-{batch_id:05d}.parquet")  # appears whole


def stream_runs(root: str) -> dict[str, str]:
    snapshots = SnapshotRoot(open_store(root))
    return {run_id: record.status for run_id, record, _ in snapshots.iter_runs()
            if record is not None and parse_batch_run_id(STREAM, run_id) is not None}


def check_final_state(root: str, follower: Follower, last: int) -> list[int]:
    """Once the follower saw batch ``last``: the batch ids it saw only increased, from 0 to ``last``,
    and the root holds exactly that batch's model. Returns the batch ids seen."""
    wait_for(lambda: follower.seen[-1] == last, 30, f"the follower to reach batch {last}")
    seen = follower.stop()
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == last
    with ShardedReader(root) as reader:
        final = models()[last]
        assert final != models()[last - 1]  # the last batch changed something the check can see
        assert reader.multi_get(ALL_KEYS) == [final.get(k) for k in ALL_KEYS]
        assert reader.manifest.writer["batch_id"] == last
    return seen
