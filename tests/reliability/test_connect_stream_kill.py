"""Promise (SPEC §14, §15): a stream ingested over Spark Connect whose server is killed mid-batch loses
no batch and applies none twice once the query restarts from its checkpoint on another server.

Real parts: ``StreamingSnapshotOperator`` with a ``spark_connect`` connection (its query runs from a
client child of the task; the micro-batch function runs in the server's own Python), a Spark
Connect server on loopback whose whole process group is killed with SIGKILL while an executor of
batch 1 holds after uploading a shard (test-only fault ``hold_shard_write``), and a second server
for the restart from the same checkpoint. The batches, their model and the follower that checks
every snapshot it sees against its batch's model are those of ``test_stream_kill`` (spark-submit).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest

from airflow_provider_shardyfusion.core.stream.batches import batch_run_id
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

pytestmark = pytest.mark.spark
TRIES = itertools.count(1)


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


def test_connect_server_killed_mid_batch_then_restarted_from_the_checkpoint(monkeypatch, tmp_path, figure):
    (tmp_path / "source").mkdir()
    root = f"file://{tmp_path}/root"
    marker = tmp_path / "held.pid"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with connect_server_process(tmp_path / "a") as (port, server):
        add_batch(tmp_path, 0)
        assert [b["action"] for b in ingest(monkeypatch, tmp_path, port)["batches"]] == ["written"]
        follower = Follower(root)
        add_batch(tmp_path, 1)
        set_faults(monkeypatch, {"hold_shard_write": {"db_id": 1, "attempt": 0, "marker": str(marker), "seconds": 120}})
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = ingest(monkeypatch, tmp_path, port)
            except BaseException as exc:
                outcome["error"] = exc

        task = threading.Thread(target=run, daemon=True)
        task.start()
        wait_for(lambda: marker.exists() or not task.is_alive(), 180, "batch 1 to hold in a shard write on the server")
        assert marker.exists(), outcome
        os.killpg(server.pid, signal.SIGKILL)
        killed = time.monotonic()
    monkeypatch.delenv("SHARDYFUSION_TEST_FAULTS")
    with connect_server(tmp_path / "b") as port_b:  # started while the dead server's client gives up
        task.join(timeout=120)
        seconds = time.monotonic() - killed
        assert not task.is_alive() and "error" in outcome, outcome
        error = outcome["error"]  # the Connect job's error, one line with its gRPC cause (no spark-submit ran)
        assert type(error).__name__ == "SparkConnectError", repr(error)
        assert "the Spark Connect server stopped answering" in str(error) and "gRPC UNAVAILABLE" in str(error)
        assert "_MultiThreadedRendezvous" not in str(error) and "batches published before: []" in str(error)
        dead = batch_run_id(STREAM, 1)
        assert stream_runs(root) == {batch_run_id(STREAM, 0): "succeeded", dead: "running"}

        # The restart from the checkpoint replays batch 1: the dead attempt is failed, a new one published.
        replay = ingest(monkeypatch, tmp_path, port_b)["batches"]
        rewrite = batch_run_id(STREAM, 1, 1)
        assert [(b["batch_id"], b["action"], b["run_id"]) for b in replay] == [(1, "written", rewrite)]
        add_batch(tmp_path, 2)
        after = ingest(monkeypatch, tmp_path, port_b)["batches"]
        assert [(b["batch_id"], b["action"]) for b in after] == [(2, "written")]
        assert ingest(monkeypatch, tmp_path, port_b)["batches"] == []  # nothing new: nothing written

    # Every batch live once, by one succeeded run each; the killed attempt failed; the final state exact.
    runs = stream_runs(root)
    assert runs == {batch_run_id(STREAM, 0): "succeeded", dead: "failed", rewrite: "succeeded",
                    batch_run_id(STREAM, 2): "succeeded"}
    seen = check_final_state(root, follower)
    figure(servers_killed=1, batches=len(BATCHES), seconds_to_failed_task=f"{seconds:.1f}", runs=len(runs),
           snapshots_seen_by_follower=len(seen), keys_checked=len(ALL_KEYS) * (len(seen) + 1))
