"""RunRecordTrigger and CurrentSnapshotTrigger run with asyncio against the local store and a
real S3 API server (moto on loopback), S3 reached through an Airflow connection from the env."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import uuid
from typing import Any

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, RunError
from airflow_provider_shardyfusion.triggers.current import CurrentSnapshotTrigger
from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger
from tests.snapshot_helpers import publish_snapshot, store_for, write_run_record

ACCESS_KEY = "AKIASHARDYFUSIONTEST"
SECRET_KEY = "shardy-secret-" + uuid.uuid4().hex
FAST = {"poll_interval": 0.2, "max_backoff": 0.4}


@pytest.fixture
def root(request, monkeypatch):
    """(root, store, aws_conn_id) for the local store and for S3 through an AIRFLOW_CONN_ connection."""
    if request.param == "file":
        root = request.getfixturevalue("file_root")
        return root, store_for(root), None
    server = request.getfixturevalue("s3_server")
    root = request.getfixturevalue("s3_root")
    conn_id = f"sf_test_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY, "extra": {"endpoint_url": server}}
    ))
    return root, store_for(root, request.getfixturevalue("s3_options")), conn_id


both_stores = pytest.mark.parametrize("root", ["file", pytest.param("s3", marks=pytest.mark.s3)], indirect=True)


async def _collect(trigger, limit_s: float = 30.0) -> list[Any]:
    async def drain():
        return [event async for event in trigger.run()]

    return await asyncio.wait_for(drain(), limit_s)


def run_trigger(trigger, *, during=None, timeout: float = 30.0) -> dict[str, Any]:
    """Run the trigger to completion (``during``: a coroutine run alongside it); return its one event."""

    async def main():
        task = asyncio.create_task(_collect(trigger, timeout))
        if during is not None:
            await during
        return await task

    events = asyncio.run(main())
    assert len(events) == 1, events
    payload = events[0].payload
    assert json.loads(json.dumps(payload)) == payload  # an event must be plain JSON
    return payload


async def later(seconds: float, fn, *args, **kwargs):
    await asyncio.sleep(seconds)
    return await asyncio.to_thread(fn, *args, **kwargs)


# ---- RunRecordTrigger ---------------------------------------------------------------------


@both_stores
def test_run_record_success(root):
    uri, store, conn_id = root
    pointer = publish_snapshot(store)
    event = run_trigger(RunRecordTrigger(uri, pointer.run_id, aws_conn_id=conn_id, **FAST))
    assert event["status"] == "success"
    assert event["run_record"]["run_id"] == pointer.run_id
    assert event["run_record"]["status"] == "succeeded"
    assert event["run_record"]["manifest_ref"] == pointer.manifest_ref


@both_stores
def test_run_record_waits_while_missing_and_running(root):
    uri, store, conn_id = root
    run_id = layout.new_run_id()

    async def writer():
        await later(0.5, write_run_record, store, run_id, RUNNING)
        await later(0.5, publish_snapshot, store, run_id)

    event = run_trigger(RunRecordTrigger(uri, run_id, aws_conn_id=conn_id, **FAST), during=writer())
    assert event["status"] == "success"
    assert event["run_record"]["run_id"] == run_id


@both_stores
def test_run_record_writer_error_carries_type_and_message(root):
    uri, store, conn_id = root
    run_id = layout.new_run_id()
    write_run_record(store, run_id, FAILED, error=RunError(
        type="ShardWriteError", message="db_id=3 attempt=0: disk full after 120 rows"))
    event = run_trigger(RunRecordTrigger(uri, run_id, aws_conn_id=conn_id, **FAST))
    assert event["status"] == "error"
    assert event["reason"] == "failed"
    assert event["error_type"] == "ShardWriteError"
    assert event["writer_message"] == "db_id=3 attempt=0: disk full after 120 rows"
    assert "ShardWriteError: db_id=3 attempt=0: disk full after 120 rows" in event["message"]
    assert run_id in event["message"]


@both_stores
def test_run_record_expired_lease_is_writer_lost(root):
    uri, store, conn_id = root
    run_id = layout.new_run_id()
    write_run_record(store, run_id, RUNNING, lease_seconds=-30)
    event = run_trigger(RunRecordTrigger(uri, run_id, aws_conn_id=conn_id, **FAST))
    assert event["status"] == "error"
    assert event["reason"] == "writer_lost"
    assert event["message"].startswith("writer lost")
    assert "lease expired" in event["message"]


@both_stores
def test_run_record_missing_timeout(root):
    uri, _, conn_id = root
    event = run_trigger(RunRecordTrigger(uri, "never-written", aws_conn_id=conn_id, missing_timeout=0.5, **FAST))
    assert event["status"] == "error"
    assert event["reason"] == "missing"
    assert "'never-written' does not exist" in event["message"]


@both_stores
def test_run_record_of_a_run_meant_to_go_live_waits_for_current(root):
    """The writer records succeeded just before it moves _CURRENT: the trigger (like the sensor's
    poke and ShardedWriteOperator, core.lifecycle.run_outcome) reports success only once the run is live."""
    from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from tests.snapshot_helpers import publish_written_run

    uri, store, conn_id = root
    run_id = layout.new_run_id()
    publish_written_run(store, run_id, live=False, writer={"publish": True})
    moved = []

    async def writer():
        await later(0.6, lambda: moved.append(publish_run(SnapshotRoot(store), run_id=run_id)))

    event = run_trigger(RunRecordTrigger(uri, run_id, aws_conn_id=conn_id, **FAST), during=writer())
    assert moved and event["status"] == "success" and event["live_state"] == "live"
    assert event["run_record"]["run_id"] == run_id


@both_stores
def test_run_record_of_a_superseded_run_succeeds_staged(root):
    from tests.snapshot_helpers import publish_written_run

    uri, store, conn_id = root
    publish_written_run(store, "run-newer", started_minutes_ago=0)
    publish_written_run(store, "run-older", started_minutes_ago=10, writer={"publish": True})
    event = run_trigger(RunRecordTrigger(uri, "run-older", aws_conn_id=conn_id, **FAST))
    assert (event["status"], event["live_state"], event["live_run_id"]) == ("success", "superseded", "run-newer")


def test_run_record_malformed_is_an_error_not_a_retry(file_root):
    store = store_for(file_root)
    store.put(layout.run_record_key("r1"), b'{"format_version": 99}')
    event = run_trigger(RunRecordTrigger(file_root, "r1", poll_interval=0.1))
    assert event["status"] == "error"
    assert event["error_type"] == "RunRecordError"
    assert "format_version 99" in event["message"]


def test_invalid_run_id_is_an_error_event(file_root):
    event = run_trigger(RunRecordTrigger(file_root, "../escape", poll_interval=0.1))
    assert event["status"] == "error"
    assert event["error_type"] == "ConfigError"
    assert "run_id '../escape' is invalid" in event["message"]


# ---- transient errors ----------------------------------------------------------------------


@pytest.mark.s3
def test_gives_up_after_consecutive_failures(s3_server, s3_options, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SF_NOBUCKET", json.dumps(
        {"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY, "extra": {"endpoint_url": s3_server}}))
    trigger = RunRecordTrigger("s3://no-such-bucket-shardy/snap", "r1", aws_conn_id="sf_nobucket",
                               max_consecutive_failures=3, **FAST)
    event = run_trigger(trigger)
    assert event["status"] == "error"
    assert "after 3 consecutive failed reads" in event["message"]
    assert "NoSuchBucket" in event["message"]


@pytest.mark.s3
def test_recovers_when_transient_errors_stop(s3_server, s3_options, monkeypatch):
    from airflow_provider_shardyfusion.core.storage import StorageOptions
    from airflow_provider_shardyfusion.core.storage.s3 import make_s3_client

    monkeypatch.setenv("AIRFLOW_CONN_SF_LATEBUCKET", json.dumps(
        {"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY, "extra": {"endpoint_url": s3_server}}))
    bucket = f"late-{uuid.uuid4().hex[:12]}"
    root = f"s3://{bucket}/snap"

    def create_and_publish():
        make_s3_client(StorageOptions.from_dict(s3_options)).create_bucket(Bucket=bucket)
        return publish_snapshot(store_for(root, s3_options), "late-run")

    trigger = CurrentSnapshotTrigger(root, aws_conn_id="sf_latebucket", max_consecutive_failures=10, **FAST)
    event = run_trigger(trigger, during=later(0.7, create_and_publish))
    assert event["status"] == "success"
    assert event["pointer"]["run_id"] == "late-run"


# ---- CurrentSnapshotTrigger ----------------------------------------------------------------


@both_stores
def test_current_exists_waits_for_the_pointer(root):
    uri, store, conn_id = root
    event = run_trigger(CurrentSnapshotTrigger(uri, aws_conn_id=conn_id, **FAST),
                        during=later(0.5, publish_snapshot, store, "first-run"))
    assert event["status"] == "success"
    assert event["pointer"]["run_id"] == "first-run"
    assert event["pointer"]["manifest_ref"].startswith(uri + "/manifests/")


@both_stores
def test_current_changed_mode(root):
    uri, store, conn_id = root
    old = publish_snapshot(store, "run-a")
    trigger = CurrentSnapshotTrigger(uri, mode="changed", previous_manifest_ref=old.manifest_ref,
                                     aws_conn_id=conn_id, **FAST)
    event = run_trigger(trigger, during=later(0.6, publish_snapshot, store, "run-b"))
    assert event["status"] == "success"
    assert event["pointer"]["run_id"] == "run-b"
    assert event["pointer"]["manifest_ref"] != old.manifest_ref


def test_current_changed_by_previous_run_id_and_without_baseline(file_root):
    store = store_for(file_root)
    publish_snapshot(store, "run-a")
    event = run_trigger(CurrentSnapshotTrigger(file_root, mode="changed", previous_run_id="run-a", **FAST),
                        during=later(0.5, publish_snapshot, store, "run-b"))
    assert event["pointer"]["run_id"] == "run-b"
    # No baseline = there was no pointer at the first poke: any pointer is a change.
    event = run_trigger(CurrentSnapshotTrigger(file_root, mode="changed", **FAST))
    assert event["pointer"]["run_id"] == "run-b"


@both_stores
def test_current_run_id_mode(root):
    uri, store, conn_id = root
    publish_snapshot(store, "other-run")
    event = run_trigger(CurrentSnapshotTrigger(uri, mode="run_id", run_id="wanted-run", aws_conn_id=conn_id, **FAST),
                        during=later(0.6, publish_snapshot, store, "wanted-run"))
    assert event["status"] == "success"
    assert event["pointer"]["run_id"] == "wanted-run"


def test_current_pointer_outside_root_is_an_error(file_root, tmp_path):
    store = store_for(file_root)
    pointer = publish_snapshot(store, "run-a")
    other = store_for(f"file://{tmp_path}/elsewhere")
    other.put(layout.CURRENT_KEY, pointer.to_bytes())
    event = run_trigger(CurrentSnapshotTrigger(f"file://{tmp_path}/elsewhere", **FAST))
    assert event["status"] == "error"
    assert event["error_type"] == "ManifestValidationError"
    assert "outside the output root" in event["message"]


@pytest.mark.parametrize("damage", ["intact", "missing", "altered"])
def test_current_walks_a_delta_chain_as_the_reader_does(file_root, damage):
    """The trigger drives the same chain walk (core.model.chain) as SnapshotRoot, asynchronously: a
    delta's pointer is a snapshot only with every manifest of its chain, and the error is the reader's."""
    from airflow_provider_shardyfusion.core.errors import ManifestValidationError
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot, forget_decoded_manifests
    from tests.snapshot_factory import build_delta, build_snapshot

    build_snapshot(file_root, [(k, b"v") for k in range(20)], num_dbs=2, run_id="c0", shard_layout="sst")
    build_delta(file_root, {1: "one"}, [], run_id="c1")
    build_delta(file_root, {2: "two"}, [3], run_id="c2")
    store = store_for(file_root)
    victim = SnapshotRoot(store).find_manifest("c1")
    if damage == "missing":
        store.delete_many([victim.key])
    elif damage == "altered":
        store.put(victim.key, store.get(victim.key).data + b" ")
    event = run_trigger(CurrentSnapshotTrigger(file_root, mode="run_id", run_id="c2", **FAST))
    if damage == "intact":
        assert event["status"] == "success" and event["pointer"]["run_id"] == "c2"
        return
    forget_decoded_manifests()
    with pytest.raises(ManifestValidationError) as sync_error:
        SnapshotRoot(store).read_manifest(SnapshotRoot(store).current())
    assert event["status"] == "error" and event["error_type"] == "ManifestValidationError"
    assert event["message"].endswith(str(sync_error.value))  # the same words, after where the trigger read
    assert victim.uri in event["message"] and "'c1'" in event["message"] and "'c2'" in event["message"]


def test_current_bad_mode_is_an_error_event(file_root):
    event = run_trigger(CurrentSnapshotTrigger(file_root, mode="newest", **FAST))
    assert event["status"] == "error"
    assert "mode 'newest' is invalid" in event["message"]


@both_stores
def test_user_kill_marks_the_writers_run_failed_only_when_asked(root):
    uri, store, conn_id = root
    owned, watched = layout.new_run_id(), layout.new_run_id()
    write_run_record(store, owned, RUNNING)
    write_run_record(store, watched, RUNNING)
    asyncio.run(RunRecordTrigger(uri, owned, aws_conn_id=conn_id, fail_run_on_kill=True, **FAST).on_kill())
    asyncio.run(RunRecordTrigger(uri, watched, aws_conn_id=conn_id, **FAST).on_kill())
    from airflow_provider_shardyfusion.core.model.run_record import read_run_record

    killed = read_run_record(store, owned)
    assert killed.status == FAILED and killed.error.type == "RunKilled" and "killed" in killed.error.message
    assert read_run_record(store, watched).status == RUNNING  # a sensor's trigger never touches the run


@pytest.mark.parametrize("root", [pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
def test_triggers_never_look_connections_up_synchronously(root, monkeypatch):
    """A sync connection look-up inside the triggerer's loop can deadlock its supervisor comms."""
    from airflow.sdk.bases.hook import BaseHook

    def forbidden(*args, **kwargs):
        raise AssertionError("sync get_connection called inside a trigger")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(forbidden))
    uri, store, conn_id = root
    from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

    with pytest.raises(AssertionError, match="sync get_connection"):  # the guard is really in place
        ShardyfusionHook(aws_conn_id=conn_id).storage_options(uri)
    pointer = publish_snapshot(store)
    assert run_trigger(RunRecordTrigger(uri, pointer.run_id, aws_conn_id=conn_id, **FAST))["status"] == "success"
    assert run_trigger(CurrentSnapshotTrigger(uri, aws_conn_id=conn_id, **FAST))["pointer"]["run_id"] == pointer.run_id
    running_id = layout.new_run_id()
    write_run_record(store, running_id, RUNNING)
    asyncio.run(RunRecordTrigger(uri, running_id, aws_conn_id=conn_id, fail_run_on_kill=True, **FAST).on_kill())
    from airflow_provider_shardyfusion.core.model.run_record import read_run_record

    assert read_run_record(store, running_id).status == FAILED


# ---- serialization and secrets -----------------------------------------------------------


@pytest.mark.parametrize("trigger", [
    RunRecordTrigger("s3://bucket/prefix", "r1", aws_conn_id="c", poll_interval=3.0, missing_timeout=60.0,
                     max_consecutive_failures=7, max_backoff=30.0, fail_run_on_kill=True),
    CurrentSnapshotTrigger("file:///data/out", mode="changed", run_id=None, previous_run_id="r0",
                           previous_manifest_ref="file:///data/out/manifests/x/manifest.json", aws_conn_id=None,
                           poll_interval=2.5, max_consecutive_failures=4, max_backoff=10.0),
], ids=["run_record", "current"])
def test_serialize_round_trip(trigger):
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is type(trigger)
    assert set(kwargs) == set(inspect.signature(cls.__init__).parameters) - {"self"}
    rebuilt = cls(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize("root", [pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
def test_no_credentials_in_serialized_trigger_or_events(root):
    uri, store, conn_id = root
    pointer = publish_snapshot(store)
    failed_id = layout.new_run_id()
    write_run_record(store, failed_id, FAILED, error=RunError(type="ShardWriteError", message="boom"))
    triggers = [
        RunRecordTrigger(uri, pointer.run_id, aws_conn_id=conn_id, **FAST),
        RunRecordTrigger(uri, failed_id, aws_conn_id=conn_id, **FAST),
        CurrentSnapshotTrigger(uri, mode="run_id", run_id=pointer.run_id, aws_conn_id=conn_id, **FAST),
        RunRecordTrigger("s3://no-such-bucket-shardy/x", "r1", aws_conn_id=conn_id, max_consecutive_failures=2, **FAST),
    ]
    outputs = []
    for trigger in triggers:
        outputs.append(json.dumps(trigger.serialize()))
        outputs.append(json.dumps(run_trigger(trigger)))
    assert '"status": "success"' in outputs[1]  # the connection really was used
    text = "\n".join(outputs)
    assert ACCESS_KEY not in text
    assert SECRET_KEY not in text
