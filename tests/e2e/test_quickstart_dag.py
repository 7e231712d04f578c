"""The quickstart DAGs under real Airflow (``dag.test()``), real local Spark and a real S3 API server.

Each test reads the published snapshot back through ``ShardedReader`` and compares every row
with the generated input, so a pass means the whole chain worked: operator → spark-submit →
bundled job → publish → reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.run_record import FAILED, SUCCEEDED, read_run_record
from airflow_provider_shardyfusion.core.storage import open_store
from tests.e2e.quickstart_helpers import ProcessSampler, assert_snapshot_matches_input, quickstart

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})
# Distinctive, so that any copy of it anywhere is found; moto accepts any credentials.
FAKE_SECRET = "sfySecretKey/ZQ8w-GREP-ME-7f3c1d2e9b"
FAKE_KEY_ID = "AKIASHARDYFUSIONTEST"


def test_quickstart_publishes_a_snapshot_that_reads_back_exactly(run_dag, tmp_path):
    rows = 100_000
    result = run_dag("shardyfusion_quickstart", conf={"rows": rows},
                     extra_env={"SHARDYFUSION_DEMO_DIR": str(tmp_path), "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK})
    summary = result.xcoms["write_snapshot"]
    output_uri = f"file://{tmp_path}/shardyfusion_quickstart/snapshot"
    assert summary["output_uri"] == output_uri
    assert summary["rows"] == rows and summary["num_dbs"] == quickstart.NUM_DBS and summary["empty_shards"] == 0
    assert summary["bytes"] > 0 and summary["spark_app_id"].startswith("local-")
    assert summary["run_record_ref"] == f"{output_uri}/runs/run_id={summary['run_id']}/run.json"

    store = open_store(output_uri)
    record = read_run_record(store, summary["run_id"])
    assert record.status == SUCCEEDED and record.manifest_ref == summary["manifest_ref"]
    assert record.writer["airflow"]["dag_id"] == "shardyfusion_quickstart"
    assert record.writer["airflow"]["task_id"] == "write_snapshot"

    # The input lives in a folder of this DAG run only (concurrent runs never share one).
    assert result.xcoms["generate"] == "file://" + quickstart.input_dir("shardyfusion_quickstart", result.run_id).replace(
        quickstart.DEMO_DIR, str(tmp_path))
    assert result.run_id.replace(":", "_").replace("+", "_") in result.xcoms["generate"]

    lookups = result.xcoms["read_back"]
    assert lookups["run_id"] == summary["run_id"]
    assert lookups["lookups"] == {str(k): (quickstart.payload_of(k) if k != 7 else None)
                                  for k in quickstart.sample_keys(rows)}
    assert_snapshot_matches_input(output_uri, rows)


def test_duplicate_keys_fail_the_task_with_the_writers_error(run_dag, tmp_path):
    rows = 1_000
    result = run_dag("shardyfusion_quickstart", conf={"rows": rows, "duplicate_keys": True}, expect_success=False,
                     extra_env={"SHARDYFUSION_DEMO_DIR": str(tmp_path), "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK})
    assert result.tasks["write_snapshot"] == "failed" and result.tasks["read_back"] == "upstream_failed"
    duplicate = quickstart.key_of(rows // 2)
    # The Airflow task fails with the writer's own exception type and message (not a log tail).
    raised = re.findall(r"airflow_provider_shardyfusion\.core\.errors\.(\w+): (.*)", result.output)
    assert raised, result.output[-5000:]
    error_type, message = raised[-1]
    assert error_type == "InputDataError" and str(duplicate) in message, raised[-1]

    output_uri = f"file://{tmp_path}/shardyfusion_quickstart/snapshot"
    store = open_store(output_uri)
    run_ids = [layout.parse_run_record_key(o.key) for o in store.list("runs/")]
    record = read_run_record(store, next(r for r in run_ids if r))
    assert record.status == FAILED and record.error.type == "InputDataError" and record.error.message == message
    assert not store.exists(layout.CURRENT_KEY)


@pytest.mark.s3
def test_quickstart_on_s3_reads_back_and_never_leaks_the_secret(run_dag, airflow_env, s3_server, s3_root,
                                                                  s3_options, tmp_path):
    """Write through an aws connection holding a distinctive secret, then look for that secret in
    every object under the output, the run record, every XCom (the whole metadata DB), the task
    log / captured output and the logged spark-submit command line."""
    rows = 50_000
    aws_conn = {"conn_type": "aws", "login": FAKE_KEY_ID, "password": FAKE_SECRET,
                "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}
    with ProcessSampler() as ps:  # every command line on the machine while the DAG runs (what `ps` shows)
        result = run_dag("shardyfusion_quickstart_s3", conf={"rows": rows}, extra_env={
            "SHARDYFUSION_DEMO_DIR": str(tmp_path), "SHARDYFUSION_DEMO_S3_URI": s3_root,
            "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK, "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws_conn),
        })
    assert any("spark-submit" in c or "SparkSubmit" in c for c in ps.seen), "the sampler never saw spark-submit"
    assert not [c for c in ps.seen if FAKE_SECRET in c], "secret found on a process command line"
    summary = result.xcoms["write_snapshot"]
    assert summary["output_uri"] == s3_root and summary["rows"] == rows
    assert summary["manifest_ref"].startswith(f"{s3_root}/manifests/")
    assert_snapshot_matches_input(s3_root, rows, storage_options=s3_options)

    secret = FAKE_SECRET.encode()
    # Every object under the output root (manifest, run record, _CURRENT, every shard file).
    store = open_store(s3_root, s3_options)
    objects = list(store.list(""))
    keys = [o.key for o in objects]
    assert layout.CURRENT_KEY in keys and any(k.endswith("run.json") for k in keys)
    shard_files = [k for k in keys if k.startswith(f"{layout.SHARDS_DIR}/")]
    assert len(shard_files) >= summary["num_dbs"] - summary["empty_shards"]  # every written shard's files are read
    for key in keys:
        assert secret not in store.get(key).data, f"secret found in {s3_root}/{key}"
    record = read_run_record(store, summary["run_id"])
    assert FAKE_SECRET not in json.dumps(record.to_dict())
    # XComs (returned here, and all of them in the metadata DB), the captured output and task logs.
    assert FAKE_SECRET not in json.dumps(result.xcoms)
    for path in airflow_env.home.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), f"secret found in {path}"
    assert "Spark-Submit cmd:" in result.output  # the argv the spark provider logs is part of what is checked
    assert FAKE_SECRET not in result.output
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), f"secret found in {path}"
