"""``ShardyfusionHook`` on the local store and on the S3 server through a real Airflow connection
(``AIRFLOW_CONN_…`` JSON with an ``endpoint_url`` extra): storage options, credentials, the snapshot
facade, the reader, and the async reads the triggers use."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from snapshot_helpers import publish_snapshot, store_for, write_run_record

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import RunKilled
from airflow_provider_shardyfusion.core.run_record import FAILED, RUNNING, SUCCEEDED
from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

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
