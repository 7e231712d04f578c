"""Streaming benchmark (SPEC §14): file-ready → reader answering, streamed deltas vs full rewrites.

One Spark session on local[2], local ``file://`` roots under a temp dir, in this order:

1. full write of the base (untimed): ``--rows`` int64 keys (scrambled order, ~100-byte values, the
   input bench_write.py generates) in ``--num-dbs`` shards;
2. the changes, generated up front (untimed) with bench_delta.py's model: ``--warmup-batches`` +
   ``--batches`` parquet files of ``--batch-rows`` changed keys each (half updates of existing
   keys, a quarter inserts of new keys, a quarter deletes);
3. streamed: a ``ShardedReader`` on the base with every shard opened follows with ``refresh()``;
   a Structured Streaming query (parquet file source, schema "id LONG, payload STRING, deleted
   BOOLEAN", ``maxFilesPerTrigger`` 1, ``processingTime`` trigger ``--trigger``) writes through
   ``foreach_batch_writer`` (``write_mode="delta"``, ``delete_column="deleted"``). For each file:
   the clock starts at its atomic rename into the source folder and stops when the reader, polled
   every ``--poll-ms`` (``refresh()`` then ``get``), answers an updated key of that file with its
   new value; the next file is dropped only then (one file per micro-batch). The first
   ``--warmup-batches`` files are untimed (first micro-batch of the query and of the JVM code path);
4. full rewrites, the same change files: on a second root, the base with the warm-up changes
   applied is written untimed and a reader opens it with every shard opened. For each file: the
   clock starts when the file is ready (no trigger to wait for, which favours this side) and stops
   when the reader answers as above; in between, one ``write_mode="full"`` write of the base table
   with every change so far applied (base anti-joined with the changed keys, plus the newest
   upsert of each changed key; computed inside the timed write), published; the reader's
   ``refresh()`` carries over no opened shard (none is part of the new run), so the probe's ``get``
   downloads its shard lazily and the other shards are left for later reads (not timed here);
5. correctness, cheaply: both live manifests hold the expected row count, the stream published each
   batch once, and on both readers sampled deleted keys read None and sampled updated / inserted
   keys read their newest value.

``--value-format json``: every write takes the payload as a JSON value (SPEC §18's engine encoder)
and the readers answer typed values.

Reports per-batch latencies, p50 / p95 (nearest rank) of each side and the ratios stream / full.
Prints ONE JSON line on stdout; progress on stderr. Exit status 1 if a correctness check failed
(the JSON line is printed all the same).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from functools import reduce
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow.parquet as pq
from bench_delta import VALUE_BYTES, Model
from bench_write import generate

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader

SCHEMA = "id LONG, payload STRING, deleted BOOLEAN"
STREAM_ID = "bench.stream"


def _log(msg: str) -> None:
    print(f"[bench_stream] {msg}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _progress(p) -> dict:
    return p if isinstance(p, dict) else json.loads(p.json)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--num-dbs", type=int, default=16)
    ap.add_argument("--batch-rows", type=int, default=10_000, help="changed keys per file (one file per micro-batch)")
    ap.add_argument("--batches", type=int, default=10, help="timed files on each side")
    ap.add_argument("--warmup-batches", type=int, default=1, help="untimed files streamed first")
    ap.add_argument("--trigger", default="1 second", help="processingTime trigger interval of the query")
    ap.add_argument("--poll-ms", type=float, default=20.0, help="reader refresh() + get polling interval")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="give up on a batch after this long")
    ap.add_argument("--check-sample", type=int, default=2000, help="deleted / updated / inserted keys read back each")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--value-format", choices=["binary", "json"], default="binary",
                    help="json: the payload column as a JSON value on both sides (SPEC §18's engine encoder, "
                         "typed reads)")
    args = ap.parse_args(argv)
    if args.batches < 1 or args.batch_rows < 4:
        ap.error("--batches must be >= 1 and --batch-rows >= 4")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write
    from airflow_provider_shardyfusion.streaming import foreach_batch_writer

    rng = np.random.default_rng(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardyfusion-bench-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    stream_root, full_root = f"file://{work}/root-stream", f"file://{work}/root-full"
    src, changes_dir = str(work / "input"), work / "changes"
    source, staging, checkpoint = work / "source", work / "staging", str(work / "checkpoint")
    for d in (changes_dir, source, staging):
        d.mkdir()
    errors: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            errors.append(what)
            _log(f"CHECK FAILED: {what}")

    spark = (SparkSession.builder.master("local[2]").appName("bench-stream")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.num_dbs)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def open_every_shard(root: str, cache: str) -> ShardedReader:
        reader = ShardedReader(root, cache_dir=cache)
        for shard in reader.manifest.shards:
            reader.open_shard(shard.db_id)
        return reader

    reader_work: dict[str, list[dict[str, int]]] = {"stream": [], "full": []}
    as_json = args.value_format == "json"

    def values(*, chained: bool = False) -> dict:
        """The value arguments of a write; a delta inherits its base's format."""
        if not as_json:
            return {"value_column": "payload"}
        return {"value_columns": ["payload"], **({} if chained else {"value_format": "json"})}

    def read_as(payload: str):
        """What a reader's get answers for a row whose payload is ``payload`` (typed, for JSON)."""
        return {"payload": payload} if as_json else payload.encode()

    def wait_answer(reader: ShardedReader, key: int, want: bytes, t0: float, failed=lambda: None) -> float | None:
        """Seconds from ``t0`` until ``reader`` (refresh() then get) answers ``key`` with ``want``; None on failure."""
        poll = args.poll_ms / 1000.0
        while True:
            reader.refresh()
            if reader.get(key) == want:
                return time.perf_counter() - t0
            if failed() is not None or time.perf_counter() - t0 > args.timeout_s:
                return None
            time.sleep(poll)

    def cache_work(reader: ShardedReader, before: dict[str, int]) -> dict[str, int]:
        """What the reader's cache downloaded and built since ``before`` (refresh and the probe get)."""
        after = reader.cache_stats
        return {k: after[k] - before[k] for k in ("bytes_downloaded", "layers_downloaded", "shards_built", "shards_compacted")}

    # -- 1. base and changes (untimed) --------------------------------------------------------------
    _log(f"generating {args.rows} rows and {args.warmup_batches + args.batches} change files (untimed)")
    generate(spark, src, args.rows)
    model = Model(args.rows, rng)
    change_files: list[str] = []
    probes: list[tuple[int, bytes]] = []  # per file: an updated key and its new value
    for step in range(1, args.warmup_batches + args.batches + 1):
        table, _ = model.delta(step, args.batch_rows)
        path = str(changes_dir / f"change-{step:04d}.parquet")
        pq.write_table(table, path)
        change_files.append(path)
        ids, payloads = table.column("id").to_pylist(), table.column("payload").to_pylist()
        key = next(k for k, v in zip(ids, payloads, strict=True) if v is not None and k < args.rows)
        probes.append((key, read_as(model.latest[key])))

    _log(f"base: full write of {args.rows} rows in {args.num_dbs} shards (untimed)")
    t0 = time.perf_counter()
    run_write(spark, build_write_config(output_uri=stream_root, input_path=src, key_column="id", **values(),
                                        num_dbs=args.num_dbs, run_id="base"))
    base_write_s = time.perf_counter() - t0

    # -- 2. streamed deltas -------------------------------------------------------------------------
    stream_reader = open_every_shard(stream_root, str(work / "cache-stream"))
    config = build_write_config(output_uri=stream_root, input_path=str(source), key_column="id",
                                **values(chained=True), num_dbs=args.num_dbs, write_mode="delta",
                                delete_column="deleted")
    writer = foreach_batch_writer(config, stream_id=STREAM_ID)
    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source))
             .writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint)
             .trigger(processingTime=args.trigger).start())
    stream_s: list[float] = []
    for n, (path, (key, want)) in enumerate(zip(change_files, probes, strict=True)):
        staged = staging / Path(path).name
        shutil.copyfile(path, staged)
        before = stream_reader.cache_stats
        t0 = time.perf_counter()
        os.replace(staged, source / staged.name)  # atomic: the file source never sees a partial file
        took = wait_answer(stream_reader, key, want, t0, failed=query.exception)
        if took is None:
            check(False, f"stream: file {n} not answered ({query.exception()})")
            break
        if n >= args.warmup_batches:
            stream_s.append(took)
            reader_work["stream"].append(cache_work(stream_reader, before))
        _log(f"stream file {n}{' (warm-up)' if n < args.warmup_batches else ''}: {took:.3f}s, run {stream_reader.run_id}")
    progress = [_progress(p) for p in query.recentProgress]
    query.stop()
    per_batch = {p["batchId"]: p.get("durationMs", {}) for p in progress if p.get("numInputRows", 0) > 0}
    stream_phases = [{k: per_batch.get(b, {}).get(k) for k in ("addBatch", "triggerExecution")}
                     for b in range(args.warmup_batches, args.warmup_batches + args.batches)]
    outcomes = [o.to_dict() for o in writer.outcomes]
    check([(o["batch_id"], o["action"]) for o in outcomes]
          == [(b, "written") for b in range(args.warmup_batches + args.batches)],
          f"stream: outcomes {[(o['batch_id'], o['action']) for o in outcomes]}")

    # -- 3. full rewrites ---------------------------------------------------------------------------
    def applied(upto: int):
        """The base table with change files [0, upto) applied, newest change of a key winning."""
        base = spark.read.parquet(src)
        if upto == 0:
            return base
        parts = [spark.read.schema(SCHEMA).parquet(p).withColumn("_step", F.lit(i))
                 for i, p in enumerate(change_files[:upto])]
        newest = (reduce(lambda a, b: a.unionByName(b), parts)
                  .withColumn("_rn", F.row_number().over(Window.partitionBy("id").orderBy(F.col("_step").desc())))
                  .where("_rn = 1"))
        return (base.join(newest.select("id"), "id", "left_anti")
                .unionByName(newest.where("NOT coalesce(deleted, false)").select("id", "payload")))

    def full_write(upto: int, run_id: str) -> None:
        cfg = build_write_config(output_uri=full_root, input_path=src, key_column="id", **values(),
                                 num_dbs=args.num_dbs, run_id=run_id)
        run_write(spark, cfg, df=applied(upto))

    _log("full: initial snapshot = base + warm-up changes (untimed)")
    t0 = time.perf_counter()
    full_write(args.warmup_batches, "full-initial")
    full_initial_s = time.perf_counter() - t0
    full_reader = open_every_shard(full_root, str(work / "cache-full"))
    full_s: list[float] = []
    for n in range(args.warmup_batches, args.warmup_batches + args.batches):
        key, want = probes[n]
        failure: list[BaseException] = []

        def job(upto: int = n + 1, run_id: str = f"full-{n:04d}", failure=failure) -> None:
            try:
                full_write(upto, run_id)
            except BaseException as exc:  # reported by the poll loop
                failure.append(exc)

        before = full_reader.cache_stats
        t0 = time.perf_counter()  # the file is ready: the rewrite starts at once
        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        took = wait_answer(full_reader, key, want, t0, failed=lambda failure=failure: failure[0] if failure else None)
        thread.join()
        if took is None:
            check(False, f"full: file {n} not answered ({failure[0] if failure else 'timeout'})")
            break
        full_s.append(took)
        reader_work["full"].append(cache_work(full_reader, before))
        _log(f"full file {n}: {took:.3f}s, run {full_reader.run_id}")

    # -- 4. correctness -----------------------------------------------------------------------------
    def sample(keys) -> list[int]:
        keys = sorted(keys)
        return [keys[i] for i in rng.choice(len(keys), size=min(args.check_sample, len(keys)), replace=False)]

    gone = sample(model.deleted)
    updated = sample(k for k in model.latest if k < args.rows)
    inserted = sample(k for k in model.latest if k >= args.rows)
    complete = len(stream_s) == len(full_s) == args.batches
    manifests = {}
    for name, root, reader in (("stream", stream_root, stream_reader), ("full", full_root, full_reader)):
        reader.refresh()
        snapshots = SnapshotRoot.open(root)
        manifest = snapshots.read_manifest(snapshots.current())
        manifests[name] = manifest
        if complete:
            check(manifest.row_count == model.rows, f"{name}: manifest rows {manifest.row_count} != {model.rows}")
            check(reader.multi_get(gone) == [None] * len(gone), f"{name}: a deleted key reads a value")
            for what, keys in (("updated", updated), ("inserted", inserted)):
                check(reader.multi_get(keys) == [read_as(model.latest[k]) for k in keys],
                      f"{name}: an {what} key does not read its newest value")
        reader.close()
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)

    def figures(values: list[float]) -> dict:
        if not values:
            return {"per_batch_s": [], "p50_s": None, "p95_s": None}
        return {"per_batch_s": [round(v, 3) for v in values], "p50_s": round(_pct(values, 0.5), 3),
                "p95_s": round(_pct(values, 0.95), 3)}

    stream, full = figures(stream_s), figures(full_s)
    ratio = {q: round(stream[q] / full[q], 4) if stream[q] and full[q] else None for q in ("p50_s", "p95_s")}
    result = {
        "benchmark": "stream", "rows": args.rows, "num_dbs": args.num_dbs, "value_bytes": VALUE_BYTES,
        "master": "local[2]", "value_format": args.value_format, "batch_rows": args.batch_rows, "batches": args.batches,
        "warmup_batches": args.warmup_batches, "trigger": f"processingTime {args.trigger}", "poll_ms": args.poll_ms,
        "measured": "atomic rename of the change file (stream) / file ready (full) -> a reader following with "
                    "refresh(), every shard opened, answers an updated key of that file with its new value",
        "base_write_s": round(base_write_s, 2), "full_initial_write_s": round(full_initial_s, 2),
        "reader_work": "per batch, what the reader's cache downloaded and built while waiting (refresh() and the "
                       "probe get): refresh() rebuilds the opened shards a delta touches; after a full rewrite no "
                       "opened shard is part of the new run, so shards are opened lazily, here only the probe's",
        "stream": {**stream, "reader_work": reader_work["stream"], "query_durations_ms": stream_phases,
                   "chain_depth": manifests["stream"].chain_depth, "live_run": manifests["stream"].run_id},
        "full": {**full, "reader_work": reader_work["full"], "bytes": manifests["full"].byte_size},
        "ratio_stream_over_full": {"p50": ratio["p50_s"], "p95": ratio["p95_s"]},
        "correctness": {
            "ok": not errors, "errors": errors[:10], "expected_rows": model.rows,
            "deleted_sampled": len(gone), "updated_sampled": len(updated), "inserted_sampled": len(inserted),
        },
        "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
