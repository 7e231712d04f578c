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
class Try:
    """A task try running in a thread (``outcome``: its result or its error)."""

    task: threading.Thread
    outcome: dict
    killed_at: float = 0.0

    @classmethod
    def start(cls, monkeypatch, tmp_path: Path, port: int) -> Try:
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = ingest(monkeypatch, tmp_path, port)
            except BaseException as exc:
                outcome["error"] = exc

        task = threading.Thread(target=run, daemon=True)
        task.start()
        return cls(task, outcome)

    def batches(self) -> list[tuple]:
        """The batches of a try that succeeded: (batch id, action, run id)."""
        self.task.join(timeout=240)
        assert "result" in self.outcome, self.outcome
        return [(b["batch_id"], b["action"], b["run_id"]) for b in self.outcome["result"]["batches"]]

    def failed(self) -> tuple[float, str]:
        """Wait for the try to fail (its client gives up on the dead server): the seconds since the kill, the error."""
        self.task.join(timeout=120)
        seconds = time.monotonic() - self.killed_at
        assert not self.task.is_alive() and "error" in self.outcome, self.outcome
        error = self.outcome["error"]  # the Connect job's error, one line with its gRPC cause (no spark-submit ran)
        assert type(error).__name__ == "SparkConnectError", repr(error)
        assert "the Spark Connect server stopped answering" in str(error) and "gRPC UNAVAILABLE" in str(error)
        assert "_MultiThreadedRendezvous" not in str(error) and "the next run resumes from the checkpoint" in str(error)
        return seconds, str(error)


def held_try(monkeypatch, tmp_path: Path, port: int, hold: str, at_run: str, *, let_through: str | None = None,
             **target: int) -> tuple[Try, Path]:
    """A try whose batch run ``at_run`` holds at ``hold`` (its marker returned); the replayed run
    ``let_through`` passes the same hold at once (its release file exists)."""
    if let_through is not None:
        (tmp_path / f"release-{let_through}").touch()
    set_faults(monkeypatch, {hold: {**target, "marker": str(tmp_path / "held-{run_id}.pid"), "seconds": 120,
                                    "release": str(tmp_path / "release-{run_id}")}})
    return Try.start(monkeypatch, tmp_path, port), tmp_path / f"held-{at_run}.pid"


def kill_when_held(monkeypatch, attempt: Try, marker: Path, server: subprocess.Popen) -> None:
    """Kill the server's whole process group once the try holds (its marker exists)."""
    wait_for(lambda: marker.exists() or not attempt.task.is_alive(), 240, f"the try to hold ({marker.name})")
    assert marker.exists(), attempt.outcome
    holder = psutil.Process(int(marker.read_text()))
    os.killpg(server.pid, signal.SIGKILL)
    attempt.killed_at = time.monotonic()
    # The held process must be gone: one that outlived its server would go on after its hold and publish.
    _, alive = psutil.wait_procs([holder], timeout=30)
    assert not alive, f"the process held at {marker.name} (pid {holder.pid}) survived the kill of its server"
    monkeypatch.delenv(ENV_VAR)  # the next try (the restart) runs without the hold


def test_connect_server_killed_at_three_points_then_restarted_from_the_checkpoint(monkeypatch, tmp_path, figure):
    (tmp_path / "source").mkdir()
    root = f"file://{tmp_path}/root"
    snapshots = SnapshotRoot(open_store(root))
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    seconds: list[float] = []
    run = {(b, r): batch_run_id(STREAM, b, r) for b in BATCHES for r in (0, 1)}

    # Each restart's try replays the killed batch from the checkpoint, then takes the next batch,
    # which is held and killed in turn. It starts while the dead server's client still gives up
    # (that client only writes its own try's report), and each new server meanwhile.
    with connect_server_process(tmp_path / "a") as (port, server):
        add_batch(tmp_path, 0)
        assert Try.start(monkeypatch, tmp_path, port).batches() == [(0, "written", run[0, 0])]
        follower = Follower(root)
        # (1) batch 1 killed while shard 1 is written on the server.
        add_batch(tmp_path, 1)
        try1, held = held_try(monkeypatch, tmp_path, port, "hold_shard_write", run[1, 0], db_id=1, attempt=0)
        kill_when_held(monkeypatch, try1, held, server)

    with connect_server_process(tmp_path / "b") as (port, server):
        assert stream_runs(root) == {run[0, 0]: "succeeded", run[1, 0]: "running"}
        assert snapshots.current().run_id == run[0, 0]
        # (2) the restart fails batch 1's dead attempt and rewrites it (-r1); batch 2 is killed
        # between its manifest and _CURRENT.
        add_batch(tmp_path, 2)
        try2, held = held_try(monkeypatch, tmp_path, port, "hold_before_pointer", run[2, 0], let_through=run[1, 1])
        took, error = try1.failed()
        seconds.append(took)
        assert "batches published before: []" in error
        kill_when_held(monkeypatch, try2, held, server)
        assert stream_runs(root)[run[1, 0]] == "failed" and snapshots.current().run_id == run[1, 1]

    with connect_server_process(tmp_path / "c") as (port, server):
        record = snapshots.read_run(run[2, 0])  # written and recorded succeeded, never live
        assert record.status == "succeeded" and record.published_at is None and record.manifest_ref
        assert snapshots.current().run_id == run[1, 1]
        # (3) the restart writes batch 2 again (-r1; the killed attempt stays staged); batch 3 is
        # killed once live, before Spark commits it to the checkpoint.
        add_batch(tmp_path, 3)
        try3, held = held_try(monkeypatch, tmp_path, port, "hold_after_batch", run[3, 0], let_through=run[2, 1])
        took, error = try2.failed()
        seconds.append(took)
        assert "batches published before: [1]" in error  # the restart's replay, once
        kill_when_held(monkeypatch, try3, held, server)
        assert snapshots.current().run_id == run[3, 0] and snapshots.read_run(run[2, 0]).published_at is None

    with connect_server(tmp_path / "d") as port:
        # The restart replays batch 3's id; the writer skips it (already live).
        try4 = Try.start(monkeypatch, tmp_path, port)
        took, error = try3.failed()
        seconds.append(took)
        # Batch 3 is live but the try's report was due after the batch returned: the report names the
        # replayed batch 2 only, and the error adds what _CURRENT names, batch 3's run.
        assert f"batches published before: [2]; _CURRENT names run {run[3, 0]!r}" in error
        record = snapshots.read_run(run[3, 0])
        assert record.status == "succeeded" and record.published_at is not None
        assert try4.batches() == [(3, "skipped", run[3, 0])]
        assert Try.start(monkeypatch, tmp_path, port).batches() == []  # nothing new: nothing written

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
