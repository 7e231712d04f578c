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


def _in_small_tmpfs(tmp_path: Path, mode: str) -> dict:
    """Run ``_child`` (``mode``) with an 8 MB tmpfs of its own; return what it saw."""
    mount = tmp_path / "shm"
    mount.mkdir()
    script = (f'mount -t tmpfs -o size={TMPFS_BYTES} shardyfusion-test "$0" && exec "$@"')
    proc = subprocess.run([*_unshare(), "sh", "-c", script, str(mount), sys.executable, __file__, mode,
                           f"file://{tmp_path}/root", str(mount)],
                          cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_follower_whose_folder_fills_during_an_ingestion_keeps_following(tmp_path, figure):
    """The room check passes, then the folder fills before the copy: the ingestion itself (and, a
    refresh later, the opening of a live shard) really fails with "No space left on device"."""
    seen = _in_small_tmpfs(tmp_path, "after-check")
    copy = seen["copy_fails"]
    # Before the fix, RocksDB's own copy left its part (all the room there was) in the live folder.
    assert copy["check_failures"] == 0 and copy["run_id"] == "t1" and copy["values_exact"], copy
    assert copy["read_only"] == 1 and copy["live_shards"] == [1], copy
    assert copy["reason"].startswith("no room for shard 0 in ") and "No space left on device" in copy["reason"], copy
    assert copy["live_bytes_after"] - copy["live_bytes_before"] < 64 << 10 < copy["room_left"], copy
    opening = seen["open_fails"]
    # Before the fix: the follower's refresh failed ("Unable to persist options … No space left").
    assert opening["check_failures"] == 0 and opening["run_id"] == "t2" and opening["values_exact"], opening
    assert opening["read_only"] == 2 and opening["live_shards"] == [], opening
    assert opening["reason"].startswith("no room for shard 0 in ") and "cannot open shard 0" in opening["reason"] \
        and "No space left on device" in opening["reason"], opening
    back = seen["room_back"]
    assert back["check_failures"] == 0 and back["run_id"] == "t3" and back["values_exact"], back
    assert back["read_only"] == 0 and back["live_shards"] == [0, 1] and back["held_exact"], back
    figure(tmpfs_bytes=TMPFS_BYTES, bytes_left_after_check=copy["room_left"], layer_bytes=copy["layer_bytes"],
           partial_copy_bytes_left=copy["live_bytes_after"] - copy["live_bytes_before"], follower_checks_failed=0,
           shards_read_only_after_failed_copy=copy["read_only"], after_failed_open=opening["read_only"],
           live_again_after_room=len(back["live_shards"]),
           values_checked=copy["values_checked"] + opening["values_checked"] + back["values_checked"])


def _child_after_check(root: str, memory: str) -> None:
    """The follower's side: the folder fills right after the live shards' room check reads it.

    The only injection: ``live_shards._free_bytes`` (the room check's reading of the folder's free
    space) returns what the file system says, then a filler file takes the room left — what another
    process writing there at that moment would do. The file system, RocksDB and its failure are real.
    """
    import gc
    import time

    from airflow_provider_shardyfusion.core import scratch
    from airflow_provider_shardyfusion.core.read import live_shards
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard

    scratch.MEMORY_DIR = memory
    filler = Path(memory) / "filler"
    fill_to: list[int] = []  # bytes to leave free right after the next room check
    read_free = live_shards._free_bytes

    def check_then_fill(folder: str) -> int:
        free = read_free(folder)
        if fill_to:
            left = fill_to.pop()
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                while (room := scratch.free_bytes(memory)) > left:
                    os.write(fd, b"\0" * min(1 << 20, room - left))
            except OSError:  # the last block rounded up: the folder is full
                pass
            finally:
                os.close(fd)
        return free

    live_shards._free_bytes = check_then_fill

    def live_bytes() -> int:  # what the live shards hold in the tmpfs (their linked SSTs take nothing)
        return sum(os.lstat(os.path.join(d, f)).st_blocks * 512
                   for d, _, names in os.walk(memory) for f in names if f != "filler")

    by_shard = keys_by_shard(NUM_DBS, 250)
    keys = sorted(k for ks in by_shard.values() for k in ks)
    model = {k: b"t0" for k in keys}
    build_snapshot(root, list(model.items()), num_dbs=NUM_DBS, run_id="t0", shard_layout="sst")
    seen: dict[str, object] = {}
    with ShardedReader(root, ingest_refreshes=True, follow_interval_s=0.1) as reader:
        assert reader.multi_get(keys) == [model[k] for k in keys]
        failed_checks = 0

        def step(name: str, run_id: str, changes: dict[int, bytes], left: int | None) -> None:
            nonlocal failed_checks
            before = live_bytes()
            if left is not None:
                fill_to.append(left)
            delta = build_delta(root, changes, run_id=run_id)
            model.update(changes)
            deadline = time.monotonic() + 60
            while reader.run_id != run_id and time.monotonic() < deadline:
                failed_checks += reader.health().last_error is not None
                time.sleep(0.02)
            gc.collect()  # the retired snapshot's live shards are dropped
            health = reader.health()
            shards = {s.db_id: s for s in reader.manifest.shards}
            served = reader.describe().live_shards
            live = reader._cache._live  # the room budget's own count has no public view
            seen[name] = {"check_failures": failed_checks + (health.last_error is not None), "run_id": reader.run_id,
                          "values_exact": reader.multi_get(keys) == [model[k] for k in keys],
                          "values_checked": len(keys), "read_only": health.shards_read_only,
                          "reason": health.read_only_reason, "room_left": left,
                          "layer_bytes": next(s for s in delta.manifest.shards if s.db_id == 0).layers[-1].byte_size,
                          "live_bytes_before": before, "live_bytes_after": live_bytes(),
                          # What the room budget counts as held: the live shards' bytes as opened (t3 opens both).
                          "held_exact": live._held.bytes == sum(shards[s.db_id].byte_size for s in served),
                          "live_shards": sorted(s.db_id for s in served)}

        rng = random.Random(7)
        # Shard 0 gets about 1 MB of new values (random: they do not compress): its copy cannot fit.
        step("copy_fails", "t1", {k: rng.randbytes(4000) for k in by_shard[0]}, 200_000)
        filler.unlink()
        # Shard 0, read-only in t1, is opened live again: its column family's options file cannot be written.
        step("open_fails", "t2", {by_shard[0][1]: b"t2", by_shard[1][1]: b"t2"}, 0)
        filler.unlink()
        step("room_back", "t3", {by_shard[0][2]: b"t3", by_shard[1][2]: b"t3"}, None)
    print(json.dumps(seen))


def test_a_follower_with_no_room_to_compact_a_live_shard_keeps_following(tmp_path, figure):
    """A live shard past ``max_local_layers`` whose compaction (a rewrite of the whole shard) does
    not fit in the folder is not compacted: it is served read-only from the cache, and health says
    why; with the room back a later refresh opens it live again, compacted."""
    seen = _in_small_tmpfs(tmp_path, "compaction")
    before = seen["under_bound"]
    assert before["refresh_error"] is None and before["values_exact"] and before["live_runs"] == 1, before
    full = seen["no_room"]
    # Before the fix: compacted though the room was missing, and counted so (RocksDB's error is lost).
    assert full["refresh_error"] is None and full["run_id"] == "t2" and full["values_exact"], full
    assert full["read_only"] == 1 and full["live_shards"] == [1] and full["status"] == "healthy", full
    assert full["reason"].startswith("no room for shard 0 in ") and "no room to compact its 2 sorted runs" \
        in full["reason"], full
    assert full["free_before"] < 2 * full["shard_bytes"], full
    back = seen["room_back"]
    assert back["refresh_error"] is None and back["run_id"] == "t3" and back["values_exact"], back
    assert back["read_only"] == 0 and back["reason"] is None and back["live_shards"] == [0, 1], back
    # Opened live again from its 4 layers, linked in: compacted (by the reader, or by RocksDB in the
    # background first: its live shards compact level 0 as it fills).
    assert back["live_runs"] == 1, back
    figure(tmpfs_bytes=TMPFS_BYTES, shard_bytes=full["shard_bytes"], bytes_free_when_full=full["free_before"],
           max_local_layers=1, sorted_runs_when_full=2, refreshes_failed=0, shards_read_only=full["read_only"],
           sorted_runs_after_room=back["live_runs"],
           values_checked=before["values_checked"] + full["values_checked"] + back["values_checked"])


def _child_compaction(root: str, memory: str) -> None:
    """The follower's side: shard 0 (about 1 MB, linked in at opening: it takes no room in the
    folder) takes one small layer a refresh; past one sorted run its live shard is compacted. The
    folder is filled (by a file, as another process would) before the second refresh: RocksDB's own
    background compaction of the new layer (its live shards compact level 0 as it fills) cannot
    run there either, so the shard is past the bound when the reader checks."""
    import gc
    import time

    from airflow_provider_shardyfusion.core import scratch
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard

    scratch.MEMORY_DIR = memory
    by_shard = keys_by_shard(NUM_DBS, 250)
    keys = sorted(k for ks in by_shard.values() for k in ks)
    rng = random.Random(11)
    # Random values do not compress: shard 0 is about 1 MB, more than half the room left below.
    model = {**{k: rng.randbytes(4000) for k in by_shard[0]}, **{k: b"t0" for k in by_shard[1]}}
    built = build_snapshot(root, list(model.items()), num_dbs=NUM_DBS, run_id="t0", shard_layout="sst")
    shard_bytes = next(s for s in built.manifest.shards if s.db_id == 0).byte_size
    seen: dict[str, object] = {}
    with ShardedReader(root, ingest_refreshes=True, max_local_layers=1) as reader:
        assert reader.multi_get(keys) == [model[k] for k in keys]

        def step(name: str, run_id: str, changes: dict[int, bytes]) -> None:
            build_delta(root, changes, run_id=run_id)
            model.update(changes)
            free = scratch.free_bytes(memory)
            error = _refresh_error(reader)
            health = reader.health()
            shard0 = next((s for s in reader.describe().live_shards if s.db_id == 0), None)
            seen[name] = {"refresh_error": error, "run_id": reader.run_id, "free_before": free,
                          "shard_bytes": shard_bytes, "values_exact": reader.multi_get(keys) == [model[k] for k in keys],
                          "values_checked": len(keys), "status": health.status,
                          "read_only": health.shards_read_only, "reason": health.read_only_reason,
                          "live_runs": shard0.sorted_runs if shard0 is not None else None,
                          "live_shards": sorted(s.db_id for s in reader.describe().live_shards)}

        step("under_bound", "t1", {by_shard[0][0]: b"t1", by_shard[1][0]: b"t1"})
        # The files t1's compaction replaced go once the retired snapshot does and RocksDB purges
        # them: fill only then, or their room (about the shard's) comes back for RocksDB's own compaction.
        gc.collect()
        filler = Path(memory) / "filler"
        with filler.open("wb") as out:
            for _ in range(100):
                while scratch.free_bytes(memory) > LEFT_FREE:
                    out.write(b"\0" * min(1 << 20, scratch.free_bytes(memory) - LEFT_FREE + 4096))
                    out.flush()
                time.sleep(0.02)
                if scratch.free_bytes(memory) <= LEFT_FREE:
                    break
        step("no_room", "t2", {by_shard[0][1]: b"t2", by_shard[1][1]: b"t2"})
        filler.unlink()  # room comes back
        step("room_back", "t3", {by_shard[0][2]: b"t3", by_shard[1][2]: b"t3"})
    print(json.dumps(seen))


def _refresh_error(reader) -> str | None:
    """Refresh ``reader``; what it raised, as text (reported by the child, and the test fails on it), or None."""
    try:
        reader.refresh()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


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
            error = _refresh_error(reader)
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
    if sys.argv[1] == "after-check":
        _child_after_check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "compaction":
        _child_compaction(sys.argv[2], sys.argv[3])
    else:
        _child(sys.argv[1], sys.argv[2])
