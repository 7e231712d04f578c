"""RunRecordSensor / CurrentSnapshotSensor logic on the local store, without a scheduler."""

from __future__ import annotations

import subprocess
import sys

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    ManifestValidationError,
    RunFailedError,
    RunRecordError,
    ShardCoverageError,
)
from airflow_provider_shardyfusion.core.layout import split_run_record_ref
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunError
from airflow_provider_shardyfusion.sensors.current import CurrentSnapshotSensor
from airflow_provider_shardyfusion.sensors.run_record import RunRecordSensor
from airflow_provider_shardyfusion.triggers.current import CurrentSnapshotTrigger
from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger
from tests.snapshot_helpers import publish_snapshot, store_for, write_run_record


def test_importing_sensors_and_triggers_stays_light():
    code = (
        "import sys\n"
        "import airflow_provider_shardyfusion.sensors.run_record, airflow_provider_shardyfusion.sensors.current\n"
        "import airflow_provider_shardyfusion.triggers.run_record, airflow_provider_shardyfusion.triggers.current\n"
        "heavy = [m for m in ('pyspark', 'rocksdict', 'boto3', 'botocore', 'aiobotocore') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- RunRecordSensor -----------------------------------------------------------------------


def test_run_record_sensor_returns_the_record(file_root):
    pointer = publish_snapshot(store_for(file_root))
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id=pointer.run_id, deferrable=False)
    result = sensor.execute({})
    assert result["run_id"] == pointer.run_id
    assert result["manifest_ref"] == pointer.manifest_ref


def test_run_record_sensor_accepts_run_record_ref(file_root):
    pointer = publish_snapshot(store_for(file_root))
    ref = f"{file_root}/{layout.run_record_key(pointer.run_id)}"
    assert split_run_record_ref(ref) == (file_root, pointer.run_id)
    sensor = RunRecordSensor(task_id="s", run_record_ref=ref, deferrable=True)
    assert sensor.execute({})["status"] == "succeeded"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({}, "give run_record_ref, or both run_id and output_uri"),
    ({"run_id": "r1"}, "give run_record_ref"),
    ({"run_record_ref": "file:///x/runs/r1.json"}, "run_record_ref 'file:///x/runs/r1.json' is invalid"),
    ({"run_record_ref": "file:///x/runs/run_id=r1/run.json", "run_id": "r2"}, "disagrees"),
    ({"run_id": "a/b", "output_uri": "file:///x"}, "run_id 'a/b' is invalid"),
])
def test_run_record_sensor_validates_in_execute(kwargs, match):
    sensor = RunRecordSensor(task_id="bad", deferrable=False, **kwargs)  # no error at parse time
    with pytest.raises(ConfigError, match=match) as info:
        sensor.execute({})
    assert "RunRecordSensor 'bad'" in str(info.value)


def test_run_record_sensor_fails_with_writer_error(file_root):
    store = store_for(file_root)
    write_run_record(store, "r1", FAILED, error=RunError(type="ShardCoverageError", message="db 9 outside [0, 4)"))
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id="r1", deferrable=False)
    # The writer's own class and message (as ShardedWriteOperator raises them); the run is on the error.
    with pytest.raises(ShardCoverageError, match=r"^db 9 outside \[0, 4\)$") as info:
        sensor.execute({})
    assert isinstance(info.value, RunRecordError) and isinstance(info.value, RunFailedError)
    assert (info.value.error_type, info.value.reason, info.value.run_id) == ("ShardCoverageError", "failed", "r1")


def test_run_record_sensor_writer_lost(file_root):
    write_run_record(store_for(file_root), "r1", RUNNING, lease_seconds=-1)
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id="r1", deferrable=True)
    with pytest.raises(RunRecordError, match="writer lost"):
        sensor.execute({})


def test_run_record_sensor_defers_with_its_arguments(file_root):
    write_run_record(store_for(file_root), "r1", RUNNING)
    sensor = RunRecordSensor(task_id="s", output_uri=file_root + "/", run_id="r1", aws_conn_id="my_aws",
                             deferrable=True, poll_interval=7, missing_timeout=30, timeout=120)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})
    deferred = info.value
    assert deferred.method_name == "execute_complete"
    assert deferred.timeout.total_seconds() == 120
    assert isinstance(deferred.trigger, RunRecordTrigger)
    assert deferred.trigger.serialize()[1] == {
        "output_uri": file_root, "run_id": "r1", "aws_conn_id": "my_aws", "poll_interval": 7,
        "missing_timeout": 30, "max_consecutive_failures": 5, "max_backoff": 300.0,
        "fail_run_on_kill": False,  # the sensor watches a run it does not own
    }


def test_run_record_sensor_execute_complete(file_root):
    sensor = RunRecordSensor(task_id="s", output_uri="file:///x", run_id="r1")
    record = write_run_record(store_for(file_root), "r1", SUCCEEDED, manifest_ref="m").to_dict()
    assert sensor.execute_complete({}, {"status": "success", "run_record": record}) == record
    with pytest.raises(RunRecordError, match="run 'r1' failed: ShardWriteError: boom") as info:
        sensor.execute_complete({}, {"status": "error", "message": "run 'r1' failed: ShardWriteError: boom",
                                     "error_type": "ShardWriteError", "reason": "failed", "run_id": "r1"})
    assert info.value.error_type == "ShardWriteError"
    assert info.value.reason == "failed"


def test_run_record_sensor_pokes_again_after_a_storage_error(file_root):
    from airflow_provider_shardyfusion.core.errors import StorageError

    pointer = publish_snapshot(store_for(file_root))
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id=pointer.run_id, deferrable=False)
    real = sensor.hook.get_snapshots(file_root)
    failures = [StorageError("GET runs/run.json: 503 SlowDown")]

    class Flaky:
        def __getattr__(self, name):
            return getattr(real, name)

        def read_run(self, run_id):
            if failures:
                raise failures.pop()
            return real.read_run(run_id)

    sensor.hook.get_snapshots = lambda root: Flaky()
    assert sensor.poke({}) is False  # like the operator and the trigger: read again, do not fail
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["run_id"] == pointer.run_id


def test_run_record_sensor_missing_timeout_in_poke_mode(file_root):
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id="r1", deferrable=False, missing_timeout=0,
                             poll_interval=0.01)
    with pytest.raises(RunRecordError, match="does not exist"):
        sensor.execute({})


# ---- CurrentSnapshotSensor -----------------------------------------------------------------


def test_current_sensor_exists_returns_the_pointer(file_root):
    pointer = publish_snapshot(store_for(file_root))
    sensor = CurrentSnapshotSensor(task_id="c", output_uri=file_root, deferrable=True)
    assert sensor.execute({}) == pointer.to_dict()
    assert sensor.mode == "poke"  # BaseSensorOperator's own mode is untouched


def test_current_sensor_changed_records_baseline_and_passes_it_to_the_trigger(file_root):
    old = publish_snapshot(store_for(file_root), "run-a")
    sensor = CurrentSnapshotSensor(task_id="c", output_uri=file_root, mode="changed", deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})
    trigger = info.value.trigger
    assert isinstance(trigger, CurrentSnapshotTrigger)
    assert trigger.mode == "changed"
    assert trigger.previous_manifest_ref == old.manifest_ref


def test_current_sensor_changed_in_poke_mode(file_root):
    store = store_for(file_root)
    publish_snapshot(store, "run-a")
    sensor = CurrentSnapshotSensor(task_id="c", output_uri=file_root, mode="changed", deferrable=False)
    assert not sensor.poke({})  # baseline
    assert not sensor.poke({})  # unchanged
    new = publish_snapshot(store, "run-b")
    assert sensor.poke({}).xcom_value == new.to_dict()


def test_current_sensor_run_id_mode(file_root):
    store = store_for(file_root)
    publish_snapshot(store, "run-a")
    sensor = CurrentSnapshotSensor(task_id="c", output_uri=file_root, mode="run_id", run_id="run-b", deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})
    assert info.value.trigger.run_id == "run-b"
    publish_snapshot(store, "run-b")
    assert sensor.execute({})["run_id"] == "run-b"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mode": "newest"}, "mode 'newest' is invalid"),
    ({"mode": "run_id"}, "run_id \\(required by mode='run_id'\\) None is invalid"),
    ({"mode": "reschedule"}, "pass sensor_mode='reschedule'"),
    ({"mode": "changed", "sensor_mode": "reschedule"}, "needs previous_manifest_ref or previous_run_id"),
    ({"output_uri": "relative/dir"}, "output_uri 'relative/dir' is invalid"),
])
def test_current_sensor_validates_in_execute(file_root, kwargs, match):
    sensor = CurrentSnapshotSensor(task_id="bad", **{"output_uri": file_root, **kwargs})
    with pytest.raises(ConfigError, match=match):
        sensor.execute({})


def test_current_sensor_rejects_pointer_outside_root(file_root, tmp_path):
    pointer = publish_snapshot(store_for(file_root))
    elsewhere = f"file://{tmp_path}/elsewhere"
    store_for(elsewhere).put(layout.CURRENT_KEY, pointer.to_bytes())
    with pytest.raises(ManifestValidationError, match="outside the output root"):
        CurrentSnapshotSensor(task_id="c", output_uri=elsewhere, deferrable=False).execute({})


def test_current_sensor_execute_complete_error():
    sensor = CurrentSnapshotSensor(task_id="c", output_uri="file:///x")
    with pytest.raises(Exception, match="CurrentSnapshotSensor 'c': giving up"):
        sensor.execute_complete({}, {"status": "error", "message": "giving up on _CURRENT"})


def test_current_sensor_execute_complete_keeps_the_triggers_error_type():
    sensor = CurrentSnapshotSensor(task_id="c", output_uri="file:///x")
    with pytest.raises(ManifestValidationError, match="CurrentSnapshotSensor 'c': manifest checksum differs"):
        sensor.execute_complete({}, {"status": "error", "message": "manifest checksum differs",
                                     "error_type": "ManifestValidationError"})


def test_trigger_backoff_is_exponential_and_capped():
    trigger = RunRecordTrigger("file:///x", "r1", poll_interval=2.0, max_backoff=10.0)
    assert [trigger.retry_policy.delay(n) for n in range(1, 6)] == [2.0, 4.0, 8.0, 10.0, 10.0]


# ---- the outcome rule the sensor shares with ShardedWriteOperator ----------------------------


def test_run_record_sensor_waits_until_a_run_meant_to_go_live_is_live(file_root):
    import dataclasses
    from datetime import timedelta

    from airflow_provider_shardyfusion.core.errors import PublishManifestError
    from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from tests.snapshot_helpers import publish_written_run

    store = store_for(file_root)
    publish_written_run(store, "r1", live=False, writer={"publish": True})  # succeeded, _CURRENT not yet moved
    sensor = RunRecordSensor(task_id="s", output_uri=file_root, run_id="r1", deferrable=False)
    assert sensor.poke({}) is False
    publish_run(SnapshotRoot(store), run_id="r1")
    assert sensor.poke({}).xcom_value["run_id"] == "r1"

    # The settle time passed and _CURRENT never named the run: it did not go live (the operator says the same).
    late = publish_written_run(store, "r2", live=False, writer={"publish": True})
    late = dataclasses.replace(late, finished_at=late.finished_at - timedelta(minutes=5))
    store.put(layout.run_record_key("r2"), late.to_bytes())
    with pytest.raises(PublishManifestError, match=r"run 'r2' was written completely .* did not go live"):
        RunRecordSensor(task_id="s", output_uri=file_root, run_id="r2", deferrable=False).poke({})
