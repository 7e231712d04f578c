"""Scale benchmark (SPEC §10): 1, 16, 256, 1000 and 4000 shards on the same input, in one Spark session.

Per shard count: wall time, its ratio to the 16-shard time (same run), objects written per shard,
the peak RSS (VmHWM) of the Spark Python workers and of the JVM while the write ran, and for 16
and 256 shards the time a fresh ``ShardedReader`` (empty cache) takes to its first ``get``.
Then a memory case: 2 shards, each ``--memory-shard-factor`` x ``sort_run_rows`` rows, with the
peak RSS of the Python workers and the JVM. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench_write import generate


def _jvm_pids() -> list[int]:
    """The local-mode JVM (driver and executors) started by this process's py4j gateway."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"java" in cmd:
            pids.append(int(pid))
    return pids


def _python_workers() -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd or b"pyspark/daemon" in cmd:
            pids.append(int(pid))
    return pids


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakRss:
    """Polls every Spark Python worker's high-water mark while a write runs."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self.jvm_peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._poll()

    def _poll(self) -> None:
        for pid in _python_workers():
            self.peak_kb = max(self.peak_kb, _vm_hwm_kb(pid))
        for pid in _jvm_pids():
            self.jvm_peak_kb = max(self.jvm_peak_kb, _vm_hwm_kb(pid))

    def __enter__(self) -> Self:
        # Workers and the JVM are reused across writes: reset their high-water marks so each write
        # counts its own.
        for pid in _python_workers() + _jvm_pids():
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                pass
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()


def _objects_per_shard(root: str, run_id: str, shards_written: int) -> float:
    from airflow_provider_shardyfusion.core import layout
    from airflow_provider_shardyfusion.core.storage import open_store

    objects = sum(1 for _ in open_store(root).list(layout.shards_prefix(run_id)))
    return round(objects / max(1, shards_written), 2)


def _first_get_s(root: str, cache_dir: str, key: int) -> float:
    """A fresh reader on an empty cache: construct, then the first get (one shard downloaded)."""
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

    t = time.perf_counter()
    with ShardedReader(root, cache_dir=cache_dir) as reader:
        assert reader.get(key) is not None
        took = time.perf_counter() - t
    return round(took, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--shards", default="1,16,256,1000,4000")
    parser.add_argument("--sort-run-rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per shard count (median reported)")
    parser.add_argument("--memory-shard-factor", type=int, default=4,
                        help="memory case: shards of this many times sort_run_rows rows (0 skips it)")
    args, _ = parser.parse_known_args()

    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    work = Path(tempfile.mkdtemp(prefix="shardyfusion-scale-"))
    spark = (SparkSession.builder.master("local[2]").appName("bench-scale")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def write(src: str, out: Path, num_dbs: int, rows: int) -> dict:
        root = f"file://{out}"
        cfg = build_write_config(output_uri=root, input_path=src, key_column="id", value_column="payload",
                                 num_dbs=num_dbs, sort_run_rows=args.sort_run_rows)
        with PeakRss() as rss:
            t = time.perf_counter()
            record = run_write(spark, cfg)
            took = time.perf_counter() - t
        stats = record.stats
        return {"num_dbs": num_dbs, "seconds": round(took, 2), "rows_per_s": round(rows / took),
                "bytes": stats["bytes"], "shard_sort": stats.get("shard_sort"),
                "objects_per_shard": _objects_per_shard(root, record.run_id, stats["shards_written"]),
                "peak_python_worker_rss_mb": round(rss.peak_kb / 1024, 1),
                "peak_jvm_rss_mb": round(rss.jvm_peak_kb / 1024, 1)}

    src = str(work / "input")
    generate(spark, src, args.rows)
    # Untimed warm-up (JIT, Python workers, page cache), so the first timed write is not penalized.
    write(src, work / "warm-up", 16, args.rows)
    shutil.rmtree(work / "warm-up", ignore_errors=True)
    # Rounds interleave the shard counts, so a noisy spell on a shared machine hits all of them;
    # each count reports its median (every round's time is listed too).
    counts = [int(x) for x in args.shards.split(",")]
    by_count: dict[int, list[dict]] = {n: [] for n in counts}
    for rnd in range(args.rounds):
        for num_dbs in counts:
            out = work / f"out-{num_dbs}"
            entry = write(src, out, num_dbs, args.rows)
            if rnd == 0 and num_dbs in (16, 256):
                entry["reader_first_get_fresh_cache_s"] = _first_get_s(f"file://{out}", str(work / f"cache-{num_dbs}"), 1)
            by_count[num_dbs].append(entry)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work / f"cache-{num_dbs}", ignore_errors=True)
    results = []
    for num_dbs in counts:
        runs = by_count[num_dbs]
        entry = dict(runs[0])
        entry["seconds"] = round(statistics.median(r["seconds"] for r in runs), 2)
        entry["seconds_each_round"] = [r["seconds"] for r in runs]
        entry["rows_per_s"] = round(args.rows / entry["seconds"])
        entry["peak_python_worker_rss_mb"] = max(r["peak_python_worker_rss_mb"] for r in runs)
        entry["peak_jvm_rss_mb"] = max(r["peak_jvm_rss_mb"] for r in runs)
        results.append(entry)
    base = next((r["seconds"] for r in results if r["num_dbs"] == 16), None)
    for r in results:
        r["ratio_to_16"] = round(r["seconds"] / base, 2) if base else None
    memory = None
    if args.memory_shard_factor > 0:
        shard_rows = args.memory_shard_factor * args.sort_run_rows
        msrc = str(work / "input-memory")
        generate(spark, msrc, 2 * shard_rows)
        entry = write(msrc, work / "out-memory", 2, 2 * shard_rows)
        memory = {"num_dbs": 2, "rows_per_shard_approx": shard_rows, "sort_run_rows": args.sort_run_rows,
                  **{k: entry[k] for k in ("seconds", "shard_sort", "peak_python_worker_rss_mb", "peak_jvm_rss_mb")}}
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "scale", "rows": args.rows, "master": "local[2]", "rounds": args.rounds,
                      "results": results,
                      "memory_case": memory}))


if __name__ == "__main__":
    main()
