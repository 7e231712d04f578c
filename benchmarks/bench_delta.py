"""Delta benchmark (SPEC §13): publish the change, not the table; ratios within one Spark session.

One Spark session on local[2], a local ``file://`` root under a temp dir, in this order:

1. full write of the base: ``--rows`` int64 keys (scrambled order, ~100-byte values, the input
   bench_write.py generates, untimed) in ``--num-dbs`` shards;
2. a follower (``ShardedReader(ingest_refreshes=True)`` where its shards fit: shards served from live databases, into
   which a refresh ingests the new layers) opens the base with every shard opened (before the delta);
3. a delta of ``--delta-pct`` % of the keys: half updates of existing keys, a quarter inserts of
   new keys, a quarter deletes of existing keys (the delta's parquet is written untimed).
   Delta write time / full write time;
4. ``refresh()`` of that reader: bytes downloaded / (the delta's layer bytes + its manifest bytes),
   and refresh time / time to open the new snapshot fresh (empty cache, every shard opened, by a
   default read-only reader); a live follower's shards merge the ingested layers in RocksDB's
   background threads after the swap, so the fresh open, the compaction and the timed gets each
   wait until this process is idle (``settled_s`` in the output says how long);
5. how the writer learns whether a changed key existed (each task ingests the key indexes of the
   base shards it writes, ``keys-00000.sst`` of every layer: keys with empty values and tombstones,
   verified, into one local database, ``core.write.delta.TaskBase``, and does one RocksDB MultiGet
   per shard of its changed keys; the values are never downloaded, unless a layer predates key
   indexes: then its data is read instead): replayed here with
   ``TaskBase`` itself, one per task as the job splits the shards, untimed in the ratios, split
   into download + ingest and the MultiGet (summed over the tasks), with the bytes it read next to
   the base's data bytes;
6. 7 more deltas of ``--chain-delta-pct`` % each (same mix) up to a chain of depth 8, then
   ``write_mode="compact"``: compaction time / full write time, and ``get`` p50 over random
   existing keys on the depth-8 chain versus the compacted snapshot (one thread, warm readers,
   taking turns of 1000 keys so a drift of the machine falls on each alike; the readers of one
   process share its open-files limit, three quarters of which the bench may use, so a reader whose
   descriptors would leave too little for the next is timed alone and closed first). The chain is
   read by the reader that refreshed along it (live where its shards' descriptors fit) and by a
   fresh one (default: a shard's local database is compacted past ``max_local_layers``; the target
   holds for the slower of the two), and, for the figure only, by a fresh reader keeping every
   layer (``max_local_layers=None``) where its files fit (not at 4000 shards under a limit of 20000);
7. correctness, cheaply: every manifest's rows (and each delta's inserted/updated/deleted) equal
   the counts this script expects from the changes it made; sampled deleted keys read None and
   sampled updated / inserted keys read their newest value, on the chain and on the compacted
   snapshot.

At scale (SPEC §17): ``--num-dbs 1000`` and ``--num-dbs 4000`` run the same ratios on the same 10M
rows (10,000 and 2,500 a shard; ``--rows`` overrides). With fewer rows a shard, the full write
itself is bound by what every shard costs (its folders and files in the root, its task work), not by
its data, and the ratios then measure one per-shard cost against another.

An optional warm-up (a small full write, delta and compaction on a scratch root) runs first so the
timed full write is not the first job of the JVM. Prints ONE JSON line on stdout; progress on
stderr. Exit status 1 if a correctness check failed (the JSON line is printed all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_write import generate

from airflow_provider_shardyfusion.core import scratch
from airflow_provider_shardyfusion.core.model.encoding import encode_key
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.live_shards import LIVE_CF_FILES, live_fixed_files
from airflow_provider_shardyfusion.core.read.reader import (
    ShardedReader,
    default_max_open_files,
    default_max_open_shards,
)
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.write.delta import Change, TaskBase, base_exists

# SPEC §13 targets (ratios within this run)
DELTA_WRITE_MAX = 0.2  # delta write / full write
REFRESH_BYTES_MAX = 1.5  # refresh bytes / (delta layer bytes + manifest bytes)
REFRESH_TIME_MAX = 0.2  # refresh() / opening the new snapshot fresh
CHAIN_GET_P50_MAX = 1.3  # get p50 on a depth-8 chain / on the compacted snapshot
COMPACT_MAX = 1.0  # compaction / full write
CHAIN_DEPTH = 8
VALUE_BYTES = 100  # bench_write.generate's payload length
FULL_ROWS = 10_000_000  # SPEC §13's base, at every shard count
WARMUP_MAX_DBS = 16  # the warm-up starts the JVM and every code path; more shards warm nothing more
TURN_KEYS = 1000  # get calls a reader makes in its turn when readers are timed by turns


def _log(msg: str) -> None:
    print(f"[bench_delta] {msg}", file=sys.stderr, flush=True)


def _value(step: int, key: int) -> str:
    head = f"d{step:02d}-{key:020d}|"
    return (head * (VALUE_BYTES // len(head) + 1))[:VALUE_BYTES]


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000.0


def _settle(what: str, *, idle_share: float = 0.05, window_s: float = 0.5, limit_s: float = 300.0) -> float:
    """Wait until this process (whose threads include RocksDB's background merges of the live
    follower) uses under ``idle_share`` of a core, so that work falls on no timed phase; the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        cpu = time.process_time()
        time.sleep(window_s)
        if time.process_time() - cpu < idle_share * window_s:
            break
    waited = time.perf_counter() - t0
    _log(f"settled before {what} after {waited:.1f}s")
    return waited


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _target(ratio: float, limit: float) -> dict:
    return {"ratio": round(ratio, 3), "max": limit, "pass": ratio <= limit}


class Model:
    """What the snapshot must hold, from the changes this script made: live keys, newest values of changed keys."""

    def __init__(self, rows: int, rng: np.random.Generator):
        self.rng = rng
        self.base_rows = rows
        self.alive = np.ones(rows, dtype=bool)  # grown for inserted keys
        self.next_new = rows  # generate() writes exactly the keys [0, rows)
        self.latest: dict[int, str] = {}  # key -> newest value, for keys a delta upserted
        self.deleted: set[int] = set()

    @property
    def rows(self) -> int:
        return int(self.alive.sum())

    def live_keys(self, n: int) -> np.ndarray:
        return self.rng.choice(np.flatnonzero(self.alive), size=n, replace=False)

    def delta(self, step: int, n: int) -> tuple[pa.Table, dict[str, int]]:
        """A change of ``n`` keys: half updates, a quarter inserts, a quarter deletes; applied to the model."""
        n_upd, n_ins = n // 2, n // 4
        n_del = n - n_upd - n_ins
        picked = self.live_keys(n_upd + n_del)
        upd, dele = picked[:n_upd], picked[n_upd:]
        ins = np.arange(self.next_new, self.next_new + n_ins, dtype=np.int64)
        self.next_new += n_ins
        self.alive = np.concatenate([self.alive, np.ones(n_ins, dtype=bool)])
        self.alive[dele] = False
        upserts = np.concatenate([upd, ins]).astype(np.int64)
        values = [_value(step, int(k)) for k in upserts]
        for k, v in zip(upserts.tolist(), values, strict=True):
            self.latest[k] = v
        for k in dele.tolist():
            self.deleted.add(k)
            self.latest.pop(k, None)
        keys = np.concatenate([upserts, dele.astype(np.int64)])
        order = self.rng.permutation(len(keys))  # input order does not follow the kind of change
        payload = values + [None] * len(dele)
        table = pa.table({
            "id": pa.array(keys[order], pa.int64()),
            "payload": pa.array([payload[i] for i in order.tolist()], pa.string()),
            "deleted": pa.array(np.concatenate([np.zeros(len(upserts), bool), np.ones(len(dele), bool)])[order]),
        })
        return table, {"puts": n_upd + n_ins, "deletes": n_del, "inserted": n_ins, "updated": n_upd,
                       "deleted": n_del, "deleted_absent": 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=FULL_ROWS, help="base rows")
    ap.add_argument("--num-dbs", type=int, default=16, help="shards of the base, e.g. 1000 and 4000 (SPEC §17)")
    ap.add_argument("--delta-pct", type=float, default=1.0, help="keys changed by the measured delta, in %% of --rows")
    ap.add_argument("--chain-delta-pct", type=float, default=0.1,
                    help="keys changed by each of the 7 further deltas of the chain, in %% of --rows")
    ap.add_argument("--lookups", type=int, default=100_000, help="get calls timed per snapshot (chain, compacted)")
    ap.add_argument("--check-sample", type=int, default=2000, help="deleted / updated / inserted keys read back each")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--warmup", choices=["true", "false"], default="true",
                    help="a small full write, delta and compaction on a scratch root first (untimed)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--value-format", choices=["binary", "json"], default="binary",
                    help="json: the payload column as a JSON value (SPEC §18's engine encoder, typed reads)")
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.spark_jobs.driver import DELTA_TASKS_PER_CORE, run_write
    from airflow_provider_shardyfusion.spark_jobs.session_info import default_parallelism
    from airflow_provider_shardyfusion.spark_jobs.shard_task import shards_of_task

    rng = np.random.default_rng(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardyfusion-bench-delta-"))
    work.mkdir(parents=True, exist_ok=True)
    root = f"file://{work}/root"
    store = open_store(root)
    snapshots = SnapshotRoot(store)
    errors: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            errors.append(what)
            _log(f"CHECK FAILED: {what}")

    spark = (SparkSession.builder.master("local[2]").appName("bench-delta")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.num_dbs)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def write(output_uri: str, **kw) -> tuple[float, dict]:
        values: dict = {"value_column": "payload"}
        if args.value_format == "json":  # a chain inherits the base's format
            values = {"value_columns": ["payload"], **({} if kw.get("write_mode") else {"value_format": "json"})}
        cfg = build_write_config(output_uri=output_uri, key_column="id", **values, **kw)
        t0 = time.perf_counter()
        record = run_write(spark, cfg)
        return time.perf_counter() - t0, record

    def write_delta(output_uri: str, table: pa.Table, name: str, run_id: str) -> tuple[float, dict]:
        path = str(work / f"{name}.parquet")
        pq.write_table(table, path)
        return write(output_uri, input_path=path, write_mode="delta", delete_column="deleted", run_id=run_id)

    def live_manifest():
        pointer = snapshots.current()
        assert pointer is not None
        size = len(store.get(store.key_of(pointer.manifest_ref)).data)
        return snapshots.read_manifest(pointer), size

    # The readers of this process share one open-files limit. The defaults (an eighth of it for
    # shards, a quarter for files) suit a few readers of fewer shards; at 4000 shards they made every
    # timed reader close and reopen shards between look-ups. So the readers together may keep all
    # their shards open (twice as many for the follower: old and new snapshot during a refresh) in
    # three quarters of the limit; those that do not fit together are timed alone (see read_and_time).
    files_budget = 3 * default_max_open_files()

    # Readers kept open to be timed by turns hold at most half the budget together (see read_and_time),
    # and each reader opened beside them may use the rest.
    baseline_descriptors = _open_descriptors()

    def open_every_shard(cache: str | None = None, *, shards: int = args.num_dbs, **kw) -> tuple[float, ShardedReader]:
        t0 = time.perf_counter()
        held = _open_descriptors() - baseline_descriptors
        reader = ShardedReader(root, cache_dir=cache, max_open_shards=max(default_max_open_shards(), shards),
                               max_open_files=files_budget - held, **kw)
        for shard in reader.manifest.shards:
            reader.open_shard(shard.db_id)
        return time.perf_counter() - t0, reader

    def check_manifest(manifest, expected_rows: int, counts: dict[str, int] | None, what: str) -> None:
        check(manifest.row_count == expected_rows, f"{what}: manifest rows {manifest.row_count} != {expected_rows}")
        check(manifest.stats.get("rows") == expected_rows,
              f"{what}: stats rows {manifest.stats.get('rows')} != {expected_rows}")
        if counts is not None:
            got = {k: manifest.stats.get(k) for k in counts}
            layers = [la for s in manifest.shards for la in s.layers if la.run_id == manifest.run_id]
            from_layers = {k: sum(getattr(la, k) for la in layers) for k in counts}
            check(got == counts, f"{what}: stats counts {got} != {counts}")
            check(from_layers == counts, f"{what}: layer counts {from_layers} != {counts}")

    # -- warm-up: every code path once, on a scratch root (untimed) ---------------------------------
    src = str(work / "input")
    if args.warmup == "true":
        _log("warm-up: small full write, delta and compaction on a scratch root")
        wrows = max(1000, args.rows // 100)
        generate(spark, str(work / "warm-input"), wrows)
        warm_root = f"file://{work}/warm-root"
        write(warm_root, input_path=str(work / "warm-input"), num_dbs=min(args.num_dbs, WARMUP_MAX_DBS))
        table, _ = Model(wrows, np.random.default_rng(0)).delta(1, max(4, wrows // 100))
        write_delta(warm_root, table, "warm-delta", "warm-delta")
        write(warm_root, write_mode="compact")
        shutil.rmtree(work / "warm-input", ignore_errors=True)
        shutil.rmtree(work / "warm-root", ignore_errors=True)

    # -- 1. full write of the base ---------------------------------------------------------------
    _log(f"generating {args.rows} rows (untimed)")
    generate(spark, src, args.rows)
    model = Model(args.rows, rng)
    _log(f"full write of {args.rows} rows in {args.num_dbs} shards")
    full_s, full_record = write(root, input_path=src, num_dbs=args.num_dbs, run_id="base")
    base, base_manifest_bytes = live_manifest()
    check_manifest(base, model.rows, None, "base")
    _log(f"full write: {full_s:.2f}s, {base.byte_size} bytes")

    # -- 2. a reader on the base, every shard opened, before the delta ------------------------------
    # A live shard holds one descriptor besides its SST files (two: the base and the measured
    # delta's layer), and each live database of up to 16 shards six: past the budget the follower
    # would reopen shards on every few look-ups, so it is live only where its shards fit.
    live_files = args.num_dbs * (LIVE_CF_FILES + 2) + live_fixed_files(args.num_dbs)
    follower_live = live_files <= files_budget
    if not follower_live:
        _log(f"follower not live: {args.num_dbs} live shards need ~{live_files} descriptors > {files_budget}")
    base_open_s, follower = open_every_shard(str(work / "cache-follow"), shards=2 * args.num_dbs,
                                              ingest_refreshes=follower_live)
    _log(f"base opened fresh (every shard): {base_open_s:.2f}s")

    # -- 3. the measured delta -------------------------------------------------------------------
    n_delta = max(4, round(args.rows * args.delta_pct / 100))
    table, counts = model.delta(1, n_delta)
    _log(f"delta of {n_delta} keys ({counts})")
    delta_s, delta_record = write_delta(root, table, "delta01", "delta01")
    delta, delta_manifest_bytes = live_manifest()
    check_manifest(delta, model.rows, counts, "delta01")
    check(delta.chain_depth == 1, f"delta01: chain_depth {delta.chain_depth}")
    delta_layer_bytes = delta.layer_bytes(delta.run_id)
    _log(f"delta write: {delta_s:.2f}s, layer bytes {delta_layer_bytes}")

    # -- 4. refresh vs opening the new snapshot fresh ------------------------------------------------
    t0 = time.perf_counter()
    swapped = follower.refresh()
    refresh_s = time.perf_counter() - t0
    report = follower.last_refresh
    check(swapped and report is not None and follower.run_id == "delta01", "refresh did not swap to delta01")
    settled = {"fresh_open": _settle("the fresh open")}
    fresh_open_s, fresh = open_every_shard(str(work / "cache-fresh-delta01"))
    fresh.close()
    shutil.rmtree(work / "cache-fresh-delta01", ignore_errors=True)
    refresh_bytes = report.bytes_downloaded if report else 0
    _log(f"refresh: {refresh_s:.2f}s, {refresh_bytes} bytes; fresh open: {fresh_open_s:.2f}s")

    # -- 5. the writer's existence check, replayed (untimed in the ratios) ---------------------------
    changed = table.column("id").to_pylist()
    by_shard: dict[int, list[Change]] = {}
    for key in changed:
        by_shard.setdefault(route_key(key, base.num_dbs), []).append(Change(encode_key(key, base.key_encoding), b""))
    # As the job's tasks do it: the shards split into its tasks' ranges, one TaskBase per task (one
    # database of its shards' key indexes, in memory where there is room), shards in id order.
    # One database for every shard would be slower than any task: a look-up visits each file ingested.
    num_tasks = min(base.num_dbs, default_parallelism(spark) * DELTA_TASKS_PER_CORE)
    base_shards_s = multiget_s = 0.0
    found = bytes_read = 0
    for task in range(num_tasks):
        folder = scratch.memory_workdir(0, 1, prefix="bench-existence-") or tempfile.mkdtemp(prefix="bench-existence-")
        replay = TaskBase(store, base, folder)
        try:
            for db_id in shards_of_task(task, base.num_dbs, num_tasks):
                if db_id not in by_shard:
                    continue
                t0 = time.perf_counter()
                db = replay.shard_db(db_id)
                t1 = time.perf_counter()
                found += sum(base_exists(db, sorted(by_shard[db_id], key=lambda c: c.key)))
                base_shards_s += t1 - t0
                multiget_s += time.perf_counter() - t1
            bytes_read += replay.bytes_read
        finally:
            replay.close()
            shutil.rmtree(folder, ignore_errors=True)
    check(found == counts["updated"] + counts["deleted"],
          "existence replay: base holds a different number of the changed keys")
    indexed = [s for s in base.shards if s.key_index is not None]
    check(len(indexed) == len(base.shards), "base: a shard has no key index")
    index_bytes = sum(s.key_index.size for s in indexed if s.key_index is not None)

    # -- 6. a chain of depth 8, then compaction ------------------------------------------------------
    chain_writes, chain_refreshes = [], []
    n_chain = max(4, round(args.rows * args.chain_delta_pct / 100))
    for step in range(2, CHAIN_DEPTH + 1):
        run_id = f"delta{step:02d}"
        table, counts = model.delta(step, n_chain)
        s, _ = write_delta(root, table, run_id, run_id)
        manifest, _ = live_manifest()
        check_manifest(manifest, model.rows, counts, run_id)
        t0 = time.perf_counter()
        follower.refresh()
        r = time.perf_counter() - t0
        last = follower.last_refresh
        chain_writes.append(round(s, 2))
        chain_refreshes.append({"s": round(r, 3), "bytes": last.bytes_downloaded if last else None,
                                "layers": last.layers_downloaded if last else None,
                                "shards_compacted": last.shards_compacted if last else None})
        _log(f"{run_id}: write {s:.2f}s, refresh {r:.2f}s")
    chain, _ = live_manifest()
    check(chain.chain_depth == CHAIN_DEPTH, f"chain depth {chain.chain_depth} != {CHAIN_DEPTH}")
    # -- 7. correctness and get p50 ------------------------------------------------------------------
    def sample(keys: list[int]) -> list[int]:
        keys = sorted(keys)
        return [keys[i] for i in rng.choice(len(keys), size=min(args.check_sample, len(keys)), replace=False)]

    gone = sample([k for k in model.deleted])
    updated = sample([k for k in model.latest if k < args.rows])
    inserted = sample([k for k in model.latest if k >= args.rows])
    alive = np.flatnonzero(model.alive)
    spent: dict[str, list[int]] = {}
    clock = time.perf_counter_ns
    # Readers timed by turns, a chunk of keys each in turn, so a drift of the machine (load, clock)
    # falls on every reader alike; those that would not fit together in the budget are timed alone.
    by_turns: dict[str, ShardedReader] = {}

    def check_and_warm(name: str, reader: ShardedReader, run_id: str) -> None:
        check(reader.run_id == run_id, f"{name}: reads {reader.run_id}, not {run_id}")
        check(reader.multi_get(gone) == [None] * len(gone), f"{name}: a deleted key reads a value")
        check(all(reader.get(k) is None for k in gone[:100]), f"{name}: get of a deleted key reads a value")
        for what, keys in (("updated", updated), ("inserted", inserted)):
            want = [{"payload": model.latest[k]} if args.value_format == "json" else model.latest[k].encode()
                    for k in keys]
            check(reader.multi_get(keys) == want, f"{name}: an {what} key does not read its newest value")
            check(all(reader.get(k) == w for k, w in zip(keys[:100], want, strict=False)),
                  f"{name}: get of an {what} key does not read its newest value")
        _log(f"warming the {name} reader")
        warm = alive[rng.integers(0, len(alive), size=args.lookups)].tolist()
        check(all(reader.get(k) is not None for k in warm), f"{name}: an existing key reads None")

    def time_gets(readers: dict[str, ShardedReader]) -> None:
        _log(f"timing get over {args.lookups} keys on the {', '.join(readers)} reader(s)"
             f"{' by turns' if len(readers) > 1 else ''}")
        keys = alive[rng.integers(0, len(alive), size=args.lookups)].tolist()
        for start in range(0, len(keys), TURN_KEYS):
            chunk = keys[start:start + TURN_KEYS]
            for name, reader in readers.items():
                get, sink = reader.get, spent.setdefault(name, [])
                for key in chunk:
                    t0 = clock()
                    get(key)
                    sink.append(clock() - t0)
        for name, reader in readers.items():
            spent[name].sort()
            reader.close()

    def read_and_time(name: str, reader: ShardedReader, run_id: str, *, alone: bool = False) -> None:
        check_and_warm(name, reader, run_id)
        if name == "chain_followed":
            settled["chain_followed"] = _settle("timing the follower")
        held = _open_descriptors() - baseline_descriptors
        if not alone and held <= files_budget // 2:
            by_turns[name] = reader
        else:
            _log(f"{name} reader timed alone (" + ("a figure only" if alone else
                 f"{held} descriptors held > half the budget of {files_budget}") + ")")
            time_gets({name: reader})

    read_and_time("chain_followed", follower, chain.run_id)
    # Fresh readers of the depth-8 run: by default a shard's local database is compacted once it holds
    # more than ShardedReader's max_local_layers; max_local_layers=None keeps every layer as a file.
    chain_open_s, chain_reader = open_every_shard(str(work / "cache-chain"))
    read_and_time("chain", chain_reader, chain.run_id)
    # Keeping every layer costs a file per layer per shard: timed alone (it is a figure, not a target)
    # and left out where its files would not fit beside the readers kept for the targets.
    layered_files = args.num_dbs * (CHAIN_DEPTH + 1)
    layered_open_s = None
    if _open_descriptors() - baseline_descriptors + layered_files <= files_budget:
        layered_open_s, layered_reader = open_every_shard(str(work / "cache-layered"), max_local_layers=None)
        read_and_time("chain_layers_kept", layered_reader, chain.run_id, alone=True)
    else:
        _log(f"reader keeping every layer left out: {layered_files} files > what the budget of {files_budget} "
             f"leaves beside the readers kept")

    settled["compaction"] = _settle("the compaction")
    _log("compaction")
    compact_s, compact_record = write(root, write_mode="compact", run_id="compact")
    compacted, _ = live_manifest()
    check_manifest(compacted, model.rows, None, "compact")
    check(compacted.chain_depth == 0 and not any(s.layers for s in compacted.shards), "compaction left layers")
    compact_open_s, compact_reader = open_every_shard(str(work / "cache-compact"))
    read_and_time("compacted", compact_reader, "compact")
    if by_turns:
        settled["gets"] = _settle("the gets")
        time_gets(by_turns)

    p50 = {side: _percentile(ns, 0.5) for side, ns in spent.items()}
    compact_p50 = p50["compacted"]
    chain_p50 = max(p50["chain"], p50["chain_followed"])  # the target holds for both default readers
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)

    refresh_bytes_ratio = refresh_bytes / (delta_layer_bytes + delta_manifest_bytes)
    result = {
        "benchmark": "delta", "rows": args.rows, "num_dbs": args.num_dbs, "value_bytes": VALUE_BYTES,
        "value_format": args.value_format,
        "master": "local[2]", "warmup": args.warmup == "true",
        "full_write_s": round(full_s, 2),
        "full_write_driver_phases_s": full_record.stats["durations_s"],
        "base_bytes": base.byte_size, "base_manifest_bytes": base_manifest_bytes,
        "delta": {
            "keys": n_delta, "pct": args.delta_pct, **{k: delta.stats.get(k) for k in counts},
            "write_s": round(delta_s, 2), "driver_phases_s": delta_record.stats["durations_s"],
            "shards_written": delta.stats.get("shards_written"), "layer_bytes": delta_layer_bytes,
            "manifest_bytes": delta_manifest_bytes,
        },
        "existence_check": {
            "how": "each task ingests the key indexes of its base shards (keys-00000.sst of every layer: keys with "
                   "empty values and tombstones, verified) into one local database (core.write.delta.TaskBase) and "
                   "does one RocksDB MultiGet per shard; replayed here with TaskBase, one per task as the job "
                   "splits the shards (times summed over the tasks)",
            "base_shards_download_ingest_s": round(base_shards_s, 2), "multiget_s": round(multiget_s, 3),
            "keys": len(changed), "shards": len(by_shard), "tasks": num_tasks, "bytes_read": bytes_read,
        },
        "key_index": {
            "base_key_index_bytes": index_bytes, "base_data_bytes": base.byte_size,
            "per_shard_key_index_bytes": round(index_bytes / max(1, len(indexed))),
            "per_shard_data_bytes": round(base.byte_size / max(1, len(base.shards))),
            "key_index_to_data": round(index_bytes / max(1, base.byte_size), 3),
            "delta_layer_key_index_bytes": sum(la.key_index.size for s in delta.shards for la in s.layers
                                               if la.run_id == delta.run_id and la.key_index is not None),
            "delta_layer_data_bytes": delta_layer_bytes,
        },
        "refresh": {
            "s": round(refresh_s, 3), "bytes_downloaded": refresh_bytes,
            "layers_downloaded": report.layers_downloaded if report else None,
            "shards_rebuilt": report.shards_rebuilt if report else None,
            "layers_reused": report.layers_reused if report else None,
            "fresh_open_every_shard_s": round(fresh_open_s, 3), "base_fresh_open_every_shard_s": round(base_open_s, 3),
        },
        "chain": {
            "depth": chain.chain_depth, "keys_per_delta": n_chain, "pct_per_delta": args.chain_delta_pct,
            "write_s": chain_writes, "refreshes": chain_refreshes, "fresh_open_every_shard_s": round(chain_open_s, 3),
            "fresh_open_every_shard_layers_kept_s": round(layered_open_s, 3) if layered_open_s else None,
            "layer_bytes": chain.byte_size - base.byte_size,
        },
        "compaction": {
            "s": round(compact_s, 2), "driver_phases_s": compact_record.stats["durations_s"],
            "fresh_open_every_shard_s": round(compact_open_s, 3), "bytes": compacted.byte_size,
        },
        "get": {
            "lookups": args.lookups,
            **{f"{side}_p50_us": round(p50[side], 3) for side in spent},
            **{f"{side}_p99_us": round(_percentile(spent[side], 0.99), 3) for side in spent},
            "chain_layers_kept_p50_ratio":
                round(p50["chain_layers_kept"] / compact_p50, 3) if "chain_layers_kept" in p50 else None,
            "follower_live": follower_live, "timed_by_turns": list(by_turns),
        },
        "targets": {
            f"delta_write_le_{DELTA_WRITE_MAX:g}x_full": _target(delta_s / full_s, DELTA_WRITE_MAX),
            f"refresh_bytes_le_{REFRESH_BYTES_MAX:g}x_layers_plus_manifest":
                _target(refresh_bytes_ratio, REFRESH_BYTES_MAX),
            f"refresh_time_le_{REFRESH_TIME_MAX:g}x_fresh_open": _target(refresh_s / fresh_open_s, REFRESH_TIME_MAX),
            f"chain{CHAIN_DEPTH}_get_p50_le_{CHAIN_GET_P50_MAX:g}x_compacted":
                _target(chain_p50 / compact_p50, CHAIN_GET_P50_MAX),
            f"compaction_le_{COMPACT_MAX:g}x_full": _target(compact_s / full_s, COMPACT_MAX),
        },
        "correctness": {
            "ok": not errors, "errors": errors[:10], "expected_rows": model.rows,
            "deleted_sampled": len(gone), "updated_sampled": len(updated), "inserted_sampled": len(inserted),
        },
        "settled_s": {k: round(v, 1) for k, v in settled.items()},
        "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
