"""``ShardyfusionHook`` on the local store and on the S3 server through a real Airflow connection
(``AIRFLOW_CONN_…`` JSON with an ``endpoint_url`` extra): storage options, credentials, the snapshot
facade, the reader, and the async reads the triggers use."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import RunKilled
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED
from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook
from tests.snapshot_helpers import publish_snapshot, store_for, write_run_record

ACCESS_KEY = "AKIASHARDYFUSIONHOOK"
SECRET_KEY = "hook-secret-" + uuid.uuid4().hex


@pytest.fixture(params=["file", "s3"])
def target(request, monkeypatch):
    """(root, store, hook) for the local store, and for S3 through an Airflow connection."""
    if request.param == "file":
        root = request.getfixturevalue("file_root")
        return root, store_for(root), ShardyfusionHook(aws_conn_id=None)
    server = request.getfixturevalue("s3_server")
    root = request.getfixturevalue("s3_root")
    conn_id = f"sf_hook_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"endpoint_url": server, "region_name": "us-east-1"},
    }))
    return root, store_for(root, request.getfixturevalue("s3_options")), ShardyfusionHook(aws_conn_id=conn_id)


def test_sync_reads_go_through_the_snapshot_facade(target):
    root, store, hook = target
    assert hook.read_current(root) is None
    pointer = publish_snapshot(store, "run-a")
    write_run_record(store, "run-b", RUNNING)
    assert hook.read_current(root) == pointer
    assert hook.list_run_ids(root) == ["run-a", "run-b"]
    assert hook.read_run_record(root, "run-a").status == SUCCEEDED
    assert hook.read_manifest(root, pointer.manifest_ref).run_id == "run-a"
    snapshots = hook.get_snapshots(root)
    assert snapshots.root == layout.normalize_root(root)
    assert snapshots.find_manifest("run-a").uri == pointer.manifest_ref
    with hook.get_reader(root) as reader:
        assert reader.run_id == "run-a" and reader.get(1) is None  # an empty 2-shard snapshot


def test_storage_options_keep_credentials_in_process(target):
    root, _, hook = target
    public = hook.public_storage_options(root)
    full = hook.storage_options(root)
    assert SECRET_KEY not in json.dumps(public.to_dict()) and SECRET_KEY not in repr(full)
    if root.startswith("s3://"):
        assert public.endpoint_url and public.addressing_style == "path"
        assert full.aws_secret_access_key == SECRET_KEY and full.aws_access_key_id == ACCESS_KEY
        assert hook.credential_env(root) == {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    else:
        assert public.endpoint_url is None and hook.credential_env(root) == {}


def test_async_reads_and_mark_failed(target):
    root, store, hook = target
    pointer = publish_snapshot(store, "run-a")
    write_run_record(store, "run-w", RUNNING)

    async def reads():
        return (await hook.aread_current(root), await hook.aread_run_record(root, "run-w"),
                await hook.aread_object(root, "no/such/key"),
                await hook.amark_failed(root, "run-w", RunKilled()),
                await hook.amark_failed(root, "run-a", RunKilled()))

    current, record, missing, killed, finished = asyncio.run(reads())
    assert current == pointer and record.status == RUNNING and missing is None
    assert killed.status == FAILED and killed.error.type == "RunKilled"
    assert finished.status == SUCCEEDED  # a finished run is never marked failed
    assert hook.read_run_record(root, "run-w").error.message == str(RunKilled())


@pytest.mark.s3
def test_before_airflow_3_3_2_the_connection_is_looked_up_off_the_loop(s3_server, s3_root, s3_options, monkeypatch):
    """Before 3.3.2 ``aget_connection`` masks secrets with a sync supervisor call (DeadlockImminentError
    in a triggerer), so the hook looks the connection up in a worker thread there. Simulated here by
    hiding 3.3.2's ``Connection.aextra_dejson``; the floor test installs the real 3.3.0."""
    import threading

    from airflow.sdk import Connection
    from airflow.sdk.bases.hook import BaseHook

    conn_id = f"sf_hook_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"},
    }))
    store = store_for(s3_root, s3_options)
    pointer = publish_snapshot(store, "run-a")
    write_run_record(store, "run-w", RUNNING)
    monkeypatch.delattr(Connection, "aextra_dejson")
    lookups: list[int] = []
    real_get_connection = BaseHook.get_connection.__func__

    def recording(cls, conn_id):
        lookups.append(threading.get_ident())
        return real_get_connection(cls, conn_id)

    async def forbidden(cls, conn_id):
        raise AssertionError("aget_connection called on an Airflow before 3.3.2")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(recording))
    monkeypatch.setattr(BaseHook, "aget_connection", classmethod(forbidden))
    hook = ShardyfusionHook(aws_conn_id=conn_id)

    async def reads():
        return (threading.get_ident(), await hook.aread_current(s3_root),
                await hook.amark_failed(s3_root, "run-w", RunKilled()))

    loop_thread, current, killed = asyncio.run(reads())
    assert current == pointer and killed.status == FAILED
    assert len(lookups) == 2 and loop_thread not in lookups
