"""Promise (SPEC §14): a streaming query killed with ``kill -9`` at the two points that matter ends,
after a restart, in exactly the state of every batch applied once, in order.

Each micro-batch is one file of upserts and deletions; the query (``availableNow``, one file per
batch) runs in its own process (``stream_runner``) and is held by a test-only fault, then its
Python driver is killed (its JVM follows):
- (a) between the manifest and ``_CURRENT``: the batch's run is written and recorded succeeded, not
  live, and the checkpoint has not committed the batch. The restart replays the batch id; the
  writer publishes the written run instead of writing it again;
- (b) between ``_CURRENT`` and the checkpoint commit: the batch is live, Spark does not know it. The
  restart replays the batch id; the writer skips it.
Throughout, a reader following with ``refresh()`` sees batch ids only increase and every snapshot
it sees equals the model of its batch id (never a torn state), and ``_CURRENT`` only ever names
succeeded runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.stream.batches import parse_batch_run_id
from tests.fault_env import fault_env
from tests.polling import wait_for

pytestmark = pytest.mark.spark
ROOT_DIR = Path(__file__).resolve().parents[2]
STREAM = "kill.stream"
# batch id -> (upserts, deletes); batch 0 is the full snapshot
BATCHES = {
    0: ({k: f"b0-{k}" for k in range(300)}, []),
    1: ({k: f"b1-{k}" for k in range(50)}, list(range(100, 120))),
    2: ({**{k: f"b2-{k}" for k in range(300, 350)}, **{k: f"b2-{k}" for k in range(100, 105)}}, list(range(10))),
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


def start(tmp_path: Path, faults: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT_DIR))
    env.pop("SHARDYFUSION_TEST_FAULTS", None)
    if faults:
        env.update(fault_env(faults))
    log = open(tmp_path / f"runner-{len(list(tmp_path.glob('runner-*')))}.log", "wb")  # noqa: SIM115 - kept for the process
    return subprocess.Popen([sys.executable, "-m", "tests.reliability.stream_runner", f"file://{tmp_path}/root",
                             str(tmp_path / "source"), str(tmp_path / "checkpoint"), STREAM],
                            cwd=ROOT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)


def add_batch(tmp_path: Path, batch_id: int) -> None:
    upserts, deletes = BATCHES[batch_id]
    keys = [*upserts, *deletes]
    table = pa.table({"id": pa.array(keys, pa.int64()), "payload": [upserts.get(k) for k in keys],
                      "deleted": [k in deletes for k in keys]})
    staged = tmp_path / f"staged-{batch_id}.parquet"
    pq.write_table(table, staged)
    os.replace(staged, tmp_path / "source" / f"part-{batch_id:05d}.parquet")  # appears whole


def run_to_end(tmp_path: Path) -> list[dict]:
    proc = start(tmp_path)
    assert proc.wait(timeout=240) == 0, logs(tmp_path)
    line = [ln for ln in logs(tmp_path).splitlines() if ln.startswith('{"outcomes"')][-1]
    return json.loads(line)["outcomes"]


def logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("runner-*.log")))


def kill_when_held(tmp_path: Path, hold: str) -> str:
    marker = tmp_path / f"{hold}.pid"
    proc = start(tmp_path, {hold: {"marker": str(marker), "seconds": 120}})
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, 180, f"the stream to reach {hold}")
        assert proc.poll() is None, logs(tmp_path)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        os.kill(int(marker.read_text()), signal.SIGKILL)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [p.pid for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
    return hold


def stream_runs(root: str) -> dict[str, str]:
    snapshots = SnapshotRoot(open_store(root))
    return {run_id: record.status for run_id, record, _ in snapshots.iter_runs()
            if record is not None and parse_batch_run_id(STREAM, run_id) is not None}


def check_final_state(root: str, follower: Follower) -> list[int]:
    """Once the follower saw the last batch: the batch ids it saw only increased, from 0 to the last,
    and the root holds exactly the last batch's model. Returns the batch ids seen."""
    last = max(BATCHES)
    wait_for(lambda: follower.seen[-1] == last, 30, f"the follower to reach batch {last}")
    seen = follower.stop()
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == last
    with ShardedReader(root) as reader:
        final = models()[last]
        assert reader.multi_get(ALL_KEYS) == [final.get(k) for k in ALL_KEYS]
        assert reader.manifest.writer["batch_id"] == last
    return seen


def test_kill_between_manifest_and_pointer_and_between_pointer_and_checkpoint(tmp_path, figure):
    (tmp_path / "source").mkdir()
    root = f"file://{tmp_path}/root"
    snapshots = SnapshotRoot(open_store(root))
    add_batch(tmp_path, 0)
    assert [o["action"] for o in run_to_end(tmp_path)] == ["written"]
    follower = Follower(root)

    # (a) batch 1 written and recorded succeeded, the driver killed before _CURRENT moves.
    add_batch(tmp_path, 1)
    kill_when_held(tmp_path, "hold_before_pointer")
    run1 = f"{STREAM}-b{1:012d}"
    assert snapshots.current().run_id == f"{STREAM}-b{0:012d}"
    record = snapshots.read_run(run1)
    assert record.status == "succeeded" and record.published_at is None and record.manifest_ref
    outcomes = run_to_end(tmp_path)
    assert [(o["batch_id"], o["action"], o["run_id"]) for o in outcomes] == [(1, "written", f"{run1}-r1")]
    assert snapshots.current().run_id == f"{run1}-r1"
    assert snapshots.read_run(run1).published_at is None  # the killed attempt stays staged

    # (b) batch 2 live, the driver killed before Spark commits it to the checkpoint.
    add_batch(tmp_path, 2)
    kill_when_held(tmp_path, "hold_after_batch")
    run2 = f"{STREAM}-b{2:012d}"
    assert snapshots.current().run_id == run2
    outcomes = run_to_end(tmp_path)
    assert [(o["batch_id"], o["action"], o["run_id"]) for o in outcomes] == [(2, "skipped", run2)]
    assert run_to_end(tmp_path) == []  # nothing new: nothing written

    # Every batch id live exactly once, by one run each; nothing failed; the final state exact.
    assert stream_runs(root) == {f"{STREAM}-b{i:012d}": "succeeded" for i in BATCHES} | {f"{run1}-r1": "succeeded"}
    assert [r for r in stream_runs(root) if snapshots.read_run(r).published_at is None] == [run1]
    seen = check_final_state(root, follower)
    figure(kills=2, batches=len(BATCHES), runs=len(stream_runs(root)), snapshots_seen_by_follower=len(seen),
           keys_checked=len(ALL_KEYS) * (len(seen) + 1))
