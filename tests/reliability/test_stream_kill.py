"""Promise (SPEC §14): a streaming query killed with ``kill -9`` at the two points that matter ends,
after a restart, in exactly the state of every batch applied once, in order.

Each micro-batch is one file of upserts and deletions; the query (``availableNow``, one file per
batch) runs in its own process (``stream_runner``) and is held by a test-only fault, then its
Python driver is killed (its JVM follows):
- (a) between the manifest and ``_CURRENT``: the batch's run is written and recorded succeeded, not
  live, and the checkpoint has not committed the batch. The restart replays the batch id; the
  writer writes the batch again as a new attempt (the staged one is left for cleanup);
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
from pathlib import Path

import psutil
import pytest

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from tests.fault_env import fault_env
from tests.polling import wait_for
from tests.reliability.stream_model import ALL_KEYS, STREAM, Follower, add_batch, check_final_state, stream_runs

pytestmark = pytest.mark.spark
ROOT_DIR = Path(__file__).resolve().parents[2]
LAST = 2  # batches 0-2 of the model (the Connect twin goes on to batch 3)


def start(tmp_path: Path, faults: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT_DIR))
    env.pop("SHARDYFUSION_TEST_FAULTS", None)
    if faults:
        env.update(fault_env(faults))
    log = open(tmp_path / f"runner-{len(list(tmp_path.glob('runner-*')))}.log", "wb")  # noqa: SIM115 - kept for the process
    return subprocess.Popen([sys.executable, "-m", "tests.reliability.stream_runner", f"file://{tmp_path}/root",
                             str(tmp_path / "source"), str(tmp_path / "checkpoint"), STREAM],
                            cwd=ROOT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)


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
    assert stream_runs(root) == {f"{STREAM}-b{i:012d}": "succeeded" for i in range(LAST + 1)} | {f"{run1}-r1": "succeeded"}
    assert [r for r in stream_runs(root) if snapshots.read_run(r).published_at is None] == [run1]
    seen = check_final_state(root, follower, LAST)
    figure(kills=2, batches=LAST + 1, runs=len(stream_runs(root)), snapshots_seen_by_follower=len(seen),
           keys_checked=len(ALL_KEYS) * (len(seen) + 1))
