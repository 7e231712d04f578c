"""Promise: stopping a write (``on_kill``) leaves its driver dead and its run never live.

The real kill path: ``ShardedWriteOperator.execute`` runs spark-submit (local mode); the driver is
held just before publishing (test-only fault); ``on_kill`` kills spark-submit and marks the run
``failed`` (RunKilled). The Python driver notices it lost its parent and exits, and even a driver
that lived on could not publish: its run record is no longer its own ``running`` one.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from types import SimpleNamespace

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from tests.fault_env import set_faults
from tests.reliability.job_harness import wait_for

pytestmark = pytest.mark.spark
HOLD_S = 40


class FakeTI:
    dag_id, task_id, run_id, try_number, map_index = "kill_it", "write", "manual__kill", 1, -1

    def xcom_push(self, key, value):
        pass


def test_on_kill_leaves_the_driver_dead_and_the_run_never_live(tmp_path, monkeypatch, figure):
    marker = tmp_path / "driver.pid"
    hold = {"hold_before_publish": {"seconds": HOLD_S, "marker": str(marker)}}
    set_faults(monkeypatch, hold)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    (tmp_path / "input").mkdir()
    keys = list(range(2000))
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64()), "v": [b"x%d" % k for k in keys]}),
                   tmp_path / "input" / "part-0.parquet")
    root = f"file://{tmp_path}/snap"
    run_id = layout.new_run_id()
    op = ShardedWriteOperator(task_id="write", output_uri=root, input_path=f"file://{tmp_path}/input", key_column="id",
                              value_column="v", num_dbs=4, run_id=run_id, aws_conn_id=None,
                              spark_conf={"spark.ui.enabled": "false"})
    outcome: dict[str, BaseException | None] = {}

    def run():
        try:
            op.execute({"ti": FakeTI(), "outlet_events": defaultdict(lambda: SimpleNamespace(extra=None))})
            outcome["error"] = None
        except BaseException as exc:  # the killed write must fail the task
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    wait_for(lambda: marker.exists() and marker.read_text(), 240, "the driver to reach the publish hold")
    driver_pid = int(marker.read_text())
    assert psutil.pid_exists(driver_pid)

    op.on_kill()
    wait_for(lambda: not psutil.pid_exists(driver_pid) or psutil.Process(driver_pid).status() == psutil.STATUS_ZOMBIE,
             20, f"driver pid {driver_pid} to exit after spark-submit was killed")
    worker.join(timeout=60)
    assert "error" in outcome and outcome["error"] is not None

    snapshots = SnapshotRoot(open_store(root))
    record = snapshots.read_run(run_id)
    assert record.status == "failed" and record.error.type == "RunKilled"
    assert snapshots.current() is None
    assert snapshots.find_manifest(run_id) is None  # it died before writing one
    figure(processes_killed=1, driver_exited=1, pointer_moves=0)
