"""The Spark application in local mode against the local store and a moto S3 server.

Every test reads the published shards back with rocksdict (raw mode) and compares them with
the generated input, and checks routing, manifest, _CURRENT and run record agree. The round
trips also read every key through ``ShardedReader``: writer and reader must agree end to end.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    InputDataError,
    KeyEncodingError,
    ShardAssignmentError,
)
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.run_record import read_run_record
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.spark_jobs.faults import ENABLE_VAR
from tests.fault_env import fault_env
from tests.spark_helpers import (
    assert_exact,
    assert_reader_agrees,
    int_table,
    read_snapshot,
    run,
    write_parquet,
)

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # local[2,2]: two cores, and a failed task is retried once (needed by the retry tests).
    session = (
        SparkSession.builder.master("local[2,2]").appName("shardyfusion-tests")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.s3
def test_hash_int_keys_round_trip_both_stores(spark, tmp_path, any_root):
    root, opts = any_root
    table, expected = int_table(20_000)
    record = run(spark, output_uri=root, storage_options=opts, key_column="id",
                 input_path=write_parquet(tmp_path, table), value_column="payload", num_dbs=8,
                 sort_run_rows=1_000, batch_size=300)
    manifest, shards = read_snapshot(root, opts)
    assert manifest.num_dbs == 8 and manifest.key_encoding == "u64be" and len(manifest.shards) == 8
    assert record.stats["rows"] == 20_000 and record.stats["empty_shards"] == 0
    # ~2,500 rows per shard exceed one sort run (1,000): Spark sorts, the writer checks the order
    # and ingests three non-overlapping runs per shard.
    assert manifest.stats["shard_sort"] == "spark"
    assert_exact(manifest, shards, expected, "u64be")
    assert_reader_agrees(root, expected, opts, absent=[20_000, 2**40])
    # No attempt other than the winners is left under this run's shards.
    store = open_store(root, opts)
    winners = tuple(store.key_of(s.db_url) + "/" for s in manifest.shards)
    assert all(o.key.startswith(winners) for o in store.list(layout.shards_prefix(manifest.run_id)))


def test_string_and_binary_keys_json_values(spark, tmp_path):
    names = [f"user-{i:05d}-é" for i in range(3_000)]
    table = pa.table({"name": names, "age": list(range(3_000)), "city": ["Zürich"] * 3_000})
    root = f"file://{tmp_path}/str"
    run(spark, output_uri=root, key_column="name", input_path=write_parquet(tmp_path, table),
        value_format="json", value_columns=["age", "city"], num_dbs=5)
    manifest, shards = read_snapshot(root)
    expected = {n: encoding.encode_json_value({"age": i, "city": "Zürich"}) for i, n in enumerate(names)}
    assert manifest.key_encoding == "utf8" and manifest.value_format == "json"
    assert manifest.stats["shard_sort"] == "writer"  # 600 rows per shard: one in-memory sort per shard
    assert_exact(manifest, shards, expected, "utf8")
    assert_reader_agrees(root, expected, decode=json.loads, absent=["user-99999-é", ""])

    blobs = [bytes([i % 256, i // 256, 7]) for i in range(2_000)]
    btable = pa.table({"k": pa.array(blobs, pa.binary()), "v": pa.array([b[::-1] for b in blobs], pa.binary())})
    broot = f"file://{tmp_path}/bin"
    run(spark, output_uri=broot, key_column="k", input_path=write_parquet(tmp_path, btable, "b"),
        value_column="v", num_dbs=3)
    manifest, shards = read_snapshot(broot)
    assert manifest.key_encoding == "raw"
    assert_exact(manifest, shards, {b: b[::-1] for b in blobs}, "raw")
    assert_reader_agrees(broot, {b: b[::-1] for b in blobs}, absent=[b"", b"\xff\xff\xff\xff"])


def test_max_keys_per_shard_and_more_shards_than_keys(spark, tmp_path):
    table, expected = int_table(1_000, seed=3)
    root = f"file://{tmp_path}/mk"
    record = run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table),
                 value_column="payload", max_keys_per_shard=300)
    manifest, shards = read_snapshot(root)
    assert manifest.num_dbs == 4 and record.num_dbs == 4
    assert_exact(manifest, shards, expected, "u64be")

    few = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "payload": ["a", "b", "c"]})
    root2 = f"file://{tmp_path}/sparse"
    record = run(spark, output_uri=root2, key_column="id", input_path=write_parquet(tmp_path, few, "few"),
                 value_column="payload", num_dbs=16)
    manifest, shards = read_snapshot(root2)
    # More shards than cores and than keys: one task per shard, the empty ones left out (sparse).
    assert record.stats["attempts_seen"] == 16
    assert len(manifest.shards) == 3 and record.stats["empty_shards"] == 13
    assert_exact(manifest, shards, {1: b"a", 2: b"b", 3: b"c"}, "u64be")


def test_empty_input_publishes_an_empty_snapshot(spark, tmp_path):
    empty = pa.table({"id": pa.array([], pa.int64()), "payload": pa.array([], pa.string())})
    root = f"file://{tmp_path}/empty"
    record = run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, empty),
                 value_column="payload", num_dbs=4)
    manifest, shards = read_snapshot(root)
    assert manifest.shards == () and shards == {} and record.stats["rows"] == 0
    assert record.stats["empty_shards"] == 4
    assert not list(open_store(root).list("shards/"))  # empty shards do no storage I/O


def test_cel_direct_categorical_and_inferred(spark, tmp_path):
    rows = 2_000
    table = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "region": [["eu", "us", "apac"][i % 3] for i in range(rows)],
        "payload": [f"p{i}" for i in range(rows)],
    })
    path = write_parquet(tmp_path, table)
    expected = {i: f"p{i}".encode() for i in range(rows)}

    root = f"file://{tmp_path}/direct"
    run(spark, output_uri=root, key_column="id", input_path=path, value_column="payload",
        cel_expr="shard_hash(id) % 4u", num_dbs=4)
    manifest, shards = read_snapshot(root)
    assert manifest.sharding.cel_mode == "direct" and manifest.sharding.cel_columns == {"id": "int"}
    assert manifest.stats["shard_sort"] == "spark"  # CEL may skew shards: never trust an average
    assert_exact(manifest, shards, expected, "u64be")  # same as hash routing, by construction
    assert_reader_agrees(root, expected, absent=[rows])  # CEL over the key alone: the reader routes from the key

    region_of = {i: ["eu", "us", "apac"][i % 3] for i in range(rows)}
    root = f"file://{tmp_path}/cat"
    run(spark, output_uri=root, key_column="id", input_path=path, value_column="payload",
        cel_expr="region", cel_columns={"region": "string"}, routing_values=["us", "eu", "apac"])
    manifest, shards = read_snapshot(root)
    order = ["us", "eu", "apac"]
    assert manifest.num_dbs == 3 and list(manifest.sharding.routing_values) == order
    assert_exact(manifest, shards, expected, "u64be", router=lambda k: order.index(region_of[k]))

    root = f"file://{tmp_path}/inferred"
    run(spark, output_uri=root, key_column="id", input_path=path, value_column="payload",
        cel_expr="region", cel_columns=["region"], infer_routing_values=True)
    manifest, shards = read_snapshot(root)
    inferred = ["apac", "eu", "us"]  # sorted distinct tokens
    assert list(manifest.sharding.routing_values) == inferred
    assert_exact(manifest, shards, expected, "u64be", router=lambda k: inferred.index(region_of[k]))


def test_single_db_sorted_and_retried_into_attempt_01(spark, tmp_path):
    table, expected = int_table(5_000, seed=9)
    root = f"file://{tmp_path}/one"
    record = run(spark, faults={"single_db_fail_attempts": 1}, output_uri=root, key_column="id",
                 input_path=write_parquet(tmp_path, table), value_column="payload", num_dbs=1,
                 shard_retry={"max_retries": 2, "initial_backoff_s": 0.1})
    manifest, shards = read_snapshot(root)
    assert [s.attempt for s in manifest.shards] == [1]
    assert manifest.shards[0].db_url.endswith("/db=00000/attempt=01")
    assert_exact(manifest, shards, expected, "u64be")
    assert_reader_agrees(root, expected, absent=[5_000])
    assert record.stats["rows"] == 5_000


@pytest.mark.parametrize("shuffle_partitions", ["4", "13"])
def test_single_db_keeps_the_global_order_across_many_sorted_partitions(spark, tmp_path, shuffle_partitions):
    """Regression: coalescing the globally sorted frame grouped its partitions out of order."""
    table, expected = int_table(20_000, seed=12)
    root = f"file://{tmp_path}/one-many"
    # AQE would merge the small sorted partitions into one and hide the problem.
    run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload",
        num_dbs=1, spark_conf_overrides={"spark.sql.adaptive.coalescePartitions.enabled": "false",
                                         "spark.sql.shuffle.partitions": shuffle_partitions})
    assert_exact(*read_snapshot(root), expected, "u64be")


def test_single_db_cel_still_checks_every_token(spark, tmp_path):
    """One shard needs no shuffle, but an unknown categorical token is still a bad row."""
    table = pa.table({"id": pa.array(range(100), pa.int64()), "payload": [f"v{i}" for i in range(100)]})
    root = f"file://{tmp_path}/one-cel"
    with pytest.raises(ShardAssignmentError, match="'other'"):
        run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload",
            cel_expr="id < 90 ? 'all' : 'other'", routing_values=["all"], run_id="one-cel")
    _assert_failed_and_unpublished(root, "one-cel", None, "ShardAssignmentError", "'other'")


@pytest.mark.s3
def test_task_failure_after_upload_retry_wins_and_failed_attempt_is_deleted(spark, tmp_path, any_root):
    root, opts = any_root
    table, expected = int_table(4_000, seed=5)
    run(spark, faults={"fail_after_upload": {"db_id": 2, "attempt": 0}}, output_uri=root, storage_options=opts,
        key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload", num_dbs=4)
    manifest, shards = read_snapshot(root, opts)
    retried = manifest.shard(2)
    assert retried.attempt == 1 and "/attempt=01-task=" in retried.db_url
    assert_exact(manifest, shards, expected, "u64be")
    db2 = [o.key for o in open_store(root, opts).list(layout.shard_db_prefix(manifest.run_id, 2))]
    assert db2 and all("/attempt=01-task=" in k for k in db2)  # the failed attempt=00 files are gone


@pytest.mark.s3
def test_duplicate_key_on_s3_fails_clearly_and_keeps_current(spark, tmp_path, s3_root, s3_options):
    good, _ = int_table(100)
    run(spark, output_uri=s3_root, storage_options=s3_options, key_column="id", value_column="payload", num_dbs=2,
        input_path=write_parquet(tmp_path, good, "good"), run_id="good-run")
    before = open_store(s3_root, s3_options).get(layout.CURRENT_KEY).data
    ids = list(range(50))
    ids[9] = 3
    bad = pa.table({"id": pa.array(ids, pa.int64()), "payload": [f"v{i}" for i in range(50)]})
    with pytest.raises(InputDataError, match="duplicate key 3"):
        run(spark, output_uri=s3_root, storage_options=s3_options, key_column="id", value_column="payload", num_dbs=2,
            input_path=write_parquet(tmp_path, bad, "bad"), run_id="dup-run")
    _assert_failed_and_unpublished(s3_root, "dup-run", before, "InputDataError", "duplicate key 3", s3_options)


def _assert_failed_and_unpublished(root, run_id, previous_pointer, error_type, needle, storage_options=None):
    store = open_store(root, storage_options)
    record = read_run_record(store, run_id)
    assert record is not None and record.status == "failed"
    assert record.error.type == error_type and needle in record.error.message
    try:
        current = store.get(layout.CURRENT_KEY).data
    except KeyError:
        current = None
    assert current == previous_pointer


def test_verify_routing_mismatch_publishes_nothing(spark, tmp_path):
    table, _ = int_table(1_000)
    root = f"file://{tmp_path}/wrong"
    with pytest.raises(ShardAssignmentError, match="verify_routing"):
        run(spark, faults={"wrong_router": True}, output_uri=root, key_column="id", run_id="wrong-router",
            input_path=write_parquet(tmp_path, table), value_column="payload", num_dbs=4)
    _assert_failed_and_unpublished(root, "wrong-router", None, "ShardAssignmentError", "verify_routing")
    assert not list(open_store(root).list("manifests/"))


@pytest.mark.parametrize(
    "case", ["null_key", "duplicate_key", "negative_u64be", "unknown_token", "cel_out_of_range"],
)
def test_bad_rows_fail_clearly_and_keep_current(spark, tmp_path, case):
    root = f"file://{tmp_path}/bad"
    good, _ = int_table(100)
    run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, good, "good"),
        value_column="payload", num_dbs=2, run_id="good-run")
    before = open_store(root).get(layout.CURRENT_KEY).data
    ids = list(range(50))
    kwargs = dict(value_column="payload", num_dbs=2)
    if case == "null_key":
        ids[7] = None
        err, needle = InputDataError, "null key"
    elif case == "duplicate_key":
        ids[9] = 3
        err, needle = InputDataError, "duplicate key 3"
    elif case == "negative_u64be":
        ids[5] = -42
        err, needle = KeyEncodingError, "-42"
    elif case == "unknown_token":
        kwargs = dict(value_column="payload", cel_expr="id < 25 ? 'low' : id < 40 ? 'mid' : 'high'",
                      routing_values=["low", "mid"])
        err, needle = ShardAssignmentError, "'high'"
    else:
        kwargs = dict(value_column="payload", cel_expr="id", num_dbs=40)
        err, needle = ShardAssignmentError, "shard id 40"
    table = pa.table({"id": pa.array(ids, pa.int64()), "payload": [f"v{i}" for i in range(50)]})
    with pytest.raises(err, match=needle):
        run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table, case),
            run_id=f"bad-{case.replace('_', '-')}", **kwargs)
    _assert_failed_and_unpublished(root, f"bad-{case.replace('_', '-')}", before, err.__name__, needle)


@pytest.mark.parametrize("prepass", ["max_keys_per_shard", "infer_routing_values"])
def test_input_is_read_once_even_with_a_pre_pass(spark, tmp_path, prepass):
    """The count / token pre-pass, the routing range check, the verification sample and the write
    must share one read of the source: a Python UDF in a filter counts the rows Spark evaluates."""
    rows = 3_000
    table, expected = int_table(rows, seed=11)
    reads = spark.sparkContext.accumulator(0)

    def count_read(v):
        reads.add(1)
        return v

    spark.udf.register("sf_count_read", count_read, "bigint")
    # In a filter the UDF cannot be pruned away by a count(): every evaluation of the source shows.
    spark.read.parquet(write_parquet(tmp_path, table)).where("sf_count_read(id) >= 0").createOrReplaceTempView(
        "counted_input")
    kwargs = (dict(max_keys_per_shard=1_000) if prepass == "max_keys_per_shard"
              else dict(cel_expr="string(id % 3)", cel_columns={"id": "int"}, infer_routing_values=True))
    root = f"file://{tmp_path}/{prepass}"
    run(spark, output_uri=root, key_column="id", input_sql="SELECT * FROM counted_input", value_column="payload",
        **kwargs)
    manifest, shards = read_snapshot(root)
    assert manifest.num_dbs == 3
    router = None if prepass == "max_keys_per_shard" else (lambda k: ["0", "1", "2"].index(str(k % 3)))
    assert_exact(manifest, shards, expected, "u64be", router=router)
    assert reads.value == rows


def test_csv_with_options_writer_sort_runs_rate_limit_and_conf_overrides(spark, tmp_path, monkeypatch):
    """The paths the defaults skip: csv input with options, cache_input, the writer's own sort runs
    (sort_within_partitions=False, several runs per shard), a token bucket, and Spark conf overrides
    restored afterwards."""
    rows = 6_000
    keys = list(range(rows))
    random.Random(4).shuffle(keys)
    csv = tmp_path / "input.csv"
    csv.write_text("id;payload\n" + "".join(f"{k};row {k}\n" for k in keys))
    before = spark.conf.get("spark.sql.shuffle.partitions")
    seen_overrides = []
    real_write = __import__("airflow_provider_shardyfusion.spark_jobs.driver", fromlist=["_write_sharded"])._write_sharded

    def spy(df, *args):
        seen_overrides.append(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        return real_write(df, *args)

    monkeypatch.setattr("airflow_provider_shardyfusion.spark_jobs.driver._write_sharded", spy)
    root = f"file://{tmp_path}/csv"
    record = run(spark, output_uri=root, key_column="id", input_path=str(csv), input_format="csv",
                 input_options={"header": "true", "sep": ";", "inferSchema": "true"}, value_column="payload",
                 num_dbs=3, cache_input=True, sort_within_partitions=False, sort_run_rows=700, batch_size=250,
                 max_writes_per_second=1_000_000, spark_conf_overrides={"spark.sql.shuffle.partitions": "7"})
    manifest, shards = read_snapshot(root)
    assert_exact(manifest, shards, {k: f"row {k}".encode() for k in keys}, "u64be")
    assert manifest.stats["shard_sort"] == "writer"
    assert seen_overrides == ["7"] and spark.conf.get("spark.sql.shuffle.partitions") == before
    assert "rate_limit_wait_s" in record.stats["task_time_totals_s"]


def test_cache_input_falls_back_silently_when_persist_fails(spark, tmp_path, monkeypatch, caplog):
    from pyspark.sql.classic.dataframe import DataFrame  # the class of local-session DataFrames in Spark 4

    def refuse(self, *args, **kwargs):
        raise RuntimeError("no room to cache")

    monkeypatch.setattr(DataFrame, "persist", refuse)
    table, expected = int_table(500, seed=2)
    root = f"file://{tmp_path}/nocache"
    with caplog.at_level("WARNING", logger="shardyfusion.job"):
        run(spark, output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload",
            num_dbs=2, cache_input=True)
    assert "could not persist the input (no room to cache); continuing uncached" in caplog.text
    assert_exact(*read_snapshot(root), expected, "u64be")


def test_conf_override_that_cannot_be_set_at_runtime_is_a_config_error(spark, tmp_path):
    table, _ = int_table(10)
    with pytest.raises(ConfigError, match=r"spark_conf_overrides 'spark\.executor\.memory' cannot be set at runtime"):
        run(spark, output_uri=f"file://{tmp_path}/static", key_column="id", input_path=write_parquet(tmp_path, table),
            value_column="payload", num_dbs=2, spark_conf_overrides={"spark.sql.shuffle.partitions": "3",
                                                                    "spark.executor.memory": "9g"})
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"  # the first override was rolled back


def test_bad_column_is_a_config_error_in_the_run_record(spark, tmp_path):
    table, _ = int_table(10)
    root = f"file://{tmp_path}/cfg"
    with pytest.raises(ConfigError, match="'nope' is not a column"):
        run(spark, output_uri=root, key_column="nope", input_path=write_parquet(tmp_path, table),
            value_column="payload", num_dbs=2, run_id="bad-column")
    _assert_failed_and_unpublished(root, "bad-column", None, "ConfigError", "nope")


@pytest.mark.parametrize(("source", "needle"), [
    ({"input_path": "/nonexistent/in.parquet"}, "input_path '/nonexistent/in.parquet' (input_format 'parquet') "
                                                "cannot be read: [PATH_NOT_FOUND]"),
    ({"input_table": "no_such_table"}, "input_table 'no_such_table' cannot be read: [TABLE_OR_VIEW_NOT_FOUND]"),
    ({"input_sql": "SELEC oops"}, "input_sql 'SELEC oops' cannot be read: [PARSE_SYNTAX_ERROR]"),
])
def test_unreadable_input_is_a_config_error_naming_the_argument(spark, tmp_path, source, needle):
    root = f"file://{tmp_path}/unreadable"
    with pytest.raises(ConfigError) as info:
        run(spark, output_uri=root, key_column="id", value_column="payload", num_dbs=2, run_id="bad-input", **source)
    assert needle in str(info.value)
    _assert_failed_and_unpublished(root, "bad-input", None, "ConfigError", needle)


def test_spark_submit_entry_script_success_and_failure(tmp_path):
    """The real entry script through spark-submit: exit 0 publishes; exit 1 carries the writer's error.
    A fault in the environment without its test-only switch is ignored (the write is exact)."""
    import base64

    table, expected = int_table(2_000, seed=11)
    path = write_parquet(tmp_path, table)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    entry = str(ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts" / "sharded_write_job.py")

    def submit(job_env=env, **kwargs):
        cfg = build_write_config(input_path=path, key_column="id", value_column="payload", **kwargs)
        b64 = base64.urlsafe_b64encode(cfg.to_json().encode()).decode()
        return subprocess.run([spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false", entry,
                               "--config-b64", b64], env=job_env, capture_output=True, text=True, timeout=300)

    ok_root = f"file://{tmp_path}/submit"
    stray = dict(env, **fault_env({"wrong_router": True}))
    del stray[ENABLE_VAR]  # honoured, the fault would fail verify_routing
    done = submit(stray, output_uri=ok_root, num_dbs=4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{ENABLE_VAR}=1" in done.stdout + done.stderr  # the warning names the switch
    manifest, shards = read_snapshot(ok_root)
    assert_exact(manifest, shards, expected, "u64be")
    assert manifest.writer["spark_app_id"].startswith("local-")

    dupes = pa.table({"id": pa.array([1, 2, 2], pa.int64()), "payload": ["a", "b", "c"]})
    path = write_parquet(tmp_path, dupes, "dupes")
    failed = submit(output_uri=f"file://{tmp_path}/submit-bad", num_dbs=2, run_id="submit-bad")
    assert failed.returncode == 1
    # spark-submit's PythonRunner merges the driver's stderr into stdout.
    assert "shardyfusion job failed: InputDataError: column 'id': duplicate key 2" in failed.stdout + failed.stderr
