"""Read benchmark (SPEC §10): ShardedReader versus raw rocksdict on the same shard files.

Builds (untimed) a snapshot of ``--keys`` int keys with ~``--value-bytes`` values in ``--shards``
shards on a local ``file://`` root, then measures on one thread, warm (every shard downloaded,
opened and read once):

- ``get``: latency p50/p99 in µs over ``--lookups`` random existing keys;
- ``multi_get``: keys/s over batches of ``--batch`` random existing keys;
- typed ``get`` (SPEC §18): p50 of ``get`` on a JSON snapshot of four value columns (a 40-char
  string, an int, a double, a UTC timestamp; the engine encoder's bytes, ``value_schema`` in the
  manifest) through the default ``value_decoding="typed"``, beside raw rocksdict ``get`` on the
  same shard files (target <= 1.5x), and ``value_decoding="json"`` (``json.loads``) for reference;
- first ``get`` on a fresh cache (construct the reader, one shard fetched and opened) and every
  shard opened once, for 16 and 256 shards of ``--first-get-keys`` keys, for each shard layout
  ("sst": the SST files the writer ships, ingested by the reader; "db": a database folder); the
  every-shard time of "sst" over "db" is a SPEC §13 target (<= 1.2x).

The raw baseline opens the very files the reader cached, read-only in raw mode, and routes and
encodes keys the same way (xxh3_64 of the signed little-endian key mod num_dbs; u64be key), so
the difference is the reader's own overhead. Prints ONE JSON line on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import struct
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import TYPE_CHECKING

import xxhash
from rocksdict import AccessType, Options, Rdict
from snapshot_factory import build_snapshot

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.manifest import SHARD_LAYOUTS
from airflow_provider_shardyfusion.core.model.value_schema import (
    VALUE_ENCODING_ENGINE,
    ValueField,
    ValueSchema,
    ValueType,
)
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.write.shard_builder import WRITER_SHARD_LAYOUT

if TYPE_CHECKING:
    from collections.abc import Callable

GET_P50_MAX_RATIO = 1.5  # SPEC §10
TYPED_GET_P50_MAX_RATIO = 1.5  # SPEC §18: typed get p50 / raw rocksdict get p50
SST_OPEN_MAX_RATIO = 1.2  # SPEC §13: every shard opened on a fresh cache, "sst" layout / "db" layout
MULTI_GET_MIN_KEYS_PER_S = 200_000


def _log(msg: str) -> None:
    print(f"[bench_read] {msg}", file=sys.stderr, flush=True)


def _value(key: int, size: int) -> bytes:
    head = b"%020d|" % key
    return (head * (size // len(head) + 1))[:size]


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000.0


def _time_each(fn, keys) -> list[int]:
    clock = time.perf_counter_ns
    out = [0] * len(keys)
    for i, key in enumerate(keys):
        start = clock()
        fn(key)
        out[i] = clock() - start
    return out


def _open_raw(cache: str, built) -> dict[int, Rdict]:
    """The shard files the reader cached, opened read-only in raw mode."""
    return {s.db_id: Rdict(layout.local_cache_dir(cache, built.run_id, s.db_id), Options(raw_mode=True),
                           access_type=AccessType.read_only(False))
            for s in built.manifest.shards}


def _raw_getter(raw: dict[int, Rdict], n_dbs: int) -> Callable[[int], bytes | None]:
    """``get`` on raw rocksdict, routed and encoded as the reader does (xxh3_64 of the signed
    little-endian key mod num_dbs; u64be key)."""
    xxh3 = xxhash.xxh3_64_intdigest
    pack_le = struct.Struct("<q").pack
    pack_be = struct.Struct(">Q").pack

    def raw_get(key: int) -> bytes | None:
        return raw[xxh3(pack_le(key)) % n_dbs].get(pack_be(key))

    return raw_get


def _time_turns(sides: dict[str, tuple[Callable[[int], object], list[int]]]) -> dict[str, list[int]]:
    """Sorted ns per ``get`` of each side over its keys, the sides taking turns chunk by chunk
    (alternating who goes first) so that all see the same machine load."""
    out: dict[str, list[int]] = {name: [] for name in sides}
    order = list(sides)
    n_keys = len(next(iter(sides.values()))[1])
    for n, start in enumerate(range(0, n_keys, 1000)):
        for name in order if n % 2 == 0 else order[::-1]:
            fn, keys = sides[name]
            out[name] += _time_each(fn, keys[start:start + 1000])
    for times in out.values():
        times.sort()
    return out


def _typed_value(key: int, at: datetime) -> bytes:
    """Four value columns as the engine encoder stores them (sorted, compact, UTC with microseconds)."""
    text = (b"%020d" % key * 2).decode()
    stamp = (at + timedelta(seconds=key, microseconds=key % 1_000_000)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"at": stamp, "n": key, "s": text, "x": key / 7},
                      separators=(",", ":"), sort_keys=True).encode()


TYPED_SCHEMA = ValueSchema((ValueField("s", ValueType("string")), ValueField("n", ValueType("int64")),
                            ValueField("x", ValueType("double")), ValueField("at", ValueType("timestamp"))))


def _typed_get(tmp: str, args: argparse.Namespace, draw: Callable[[int], list[int]]) -> dict[str, object]:
    """p50 of typed and json ``get`` on a JSON snapshot of four columns, and of raw rocksdict on its files."""
    root, cache = f"file://{tmp}/typed", os.path.join(tmp, "cache-typed")
    at = datetime(2024, 1, 2, tzinfo=UTC)
    _log(f"building {args.keys} keys of four JSON value columns in {args.shards} shards (untimed)")
    built = build_snapshot(root, ((k, _typed_value(k, at)) for k in range(args.keys)), num_dbs=args.shards,
                           key_column="id", value_format="json", value_schema=TYPED_SCHEMA,
                           value_encoding_version=VALUE_ENCODING_ENGINE, encode_value=bytes,
                           shard_layout=args.shard_layout)
    warmup = draw(args.lookups)
    with ShardedReader(root, cache_dir=cache) as typed, ShardedReader(root, cache_dir=cache,
                                                                      value_decoding="json") as as_json:
        _log("warming the typed reader (download, open, one full pass)")
        for k in warmup:
            typed.get(k)
            as_json.get(k)
        raw = _open_raw(cache, built)
        raw_get = _raw_getter(raw, args.shards)
        for k in warmup:
            raw_get(k)
        probe = typed.get(warmup[0])
        assert probe["n"] == warmup[0], probe
        assert probe["at"].tzinfo is UTC, probe
        assert all(raw_get(k) == _typed_value(k, at) for k in warmup[:1000])
        _log(f"timing typed, json and raw get over {args.lookups} keys each")
        times = _time_turns({"typed": (typed.get, draw(args.lookups)), "json": (as_json.get, draw(args.lookups)),
                             "raw": (raw_get, draw(args.lookups))})
        for db in raw.values():
            db.close()
    p50 = {side: _percentile(ns, 0.50) for side, ns in times.items()}
    return {"typed_get_p50_us": round(p50["typed"], 3), "typed_get_p99_us": round(_percentile(times["typed"], 0.99), 3),
            "json_get_p50_us": round(p50["json"], 3), "typed_raw_get_p50_us": round(p50["raw"], 3),
            "typed_get_p50_ratio": round(p50["typed"] / p50["raw"], 3),
            "json_get_p50_ratio": round(p50["json"] / p50["raw"], 3)}


def _sst_open_target(by_layout: dict[str, dict[str, float]]) -> dict[str, object]:
    ratio = by_layout["sst"]["every_shard_opened_s"] / by_layout["db"]["every_shard_opened_s"]
    return {"ratio": round(ratio, 3), "max": SST_OPEN_MAX_RATIO, "pass": ratio <= SST_OPEN_MAX_RATIO}


def _first_get(tmp: str, num_dbs: int, keys: int, value_bytes: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per layout: median seconds to the first get, and to one get in every shard, on fresh caches."""
    out: dict[str, dict[str, float]] = {}
    probe = {}  # one existing key per shard
    for k in range(keys):
        probe.setdefault(xxhash.xxh3_64_intdigest(struct.pack("<q", k)) % num_dbs, k)
        if len(probe) == num_dbs:
            break
    for shard_layout in SHARD_LAYOUTS:
        root = f"file://{tmp}/first-{num_dbs}-{shard_layout}"
        build_snapshot(root, ((k, _value(k, value_bytes)) for k in range(keys)), num_dbs=num_dbs, key_column="id",
                       shard_layout=shard_layout)
        first, every = [], []
        for r in range(rounds):
            cache = os.path.join(tmp, f"cache-first-{num_dbs}-{shard_layout}-{r}")
            t0 = time.perf_counter()
            with ShardedReader(root, cache_dir=cache) as reader:
                assert reader.get(probe[0]) == _value(probe[0], value_bytes)
                first.append(time.perf_counter() - t0)
                assert reader.multi_get(list(probe.values())) == [_value(k, value_bytes) for k in probe.values()]
                every.append(time.perf_counter() - t0)
        out[shard_layout] = {"first_get_s": round(sorted(first)[rounds // 2], 4),
                             "every_shard_opened_s": round(sorted(every)[rounds // 2], 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--shard-layout", choices=SHARD_LAYOUTS, default=WRITER_SHARD_LAYOUT,
                    help="layout of the snapshot timed for get/multi_get (default: what the writer ships)")
    ap.add_argument("--first-get-keys", type=int, default=200_000, help="keys of the 16/256-shard first-get snapshots")
    ap.add_argument("--first-get-rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    n_dbs = args.shards

    with tempfile.TemporaryDirectory(prefix="shardyfusion-bench-read-") as tmp:
        root = f"file://{tmp}/snap"
        _log(f"building {args.keys} keys in {n_dbs} shards under {root} (untimed)")
        t0 = time.perf_counter()
        built = build_snapshot(root, ((k, _value(k, args.value_bytes)) for k in range(args.keys)),
                               num_dbs=n_dbs, key_column="id", work_dir=os.path.join(tmp, "work"),
                               shard_layout=args.shard_layout)
        os.rmdir(os.path.join(tmp, "work"))
        build_s = time.perf_counter() - t0
        # Reader and raw each get their own random keys (same distribution): reading the very keys
        # the other side has just read would run from warm CPU caches and flatter whoever goes second.
        def draw(n: int) -> list[int]:
            return [rng.randrange(args.keys) for _ in range(n)]

        warmup = draw(args.lookups)
        lookups = {"reader": draw(args.lookups), "raw": draw(args.lookups)}
        batches = {side: [draw(args.batch) for _ in range(args.batches)] for side in ("reader", "raw")}
        cache = os.path.join(tmp, "cache")

        with ShardedReader(root, cache_dir=cache) as reader:
            _log("warming the reader (download, open, one full pass)")
            for k in warmup:
                reader.get(k)
            assert all(reader.get(k) == _value(k, args.value_bytes) for k in warmup[:1000])

            # raw rocksdict on the same cached files, routed and encoded the same way
            raw = _open_raw(cache, built)
            raw_get = _raw_getter(raw, n_dbs)
            xxh3 = xxhash.xxh3_64_intdigest
            pack_le = struct.Struct("<q").pack
            pack_be = struct.Struct(">Q").pack

            def raw_multi_get(keys: list[int]) -> list[bytes | None]:
                groups: dict[int, tuple[list[int], list[bytes]]] = {}
                for i, key in enumerate(keys):
                    db_id = xxh3(pack_le(key)) % n_dbs
                    group = groups.get(db_id)
                    if group is None:
                        groups[db_id] = ([i], [pack_be(key)])
                    else:
                        group[0].append(i)
                        group[1].append(pack_be(key))
                out: list[bytes | None] = [None] * len(keys)
                for db_id, (positions, stored) in groups.items():
                    for i, value in zip(positions, raw[db_id].get(stored), strict=False):
                        out[i] = value
                return out

            for k in warmup:
                raw_get(k)
            assert all(raw_get(k) == reader.get(k) for k in warmup[:1000])
            assert raw_multi_get(warmup[:1000]) == reader.multi_get(warmup[:1000])

            _log(f"timing get over {args.lookups} keys each")
            times = _time_turns({"reader": (reader.get, lookups["reader"]), "raw": (raw_get, lookups["raw"])})
            reader_ns, raw_ns = times["reader"], times["raw"]

            _log(f"timing multi_get over {args.batches} batches of {args.batch} each")
            clock = time.perf_counter_ns
            spent = {"reader": 0, "raw": 0}
            calls = {"reader": reader.multi_get, "raw": raw_multi_get}
            for n in range(args.batches):
                for side in ("reader", "raw") if n % 2 == 0 else ("raw", "reader"):
                    t0 = clock()
                    calls[side](batches[side][n])
                    spent[side] += clock() - t0
            total = args.batches * args.batch
            reader_mg_s, raw_mg_s = spent["reader"] / 1e9, spent["raw"] / 1e9
            for db in raw.values():
                db.close()

        typed = _typed_get(tmp, args, draw)

        first_get = {}
        for shards in (16, 256):
            _log(f"timing the first get on a fresh cache, {shards} shards, layouts {list(SHARD_LAYOUTS)}")
            first_get[str(shards)] = _first_get(tmp, shards, args.first_get_keys, args.value_bytes,
                                                args.first_get_rounds)

    reader_p50, raw_p50 = _percentile(reader_ns, 0.50), _percentile(raw_ns, 0.50)
    reader_mg = total / reader_mg_s
    result = {
        "benchmark": "read",
        "keys": args.keys, "num_dbs": n_dbs, "value_bytes": args.value_bytes, "shard_layout": args.shard_layout,
        "get_lookups": args.lookups, "multi_get_batch": args.batch, "multi_get_batches": args.batches,
        "reader_get_p50_us": round(reader_p50, 3), "reader_get_p99_us": round(_percentile(reader_ns, 0.99), 3),
        "raw_get_p50_us": round(raw_p50, 3), "raw_get_p99_us": round(_percentile(raw_ns, 0.99), 3),
        "get_p50_ratio": round(reader_p50 / raw_p50, 3),
        **typed,
        "reader_multi_get_keys_per_s": round(reader_mg),
        "raw_multi_get_keys_per_s": round(total / raw_mg_s),
        "targets": {
            f"get_p50_within_{GET_P50_MAX_RATIO:g}x_raw": reader_p50 <= GET_P50_MAX_RATIO * raw_p50,
            f"typed_get_p50_within_{TYPED_GET_P50_MAX_RATIO:g}x_raw":
                typed["typed_get_p50_ratio"] <= TYPED_GET_P50_MAX_RATIO,
            f"multi_get_at_least_{MULTI_GET_MIN_KEYS_PER_S}_keys_per_s": reader_mg >= MULTI_GET_MIN_KEYS_PER_S,
            **{f"sst_fresh_open_{n}_shards_le_{SST_OPEN_MAX_RATIO:g}x_db": _sst_open_target(first_get[n])
               for n in first_get},
        },
        "fresh_cache_by_shards": {"keys": args.first_get_keys, "rounds_median_of": args.first_get_rounds,
                                  **first_get},
        "build_s": round(build_s, 1),
        "python": platform.python_version(), "rocksdict": metadata.version("rocksdict"),
        "cpu_count": os.cpu_count(),
        # other work on the machine moves every figure above; this says how busy it was
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
