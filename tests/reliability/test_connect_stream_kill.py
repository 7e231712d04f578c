"""Promise (SPEC §14, §15): a stream ingested over Spark Connect whose server is killed mid-batch loses
no batch and applies none twice once the query restarts from its checkpoint on another server.

Real parts: ``StreamingSnapshotOperator`` with a ``spark_connect`` connection (its query runs from a
client child of the task; the micro-batch function runs in the server's own Python), Spark Connect
servers on loopback, and the test-only holds of ``spark_jobs.faults``. One stream, one kill per
batch, each of the whole server's process group with SIGKILL while the batch holds at one point,
then a new server restarts the query from the same checkpoint:
- batch 1, while an executor holds after uploading a shard (``hold_shard_write``): the run is left
  ``running``; the restart marks it failed and writes the batch again (``-r1``);
- batch 2, between the manifest and ``_CURRENT`` (``hold_before_pointer``): the run is recorded
  succeeded, not live; the restart writes the batch again (``-r1``), the killed attempt stays staged;
- batch 3, between ``_CURRENT`` and the checkpoint commit (``hold_after_batch``): the batch is live,
  Spark does not know it; the restart replays the batch id and the writer skips it.
The batches, their model and the follower that checks every snapshot it sees against its batch's
model are those of ``test_stream_kill`` (spark-submit), which kills at the last two points.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil
import pytest

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.stream.batches import batch_run_id
from airflow_provider_shardyfusion.spark_jobs.faults import ENV_VAR
from tests.fault_env import set_faults
from tests.operator_helpers import connections, make_context
from tests.polling import wait_for
from tests.reliability.stream_model import (
    ALL_KEYS,
    BATCHES,
    STREAM,
    Follower,
    add_batch,
    check_final_state,
    stream_runs,
)
from tests.spark_connect_server import connect_server, connect_server_process

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = pytest.mark.spark
TRIES = itertools.count(1)
LAST = max(BATCHES)


def ingest(monkeypatch, tmp_path, port: int) -> dict:
    """One ``available_now`` run of the operator over the Connect server at ``port``, as a task try of its own
    (its report under the root is per try: a try that wrote nothing would show the last try's batches)."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator

    connections(monkeypatch, spark={"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})
    op = StreamingSnapshotOperator(
        task_id="ingest", output_uri=f"file://{tmp_path}/root", source_path=f"file://{tmp_path}/source",
        checkpoint_location=str(tmp_path / "checkpoint"), source_schema="id LONG, payload STRING, deleted BOOLEAN",
        source_options={"maxFilesPerTrigger": 1}, stream_id=STREAM, key_column="id", value_column="payload",
        delete_column="deleted", num_dbs=4, spark_conn_id="sf_spark", aws_conn_id=None)
    context = {**make_context(), "outlet_events": OutletEventAccessors()}
    context["ti"].try_number = next(TRIES)
    return op.execute(context)


@dataclass
class Killed:
    """A task try whose server was killed while its batch held; ``outcome`` gets its result or error."""

    task: threading.Thread
    at: float
    outcome: dict

    def failed(self) -> tuple[float, Exception]:
        """Wait for the try to fail (its client gives up on the dead server): the seconds it took, the error."""
        self.task.join(timeout=120)
        seconds = time.monotonic() - self.at
        assert not self.task.is_alive() and "error" in self.outcome, self.outcome
        error = self.outcome["error"]  # the Connect job's error, one line with its gRPC cause (no spark-submit ran)
        assert type(error).__name__ == "SparkConnectError", repr(error)
        assert "the Spark Connect server stopped answering" in str(error) and "gRPC UNAVAILABLE" in str(error)
        assert "_MultiThreadedRendezvous" not in str(error) and "the next run resumes from the checkpoint" in str(error)
        return seconds, error


def kill_when_held(monkeypatch, tmp_path: Path, port: int, server: subprocess.Popen, batch_id: int,
                   hold: str, **target: int) -> Killed:
    """Add ``batch_id``, run a try that holds it at ``hold``, kill the server's process group there."""
    marker = tmp_path / f"{hold}.pid"
    add_batch(tmp_path, batch_id)
    set_faults(monkeypatch, {hold: {**target, "marker": str(marker), "seconds": 120}})
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = ingest(monkeypatch, tmp_path, port)
        except BaseException as exc:
            outcome["error"] = exc

    task = threading.Thread(target=run, daemon=True)
    task.start()
    wait_for(lambda: marker.exists() or not task.is_alive(), 180, f"batch {batch_id} to hold at {hold}")
    assert marker.exists(), outcome
    holder = psutil.Process(int(marker.read_text()))
    os.killpg(server.pid, signal.SIGKILL)
    at = time.monotonic()
    # The held process must be gone: one that outlived its server would go on after its hold and publish.
    _, alive = psutil.wait_procs([holder], timeout=30)
    assert not alive, f"the process held at {hold} (pid {holder.pid}) survived the kill of its server"
    monkeypatch.delenv(ENV_VAR)  # the next try (the restart) runs without the hold
    return Killed(task, at, outcome)


def test_connect_server_killed_at_three_points_then_restarted_from_the_checkpoint(monkeypatch, tmp_path, figure):
    (tmp_path / "source").mkdir()
    root = f"file://{tmp_path}/root"
    snapshots = SnapshotRoot(open_store(root))
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    seconds: list[float] = []
    run = {(b, r): batch_run_id(STREAM, b, r) for b in BATCHES for r in (0, 1)}

    with connect_server_process(tmp_path / "a") as (port, server):
        add_batch(tmp_path, 0)
        assert [b["action"] for b in ingest(monkeypatch, tmp_path, port)["batches"]] == ["written"]
        follower = Follower(root)
        # (1) batch 1 killed while shard 1 is written on the server.
        killed = kill_when_held(monkeypatch, tmp_path, port, server, 1, "hold_shard_write", db_id=1, attempt=0)

    with connect_server_process(tmp_path / "b") as (port, server):  # started while the dead server's client gives up
        took, error = killed.failed()
        seconds.append(took)
        assert "batches published before: []" in str(error)
        assert stream_runs(root) == {run[0, 0]: "succeeded", run[1, 0]: "running"}
        assert snapshots.current().run_id == run[0, 0]
        # The restart replays batch 1: the dead attempt is failed, a new one published.
        replay = ingest(monkeypatch, tmp_path, port)["batches"]
        assert [(b["batch_id"], b["action"], b["run_id"]) for b in replay] == [(1, "written", run[1, 1])]
        assert stream_runs(root)[run[1, 0]] == "failed" and snapshots.current().run_id == run[1, 1]
        # (2) batch 2 killed between its manifest and _CURRENT.
        killed = kill_when_held(monkeypatch, tmp_path, port, server, 2, "hold_before_pointer")

    with connect_server_process(tmp_path / "c") as (port, server):
        took, error = killed.failed()
        seconds.append(took)
        assert "batches published before: []" in str(error)
        record = snapshots.read_run(run[2, 0])  # written and recorded succeeded, never live
        assert record.status == "succeeded" and record.published_at is None and record.manifest_ref
        assert snapshots.current().run_id == run[1, 1]
        # The restart replays batch 2 and writes it again; the killed attempt stays staged.
        replay = ingest(monkeypatch, tmp_path, port)["batches"]
        assert [(b["batch_id"], b["action"], b["run_id"]) for b in replay] == [(2, "written", run[2, 1])]
        assert snapshots.current().run_id == run[2, 1] and snapshots.read_run(run[2, 0]).published_at is None
        # (3) batch 3 killed once live, before Spark commits it to the checkpoint.
        killed = kill_when_held(monkeypatch, tmp_path, port, server, 3, "hold_after_batch")

    with connect_server(tmp_path / "d") as port:
        took, error = killed.failed()
        seconds.append(took)
        # Batch 3 is live, but the try's report was to be written after the batch returned: the error
        # cannot name it; the run record and _CURRENT do.
        record = snapshots.read_run(run[3, 0])
        assert record.status == "succeeded" and record.published_at is not None
        assert snapshots.current().run_id == run[3, 0]
        # The restart replays batch 3's id; the writer skips it (already live).
        replay = ingest(monkeypatch, tmp_path, port)["batches"]
        assert [(b["batch_id"], b["action"], b["run_id"]) for b in replay] == [(3, "skipped", run[3, 0])]
        assert ingest(monkeypatch, tmp_path, port)["batches"] == []  # nothing new: nothing written

    # Every batch id live once, by one succeeded run each; the attempt killed mid-write failed, the one
    # killed before _CURRENT staged; _CURRENT never named either; the final state exact.
    runs = stream_runs(root)
    assert runs == {run[0, 0]: "succeeded", run[1, 0]: "failed", run[1, 1]: "succeeded", run[2, 0]: "succeeded",
                    run[2, 1]: "succeeded", run[3, 0]: "succeeded"}
    assert sorted(r for r in runs if snapshots.read_run(r).published_at is None) == [run[1, 0], run[2, 0]]
    seen = check_final_state(root, follower, LAST)
    figure(servers_killed=len(seconds), batches=len(BATCHES),
           seconds_to_failed_task="/".join(f"{s:.1f}" for s in seconds), runs=len(runs),
           snapshots_seen_by_follower=len(seen), keys_checked=len(ALL_KEYS) * (len(seen) + 1))
