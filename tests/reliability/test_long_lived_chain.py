"""Promise: a long-lived writer re-checks the chain it resolved once before it writes on it or publishes.

A process keeps the chains it resolved (``SnapshotRoot``'s cache, by manifest checksum), so a
streaming driver or any long-lived client would not read a base again. Before a delta is written
on a base (``resolve_base``, the job's first step) and when a run goes live (``move_pointer``, the
writer's own publish and ``publish_run``), every ancestor manifest is checked against the checksum
its successor recorded: a HEAD per ancestor while its size and ETag are unchanged, the bytes hashed
again when not. An ancestor edited since is refused, naming it.
"""

from __future__ import annotations

import json
import re

import pytest

from airflow_provider_shardyfusion.core.errors import ManifestValidationError, PublishManifestError
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.spark_jobs.chain_write import resolve_base
from tests.snapshot_factory import build_delta, build_snapshot

KEYS = list(range(120))


def edit(store, manifest_key: str) -> None:
    """Valid JSON, valid manifest, other bytes: what an operator's hand edit of a manifest leaves."""
    data = json.loads(store.get(manifest_key).data)
    data["writer"] = {"provider": "edited by hand"}
    store.put(manifest_key, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def edited_chain(root, options):
    """t-0 (full) and t-1 (delta, live); this process resolves t-1 as its writer would and stages t-2
    on it (the chain is now in its cache); then t-0's manifest is edited."""
    snapshots = SnapshotRoot(open_store(root, options))
    t0 = build_snapshot(root, [(k, b"v0-%d" % k) for k in KEYS], num_dbs=4, storage_options=options, run_id="t-0",
                        shard_layout="sst")
    build_delta(root, {1: b"v1"}, storage_options=options, run_id="t-1")
    config = build_write_config(output_uri=root, input_path="s3://lake/changes/", key_column="key",
                                value_column="v", write_mode="delta", storage_options=options)
    base_ref, resolved = resolve_base(snapshots, config)  # the check passes: nothing was edited yet
    assert resolved.manifest.run_id == "t-1" and resolved.ancestors == (t0.manifest_ref,)
    build_delta(root, {2: b"v2"}, storage_options=options, run_id="t-2", publish=False)
    edit(snapshots.store, t0.manifest_key)
    altered = rf"base manifest {re.escape(t0.manifest_ref)} of run 't-0' \(the base of run 't-1'\) was altered"
    return snapshots, config, base_ref, altered


@pytest.mark.parametrize("first", ["next_delta", "writer_publish", "publish_run"])
def test_a_long_lived_writer_refuses_a_base_chain_edited_since_it_resolved_it(any_root, tmp_path, figure, first):
    root, options = any_root
    snapshots, config, base_ref, altered = edited_chain(root, options)

    def next_delta():  # the job's first step, before any input is read
        with pytest.raises(ManifestValidationError, match=altered):
            resolve_base(snapshots, config)

    def writer_publish():  # the job's own publish (core.write.commit) of a run written before the edit
        with pytest.raises(PublishManifestError, match=rf"run 't-2' cannot go live: {altered}"):
            snapshots.move_pointer(snapshots.resolve_manifest(run_id="t-2"), sleep=lambda s: None)

    def publish_run_():  # PublishSnapshotOperator, the CLI
        with pytest.raises((PublishManifestError, ManifestValidationError), match=altered):
            publish_run(snapshots, run_id="t-2", sleep=lambda s: None)

    paths = {"next_delta": next_delta, "writer_publish": writer_publish, "publish_run": publish_run_}
    # The first refusal is the one that meets the chain still cached; the others follow it.
    for name in [first, *(n for n in paths if n != first)]:
        paths[name]()
    assert snapshots.current().run_id == "t-1"
    assert snapshots.read_run("t-2").published_at is None
    # A reader of this process now refuses the edited chain as a new process's reader does.
    with pytest.raises(ManifestValidationError, match=altered):
        ShardedReader(root, storage_options=options, cache_dir=tmp_path / "r", manifest_ref=base_ref)
    figure(first_refusal=first, ancestors_edited=1, refusals=len(paths), pointer_moves=0)


class CountingStore(LocalStore):
    """The local store, counting the manifest reads the chain check makes."""

    heads = gets = 0

    def head(self, key):
        self.heads += key.startswith("manifests/")
        return super().head(key)

    def get(self, key):
        self.gets += key.startswith("manifests/")
        return super().get(key)


def test_the_check_of_an_unchanged_chain_is_a_head_per_base(file_root, figure):
    build_snapshot(file_root, [(k, b"v0-%d" % k) for k in KEYS], num_dbs=4, run_id="t-0", shard_layout="sst")
    for depth in range(1, 4):
        build_delta(file_root, {depth: b"v%d" % depth}, run_id=f"t-{depth}")
    store = CountingStore(file_root)
    snapshots = SnapshotRoot(store)
    resolved = snapshots.read_manifest_chain(snapshots.current())  # chain cached (the factory resolved it)
    assert len(resolved.links) == 3
    store.heads = store.gets = 0
    for _ in range(10):
        snapshots.check_chain(resolved)
    assert (store.heads, store.gets) == (30, 0)
    figure(bases=3, checks=10, heads=store.heads, manifest_gets=store.gets)
