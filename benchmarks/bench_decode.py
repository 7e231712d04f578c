"""Decode benchmark (SPEC §17): a 100k-shard full manifest, bytes to a validated ``Manifest``, vs ``json.loads``.

Builds (untimed) a full manifest through the real model: ``--shards`` ``ShardEntry``s (default
99,999, the most a snapshot's five-digit shard folders allow) with one file each, encoded with
``Manifest.to_bytes()`` (~35 MB). Then, taking turns for ``--rounds`` rounds, times
``Manifest.from_bytes`` (msgspec decode, field checks, ``validate()``) and plain ``json.loads`` of
the same bytes, and reports the medians and their ratio against the target (<= 2x). The decoded
manifest must equal the one built. Pure core: no Spark, no storage. Prints ONE JSON line on
stdout; progress on stderr; exit status 1 if the decoded manifest differs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from importlib import metadata

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardFile, ShardingInfo

DECODE_MAX_RATIO = 2.0  # SPEC §17: bytes -> validated Manifest within 2x json.loads of the same bytes
ROOT = "s3://bench-bucket/snapshots/profiles"
RUN_ID = "20260101T000000Z-0000beef"


def _log(msg: str) -> None:
    print(f"[bench_decode] {msg}", file=sys.stderr, flush=True)


def build_manifest(shards: int) -> Manifest:
    entries = tuple(
        ShardEntry(db_id=i, db_url=layout.join(ROOT, layout.attempt_key(RUN_ID, i, 0, 1000 + i)), attempt=0,
                   task_attempt_id=1000 + i, row_count=10_000 + i, byte_size=1_000_000 + i,
                   min_key=f"{i:016x}", max_key=f"{i + 1:016x}",
                   files=(ShardFile("000001.sst", 1_000_000 + i, f"xxh3_128:{i:032x}"),))
        for i in range(shards))
    return Manifest(run_id=RUN_ID, created_at=datetime(2026, 1, 1, tzinfo=UTC), output_uri=ROOT, num_dbs=shards,
                    sharding=ShardingInfo(strategy="hash", key_column="user_id"), key_encoding="u64be",
                    value_format="json", shards=entries, value_columns=("name", "tier"),
                    stats={"rows": sum(e.row_count for e in entries)}, run_started_at=datetime(2026, 1, 1, tzinfo=UTC))


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=99_999)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (medians reported)")
    args, _ = parser.parse_known_args()  # run_all.py hands every benchmark the same arguments

    _log(f"building a manifest of {args.shards} shards")
    built = build_manifest(args.shards).validate()
    data = built.to_bytes()
    decoded = Manifest.from_bytes(data)  # warm-up, and the correctness check
    same = decoded == built
    decode_s, loads_s = [], []
    for i in range(args.rounds):
        loads_s.append(_seconds(lambda: json.loads(data)))
        decode_s.append(_seconds(lambda: Manifest.from_bytes(data)))
        _log(f"round {i + 1}: decode {decode_s[-1]:.3f} s, json.loads {loads_s[-1]:.3f} s")
    decode, loads = statistics.median(decode_s), statistics.median(loads_s)
    ratio = decode / loads
    result = {
        "benchmark": "decode", "shards": args.shards, "manifest_bytes": len(data), "rounds": args.rounds,
        "decode_s": round(decode, 3), "json_loads_s": round(loads, 3),
        "targets": {f"decode_le_{DECODE_MAX_RATIO:g}x_json_loads":
                    {"ratio": round(ratio, 3), "max": DECODE_MAX_RATIO, "pass": ratio <= DECODE_MAX_RATIO}},
        "decoded_equals_built": same, "msgspec": metadata.version("msgspec"),
        "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
