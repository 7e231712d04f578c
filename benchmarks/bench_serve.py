"""Serving benchmark (SPEC §19): the reader in a service. Prints ONE JSON line; progress on stderr.

One function per measurement, so others can be added next to them and chosen by ``main()``:

- ``follow_latency``: a follower (``follow_interval_s``) over ``--shards`` shards (1000 by default)
  with every shard open, as a busy service has them; a run is published (``_CURRENT`` moved) and
  the time until the follower serves it is measured, with no call from the user but reads, for a
  delta changing a few keys (``delta``) and for a full run (``full``: every shard is built again).
  Target: ≤ interval + 2 s.

Local ``file://`` root; snapshots built by ``tests/snapshot_factory.py`` (run with ``tests`` on
``PYTHONPATH``, as ``make bench`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

from snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store

FOLLOW_SLACK_S = 2.0  # SPEC §19: publish → served within the interval + 2 s


def _log(msg: str) -> None:
    print(f"[bench_serve] {msg}", file=sys.stderr, flush=True)


def _served_after(reader: ShardedReader, key: int, value: bytes, since: float, deadline_s: float) -> float:
    """Seconds from ``since`` until ``reader.get(key) == value``, reading as a service would (no refresh)."""
    while time.monotonic() - since < deadline_s:
        if reader.get(key) == value:
            return time.monotonic() - since
        time.sleep(0.005)
    raise TimeoutError(f"the follower did not serve the new run within {deadline_s}s")


def follow_latency(shards: int, interval_s: float, rounds: int) -> dict[str, Any]:
    """Publish → served, for deltas and full runs on a follower holding every shard open."""
    keys = keys_by_shard(shards, 2)
    probe = [shard_keys[0] for shard_keys in keys.values()]  # one key a shard: opens every shard
    out: dict[str, Any] = {"shards": shards, "follow_interval_s": interval_s, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = f"file://{tmp}/root"
        rows = [(k, b"v0") for shard_keys in keys.values() for k in shard_keys]
        started = time.monotonic()
        build_snapshot(root, rows, num_dbs=shards, run_id="r000", shard_layout="sst")
        out["build_s"] = round(time.monotonic() - started, 1)
        store = open_store(root)
        latencies: dict[str, list[float]] = {"delta": [], "full": []}
        with ShardedReader(root, follow_interval_s=interval_s, cache_dir=f"{tmp}/cache") as reader:
            reader.multi_get(probe)
            for n in range(1, rounds + 1):
                for kind in ("delta", "full"):
                    run_id = f"r{n:02d}{kind[0]}"
                    value = run_id.encode()
                    if kind == "delta":
                        built = build_delta(root, {probe[n % shards]: run_id}, run_id=run_id, publish=False)
                        key = probe[n % shards]
                    else:
                        built = build_snapshot(root, [(k, value) for k, _ in rows], num_dbs=shards, run_id=run_id,
                                               shard_layout="sst", publish=False)
                        key = probe[-1]
                    since = time.monotonic()
                    publish_current(store, built.manifest_key, run_id)
                    latencies[kind].append(_served_after(reader, key, value, since, deadline_s=120))
                    reader.multi_get(probe)  # every shard open again, as before the next publish
                    _log(f"{kind} {run_id}: served after {latencies[kind][-1]:.2f}s")
    target = interval_s + FOLLOW_SLACK_S
    for kind, values in latencies.items():
        out[f"{kind}_served_after_s"] = {"median": round(statistics.median(values), 3), "max": round(max(values), 3),
                                         "all": [round(v, 3) for v in values]}
        out[f"{kind}_within_interval_plus_2s"] = max(values) <= target
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--follow-interval-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    figures: dict[str, Any] = {"benchmark": "serve"}
    _log(f"follow latency on {args.shards} shards, interval {args.follow_interval_s}s, {args.rounds} rounds")
    figures["follow"] = follow_latency(args.shards, args.follow_interval_s, args.rounds)
    figures.update(python=platform.python_version(), cpu_count=os.cpu_count(), loadavg_1m_after=round(os.getloadavg()[0], 2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
