"""Scale benchmark (SPEC §10): 1, 16, 256 and 1000 shards on the same input, in one Spark session.

Reports wall time, rows/s and the peak RSS (VmHWM) of the Spark Python workers seen while each
write ran. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench_write import generate  # noqa: E402


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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for pid in _python_workers():
                self.peak_kb = max(self.peak_kb, _vm_hwm_kb(pid))

    def __enter__(self) -> PeakRss:
        # Workers are reused across writes: reset their high-water marks so each write counts its own.
        for pid in _python_workers():
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--shards", default="1,16,256,1000")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.config import build_write_config
    from spark_jobs.driver import run_write

    work = Path(tempfile.mkdtemp(prefix="shardyfusion-scale-"))
    spark = (SparkSession.builder.master("local[2]").appName("bench-scale")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    src = str(work / "input")
    generate(spark, src, args.rows)
    results = []
    for num_dbs in [int(x) for x in args.shards.split(",")]:
        out = work / f"out-{num_dbs}"
        cfg = build_write_config(output_uri=f"file://{out}", input_path=src, key_column="id",
                                 value_column="payload", num_dbs=num_dbs)
        with PeakRss() as rss:
            t = time.perf_counter()
            record = run_write(spark, cfg, faults={})
            took = time.perf_counter() - t
        results.append({"num_dbs": num_dbs, "seconds": round(took, 2), "rows_per_s": round(args.rows / took),
                        "bytes": record["stats"]["bytes"], "peak_python_worker_rss_mb": round(rss.peak_kb / 1024, 1)})
        shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "scale", "rows": args.rows, "master": "local[2]", "results": results}))


if __name__ == "__main__":
    main()
