"""Spark Connect benchmark (SPEC §15): the same write through spark-submit and as a Connect client.

Both run the bundled job end to end, as the operator would: ``spark-submit --master local[2]`` (a
fresh driver JVM per write, as on a worker with Java) and ``python sharded_write_job.py`` with
``SPARK_REMOTE`` pointing at a Spark Connect server on ``local[2]`` started once beforehand (a
long-lived cluster endpoint, as in managed Airflow; its start-up is not timed). Same generated
input, same num_dbs; one warm-up round. Prints one JSON line with the ratio per round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_write import generate  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--num-dbs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.storage import open_store
    from airflow_provider_shardyfusion.core.write import job_environment as job_env
    from airflow_provider_shardyfusion.submission.bundle import build_bundle
    from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, encode_config
    from tests.spark_connect_server import connect_server

    work = Path(tempfile.mkdtemp(prefix="shardyfusion-bench-connect-"))
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    src = str(work / "input")
    generate(spark, src, args.rows)
    spark.stop()  # the cores go to the two writers, one at a time
    bundle = build_bundle()
    spark_submit = str(Path(sys.executable).parent / "spark-submit")

    def job_args(out: Path) -> list[str]:
        config = build_write_config(output_uri=f"file://{out}", input_path=src, key_column="id",
                                    value_column="payload", num_dbs=args.num_dbs)
        return [bundle.entry_script, CONFIG_ARG, encode_config(config.to_json())]

    def rows_of(out: Path) -> int:
        snapshots = SnapshotRoot(open_store(f"file://{out}"))
        return snapshots.read_manifest(snapshots.current()).row_count

    rounds = []
    with connect_server(work) as port:
        remote = {job_env.REMOTE_URL: f"sc://127.0.0.1:{port}", job_env.BUNDLE: bundle.zip_path,
                  "PYTHONPATH": bundle.zip_path}
        for i in range(args.rounds + 1):  # round 0 is the warm-up
            submit_out, connect_out = work / f"submit-{i}", work / f"connect-{i}"
            s = timed([spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                       "--py-files", bundle.zip_path, *job_args(submit_out)], {})
            c = timed([sys.executable, *job_args(connect_out)], remote)
            assert rows_of(submit_out) == rows_of(connect_out) == args.rows
            shutil.rmtree(submit_out, ignore_errors=True)
            shutil.rmtree(connect_out, ignore_errors=True)
            if i:
                rounds.append({"round": i, "spark_submit_s": round(s, 2), "connect_client_s": round(c, 2),
                               "ratio_connect_to_spark_submit": round(c / s, 3)})
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "connect", "rows": args.rows, "num_dbs": args.num_dbs, "master": "local[2]",
                      "rounds": rounds}))


if __name__ == "__main__":
    main()
