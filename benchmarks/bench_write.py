"""Write benchmark (SPEC §10, §18): full sharded write vs read → repartition(num_dbs) → write.parquet.

One Spark session on local[2], two cases, each against Parquet of the same columns: ``binary``
(int64 key in scrambled order, one ~100-byte value column) and ``json`` (the shape the docs lead
with: ``value_columns`` of a 40-character string, an int, a double and a timestamp, with
``value_format="json"``). Generation is not timed; one warm-up round per case, then each round is
reported with the task-time split. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def generate(spark, path: str, rows: int) -> None:
    # Scrambled keys: a bijective multiply-mod over [0, rows) keeps them unique without a sort.
    spark.range(rows, numPartitions=8).selectExpr(
        f"pmod(id * 2654435761, {rows}) as id",
        "concat(sha2(cast(id as string), 256), sha2(cast(id + 1 as string), 256)) as payload",
    ).selectExpr("id", "substr(payload, 1, 100) as payload").write.mode("overwrite").parquet(path)


JSON_COLUMNS = ["name", "count", "score", "updated_at"]


def generate_json(spark, path: str, rows: int) -> None:
    """Four typed value columns: a 40-character string, an int, a double and a timestamp."""
    spark.range(rows, numPartitions=8).selectExpr(
        f"pmod(id * 2654435761, {rows}) as id",
        "substr(sha2(cast(id as string), 256), 1, 40) as name",
        "cast(id % 100000 as int) as count",
        "id / 7.0d as score",
        "timestamp_micros(1700000000000000 + id * 1000003) as updated_at",
    ).write.mode("overwrite").parquet(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--num-dbs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--sort-within-partitions", choices=["true", "false"], default="true")
    parser.add_argument("--cases", default="binary,json", help="comma-separated: binary, json")
    parser.add_argument("--conf", action="append", default=[], help="spark_conf_overrides KEY=VALUE for the sharded write")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardyfusion-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    spark = (SparkSession.builder.master("local[2]").appName("bench-write")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.num_dbs)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sources = {"binary": str(work / "input"), "json": str(work / "input-json")}
    cases = args.cases.split(",")
    if "binary" in cases:
        generate(spark, sources["binary"], args.rows)
    if "json" in cases:
        generate_json(spark, sources["json"], args.rows)

    def baseline(src: str, out: str) -> float:
        t = time.perf_counter()
        spark.read.parquet(src).repartition(args.num_dbs).write.mode("overwrite").parquet(out)
        return time.perf_counter() - t

    def noop_pass(src: str, stage: str) -> float:
        """The sharded job's Spark side up to the writer, into Spark's noop sink (per-phase split)."""
        from airflow_provider_shardyfusion.core.model.manifest import ShardingInfo
        from airflow_provider_shardyfusion.spark_jobs.routing_task import SHARD_ID_COL, RoutingPlan, with_shard_id

        df = spark.read.parquet(src)
        if stage == "shuffle":
            df = df.repartition(args.num_dbs)
        else:
            plan = RoutingPlan(ShardingInfo(strategy="hash", key_column="id"), args.num_dbs, "int")
            df = with_shard_id(df, plan).repartitionById(args.num_dbs, SHARD_ID_COL)
            if stage == "route_shuffle_sort":
                df = df.sortWithinPartitions("id")
        t = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t

    def sharded(case: str, out: str) -> tuple[float, dict]:
        values = {"value_column": "payload"} if case == "binary" else {"value_columns": JSON_COLUMNS,
                                                                        "value_format": "json"}
        cfg = build_write_config(output_uri=f"file://{out}", input_path=sources[case], key_column="id",
                                 num_dbs=args.num_dbs, sort_within_partitions=args.sort_within_partitions == "true",
                                 spark_conf_overrides=dict(c.split("=", 1) for c in args.conf), **values)
        t = time.perf_counter()
        record = run_write(spark, cfg)
        return time.perf_counter() - t, record.stats

    results = {}
    for case in cases:
        rounds = []
        for i in range(args.rounds + 1):  # round 0 is the warm-up
            b = baseline(sources[case], str(work / f"parquet-{i}"))
            s, stats = sharded(case, str(work / f"sharded-{i}"))
            phases = {f"{stage}_only_s": round(noop_pass(sources[case], stage), 2)
                      for stage in ("shuffle", "route_shuffle", "route_shuffle_sort")}
            shutil.rmtree(work / f"parquet-{i}", ignore_errors=True)
            shutil.rmtree(work / f"sharded-{i}", ignore_errors=True)
            if i == 0:
                continue
            rounds.append({
                "round": i, "baseline_s": round(b, 2), "sharded_s": round(s, 2),
                "baseline_rows_per_s": round(args.rows / b), "sharded_rows_per_s": round(args.rows / s),
                "ratio": round(s / b, 3), "noop_sink_passes_s": phases, "driver_phases_s": stats["durations_s"],
                "task_time_totals_s": stats["task_time_totals_s"],
            })
        ratios = [r["ratio"] for r in rounds]
        results[case] = {"target_ratio": TARGETS[case], "rounds": rounds,
                         "rounds_within_target": sum(r <= TARGETS[case] for r in ratios),
                         "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
                         "target_met": bool(ratios) and statistics.median(ratios) <= TARGETS[case]}
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "write", "rows": args.rows, "num_dbs": args.num_dbs, "master": "local[2]",
                      "sort_within_partitions": args.sort_within_partitions, "json_columns": JSON_COLUMNS,
                      "cases": results}))


# SPEC §10 and §18: the ratio to Parquet of the same columns each case must stay within.
TARGETS = {"binary": 1.1, "json": 1.3}


if __name__ == "__main__":
    main()
