"""A live follower whose memory-backed folder fills after it opened keeps following (issue 42 item 2).

The folder is a real small tmpfs: the reader runs in a child process (``unshare --mount
--map-root-user``) with an 8 MB tmpfs of its own as the memory-backed folder
(``scratch.MEMORY_DIR``, the only thing set by hand), so no other process's ``/dev/shm`` is
filled. Once the reader serves both shards live, a file fills the tmpfs to 300 kB free; a delta
whose layer of shard 0 is about 1 MB is then published. The refresh must succeed, serve shard 0
read-only from the cache and say so in ``health()``, every value exact; once the room is back, the
next refresh serves every shard live again. The child reports what it saw as JSON; the test checks it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TMPFS_BYTES = 8 << 20
LEFT_FREE = 300_000
NUM_DBS = 2


def _unshare() -> list[str]:
    cmd = ["unshare", "--mount", "--map-root-user"]
    if shutil.which("unshare") is None or subprocess.run([*cmd, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare --mount --map-root-user (a tmpfs of the test's own, no root needed)")
    return cmd


def test_a_live_follower_whose_memory_folder_fills_keeps_following(tmp_path, figure):
    mount = tmp_path / "shm"
    mount.mkdir()
    root = f"file://{tmp_path}/root"
    script = (f'mount -t tmpfs -o size={TMPFS_BYTES} shardyfusion-test "$0" && exec "$@"')
    proc = subprocess.run([*_unshare(), "sh", "-c", script, str(mount), sys.executable, __file__, root, str(mount)],
                          cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    full = seen["full"]
    # Before the fix: "cannot ingest the new layers of shard 0 … No space left on device".
    assert full["refresh_error"] is None, full
    assert full["run_id"] == "t1" and full["values_exact"], full
    assert full["read_only"] == 1 and full["status"] == "healthy", full
    assert full["reason"].startswith("no room for shard 0 in ") and full["live_shards"] == [1], full
    assert full["free_before"] <= LEFT_FREE, full
    back = seen["room_back"]
    assert back["refresh_error"] is None and back["run_id"] == "t2" and back["values_exact"], back
    assert back["read_only"] == 0 and back["reason"] is None and back["live_shards"] == [0, 1], back
    figure(tmpfs_bytes=TMPFS_BYTES, bytes_free_when_full=full["free_before"], layer_bytes=full["layer_bytes"],
           refreshes_failed=0, shards_served_read_only=full["read_only"], live_again_after_room=len(back["live_shards"]),
           values_checked=full["values_checked"] + back["values_checked"])


def _child(root: str, memory: str) -> None:
    """The reader's side, in the child process with ``memory`` a tmpfs of its own."""
    from airflow_provider_shardyfusion.core import scratch
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard

    scratch.MEMORY_DIR = memory  # the memory-backed folder: the small tmpfs mounted for this process
    by_shard = keys_by_shard(NUM_DBS, 250)
    keys = sorted(k for ks in by_shard.values() for k in ks)
    rng = random.Random(42)
    model = {k: b"t0" for k in keys}
    build_snapshot(root, list(model.items()), num_dbs=NUM_DBS, run_id="t0", shard_layout="sst")
    seen: dict[str, object] = {}
    with ShardedReader(root, ingest_refreshes=True) as reader:
        assert reader.multi_get(keys) == [model[k] for k in keys]
        assert sorted(s.db_id for s in reader.describe().live_shards) == [0, 1]

        def step(name: str, run_id: str, changes: dict[int, bytes]) -> None:
            delta = build_delta(root, changes, run_id=run_id)
            model.update(changes)
            free = scratch.free_bytes(memory)
            try:
                reader.refresh()
                error = None
            except Exception as exc:  # reported, and the test fails on it
                error = f"{type(exc).__name__}: {exc}"
            health = reader.health()
            layer_bytes = next(s for s in delta.manifest.shards if s.db_id == 0).layers[-1].byte_size
            seen[name] = {"refresh_error": error, "run_id": reader.run_id, "free_before": free,
                          "layer_bytes": layer_bytes, "values_exact": reader.multi_get(keys) == [model[k] for k in keys],
                          "values_checked": len(keys), "status": health.status,
                          # getattr: the test ran before these fields existed, to see it fail.
                          "read_only": getattr(health, "shards_read_only", None),
                          "reason": getattr(health, "read_only_reason", None),
                          "live_shards": sorted(s.db_id for s in reader.describe().live_shards)}

        # The folder fills after the reader opened (another process's files, say): 300 kB left.
        filler = Path(memory) / "filler"
        with filler.open("wb") as out:
            while scratch.free_bytes(memory) > LEFT_FREE:
                out.write(b"\0" * min(1 << 20, scratch.free_bytes(memory) - LEFT_FREE + 4096))
                out.flush()
        # Shard 0 gets about 1 MB of new values (random: they do not compress); shard 1 a little.
        step("full", "t1", {**{k: rng.randbytes(4000) for k in by_shard[0]}, by_shard[1][0]: b"t1"})
        filler.unlink()  # room comes back
        step("room_back", "t2", {k: b"t2" for k in keys[::7]})
    print(json.dumps(seen))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
