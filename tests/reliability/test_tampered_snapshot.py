"""Promise: a manifest changed after publishing is refused by every reader of ``_CURRENT``.

``_CURRENT`` records the manifest's checksum and size when it moves; the reader, ``refresh()``,
the CLI and ``CurrentSnapshotSensor`` (poke and trigger) check the bytes against them.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot

KEYS = list(range(200))


def tamper(store, manifest_key: str) -> None:
    """Valid JSON, valid manifest, different content: num_dbs 4 → 5 (routing would send keys elsewhere)."""
    data = json.loads(store.get(manifest_key).data)
    data["num_dbs"] = 5
    store.put(manifest_key, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


@pytest.fixture
def published(any_root):
    return publish_two(*any_root)


def publish_two(root, options):
    snapshots = SnapshotRoot(open_store(root, options))
    old = build_snapshot(root, [(k, b"old-%d" % k) for k in KEYS], num_dbs=4, storage_options=options,
                         run_id="run-old", publish=False, published_at=layout.utc_now() - timedelta(minutes=5))
    new = build_snapshot(root, [(k, b"new-%d" % k) for k in KEYS], num_dbs=4, storage_options=options,
                         run_id="run-new", publish=False)
    publish_run(snapshots, run_id="run-old", sleep=lambda s: None)
    return snapshots, options, old, new


def test_a_reader_refuses_a_manifest_edited_after_publishing(published, tmp_path, figure):
    snapshots, options, old, _ = published
    tamper(snapshots.store, old.manifest_key)
    with pytest.raises(ManifestValidationError, match="changed after publishing"):
        ShardedReader(snapshots.root, storage_options=options, cache_dir=tmp_path / "a")
    figure(manifests_tampered=1, readers_refused=1)


def test_refresh_keeps_the_old_snapshot_when_the_new_manifest_was_edited(published, tmp_path, figure):
    snapshots, options, _, new = published
    with ShardedReader(snapshots.root, storage_options=options, cache_dir=tmp_path / "b") as reader:
        publish_run(snapshots, run_id="run-new", sleep=lambda s: None)
        tamper(snapshots.store, new.manifest_key)
        assert reader.refresh() is False and reader.run_id == "run-old"
        got = reader.multi_get(KEYS)
        assert got == [b"old-%d" % k for k in KEYS]
    figure(manifests_tampered=1, rows_checked=len(KEYS))


def test_the_cli_refuses_it_too(file_root, capsys):
    from airflow_provider_shardyfusion.cli import main

    snapshots, _, old, _ = publish_two(file_root, None)
    tamper(snapshots.store, old.manifest_key)
    assert main(["manifest", snapshots.root]) == 1
    assert "changed after publishing" in capsys.readouterr().err


# No capsys here: the first Airflow import configures logging onto whatever sys.stderr is then, and a
# per-test capture stream is closed after its test (later log lines would fail to write).
def test_the_current_sensor_refuses_it_too(file_root):
    from airflow_provider_shardyfusion.sensors.current import CurrentSnapshotSensor

    snapshots, _, old, _ = publish_two(file_root, None)
    tamper(snapshots.store, old.manifest_key)

    sensor = CurrentSnapshotSensor(task_id="s", output_uri=snapshots.root, mode="exists", deferrable=False,
                                   aws_conn_id=None, timeout=5, poke_interval=1)
    with pytest.raises(ManifestValidationError, match="changed after publishing"):
        sensor.poke({})
