"""A reader stays within a bounded number of open file descriptors whatever the shard count (issue #26).

Each open shard database holds a descriptor per SST file, and a refresh used to open every changed
shard of the new snapshot next to the old snapshot's: at 4000 shards a follower ran out of
descriptors. The reader here runs in a child process whose soft ``RLIMIT_NOFILE`` is lowered below
what "every shard open twice" needs; snapshots are real (``tests.snapshot_factory``: shard databases
and delta layers written by ``core``), on the local store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core.model.routing import route_key
from tests.snapshot_factory import build_delta, build_snapshot

NUM_DBS = 300
KEYS_PER_SHARD = 4
# A base shard is one SST, a changed one two (base + layer): every shard open in both snapshots
# needs ~900 descriptors. 512 leaves a bounded reader (64 shards by default) plenty.
NOFILE_LIMIT = 512

# Every child starts so: its soft open-files limit lowered to argv[1], its other arguments after it.
_LIMITED = textwrap.dedent("""
    import json, os, resource, sys
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

    def descriptors():
        return len(os.listdir("/proc/self/fd"))
""")

_CHILD = _LIMITED + textwrap.dedent("""
    from airflow_provider_shardyfusion.core.storage import open_store
    from tests.snapshot_factory import publish_current

    root, delta_key, delta_run, model_path, live = sys.argv[2:]
    with open(model_path) as fh:
        models = json.load(fh)
    idle = descriptors()
    out = {"idle": idle}
    with ShardedReader(root, ingest_refreshes=live == "live") as reader:
        before = {k: reader.get(int(k)) for k in models["base"]}
        out["every_base_shard_read"] = descriptors()
        publish_current(open_store(root), delta_key, delta_run)
        out["swapped"] = reader.refresh()
        out["run_id"] = reader.run_id
        out["after_refresh"] = descriptors()
        after = {k: reader.get(int(k)) for k in models["delta"]}
        out["every_delta_shard_read"] = descriptors()
        out["max_open_shards"] = reader.describe().max_open_shards
        out["max_open_files"] = reader.describe().max_open_files
    out["before"] = {k: v.decode() for k, v in before.items()}
    out["after"] = {k: v.decode() for k, v in after.items()}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("live", ["read-only", "live"])
def test_refresh_of_a_delta_changing_every_shard_stays_within_the_descriptor_limit(file_root, tmp_path, live):
    keys: dict[int, list[int]] = {}
    key = 0
    while len(keys) < NUM_DBS or min(len(v) for v in keys.values()) < KEYS_PER_SHARD:
        keys.setdefault(route_key(key, NUM_DBS), []).append(key)
        key += 1
    base = {k: f"base-{k}" for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, [(k, v.encode()) for k, v in base.items()], num_dbs=NUM_DBS, run_id="base",
                   shard_layout="sst")
    upserts = {shard_keys[0]: f"delta-{shard_keys[0]}" for shard_keys in keys.values()}  # every shard changes
    delta = build_delta(file_root, upserts, run_id="delta", publish=False)
    assert len(delta.manifest.shards) == NUM_DBS
    models = {"base": base, "delta": {**base, **upserts}}
    model_path = tmp_path / "models.json"
    model_path.write_text(json.dumps(models))

    got = _run_limited(_CHILD, NOFILE_LIMIT, file_root, delta.manifest_key, delta.run_id, str(model_path), live)
    print("descriptors:", {k: got[k] for k in ("idle", "every_base_shard_read", "after_refresh",
                                                 "every_delta_shard_read", "max_open_shards", "max_open_files")})
    assert got["swapped"] and got["run_id"] == "delta"
    assert got["before"] == {str(k): v for k, v in models["base"].items()}
    assert got["after"] == {str(k): v for k, v in models["delta"].items()}
    # Bounded: never more shard databases open than the bound, whatever the shard count.
    assert got["max_open_shards"] < NUM_DBS
    peak = max(got["every_base_shard_read"], got["after_refresh"], got["every_delta_shard_read"])
    if live == "live":  # its databases' own descriptors count as files: the files bound holds them all
        assert peak <= got["idle"] + got["max_open_files"] + 8 and got["max_open_files"] < NOFILE_LIMIT
    else:
        assert peak <= got["idle"] + 3 * got["max_open_shards"]


def test_a_reader_on_a_db_layout_base_refreshes_to_a_delta(file_root):
    """A full snapshot in the default ``db`` layout (each shard a downloaded RocksDB folder), followed
    by a reader that then refreshes to a delta: the changed shards are built on the cached base copies."""
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.core.storage import open_store
    from tests.snapshot_factory import publish_current

    num_dbs = 4
    base = {k: f"base-{k}".encode() for k in range(40)}
    build_snapshot(file_root, list(base.items()), num_dbs=num_dbs, run_id="base")
    upserts = {k: f"delta-{k}" for k in range(0, 40, 3)}
    delta = build_delta(file_root, upserts, run_id="delta", publish=False)
    with ShardedReader(file_root) as reader:
        assert {k: reader.get(k) for k in base} == base
        publish_current(open_store(file_root), delta.manifest_key, delta.run_id)
        assert reader.refresh() and reader.run_id == "delta"
        expected = {**base, **{k: v.encode() for k, v in upserts.items()}}
        got = {k: reader.get(k) for k in expected}
    assert got == expected


CHAIN_DBS = 40
CHAIN_DEPTH = 8
# Every shard of a depth-8 chain read with its layers kept is nine SST files, each an open
# descriptor: the shard bound alone (16 shards at this limit) needs ~150 for the open shards plus a
# build's own, past this limit.
CHAIN_NOFILE_LIMIT = 160

_CHAIN_CHILD = _LIMITED + textwrap.dedent("""
    root, model_path = sys.argv[2:]
    with open(model_path) as fh:
        model = json.load(fh)
    out = {"idle": descriptors(), "peak": 0}
    got = {}
    with ShardedReader(root, max_local_layers=None) as reader:
        for k in model:
            value = reader.get(int(k))
            got[k] = None if value is None else value.decode()
            out["peak"] = max(out["peak"], descriptors())
        out["run_id"] = reader.run_id
        out["budget"] = reader.describe().max_open_files
    out["got"] = got
    print(json.dumps(out))
""")


def test_a_deep_chain_with_every_layer_kept_reads_back_within_the_descriptor_limit(file_root, tmp_path):
    """Shards of many SST files each: the reader's bound counts their files, not the shards (issue #26)."""
    keys: dict[int, list[int]] = {}
    key = 0
    while len(keys) < CHAIN_DBS or min(len(v) for v in keys.values()) < CHAIN_DEPTH + 1:
        keys.setdefault(route_key(key, CHAIN_DBS), []).append(key)
        key += 1
    model: dict[int, str | None] = {k: f"base-{k}" for shard_keys in keys.values() for k in shard_keys}
    build_snapshot(file_root, [(k, v.encode()) for k, v in model.items() if v is not None], num_dbs=CHAIN_DBS,
                   run_id="base", shard_layout="sst")
    for step in range(1, CHAIN_DEPTH + 1):  # each delta changes every shard: one more layer each
        upserts = {shard_keys[step]: f"delta{step}-{shard_keys[step]}" for shard_keys in keys.values()}
        deletes = [shard_keys[0] for shard_keys in keys.values()] if step == CHAIN_DEPTH else []
        build_delta(file_root, upserts, deletes, run_id=f"delta{step:02d}")
        model.update(upserts)
        model.update(dict.fromkeys(deletes))
    model_path = tmp_path / "model.json"
    model_path.write_text(json.dumps(model))

    got = _run_limited(_CHAIN_CHILD, CHAIN_NOFILE_LIMIT, file_root, str(model_path))
    print("descriptors:", {k: got[k] for k in ("idle", "peak", "budget")})
    assert got["run_id"] == f"delta{CHAIN_DEPTH:02d}"
    assert got["got"] == {str(k): v for k, v in model.items()}
    assert got["peak"] < CHAIN_NOFILE_LIMIT
    # Bounded by the budget in files, plus what one build holds (its layers, the database's own files).
    assert got["peak"] <= got["idle"] + got["budget"] + 2 * (CHAIN_DEPTH + 1) + 8


def _run_limited(script: str, limit: int, *args: str) -> dict:
    """Run a child script under an open-files limit of ``limit``; what it printed last, decoded."""
    repo = str(Path(__file__).resolve().parents[2])  # the child imports tests.snapshot_factory
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script, str(limit), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
