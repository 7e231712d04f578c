"""The Spark Connect quickstart DAG under real Airflow (``dag.test()``), with no ``java`` on its PATH.

A real Spark Connect server runs on loopback (its own process, with Java: it is the cluster). The
Airflow process that runs the DAG gets a PATH without ``java`` (and no ``JAVA_HOME``), as on a
managed Airflow worker, so spark-submit could not run there: the write must go through Connect.
The snapshot is read back and compared with the generated input.
"""

from __future__ import annotations

import base64
import json

import pytest

from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED, read_run_record
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG
from tests.e2e.quickstart_helpers import ProcessSampler, assert_snapshot_matches_input
from tests.spark_connect_server import connect_server, path_without_java

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def test_the_connect_quickstart_writes_with_no_java_on_the_workers_path(run_dag, tmp_path):
    rows = 20_000
    with connect_server(tmp_path) as port, ProcessSampler() as ps:
        result = run_dag("shardyfusion_quickstart_connect", conf={"rows": rows}, extra_env={
            "SHARDYFUSION_DEMO_DIR": str(tmp_path), "PATH": path_without_java(tmp_path), "JAVA_HOME": "",
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}),
        })
    summary = result.xcoms["write_snapshot"]
    output_uri = f"file://{tmp_path}/shardyfusion_quickstart_connect/snapshot"
    assert summary["output_uri"] == output_uri and summary["rows"] == rows and summary["published"] is True
    record = read_run_record(open_store(output_uri), summary["run_id"])
    assert record.status == SUCCEEDED and record.writer["airflow"]["dag_id"] == "shardyfusion_quickstart_connect"
    assert_snapshot_matches_input(output_uri, rows)
    assert result.xcoms["read_back"]["run_id"] == summary["run_id"]
    # The job ran as a Python child of the task; no spark-submit ever carried it (this test's job
    # only: the sampler sees every process on the machine).
    jobs = [c for c in ps.seen if "sharded_write_job.py" in c and output_uri in job_config(c)]
    assert jobs and not [c for c in jobs if "spark-submit" in c or "SparkSubmit" in c], jobs


def job_config(cmdline: str) -> str:
    """The write config a job's command line carries, as JSON text ('' if there is none)."""
    parts = cmdline.split()
    if CONFIG_ARG not in parts or parts.index(CONFIG_ARG) + 1 >= len(parts):
        return ""
    try:
        return base64.urlsafe_b64decode(parts[parts.index(CONFIG_ARG) + 1]).decode()
    except ValueError:
        return ""
