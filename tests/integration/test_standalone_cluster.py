"""``ShardedWriteOperator`` against a real Spark standalone cluster on loopback (master + one worker).

Local mode runs executors inside the driver's JVM; a standalone cluster does not, so this is where
the bundle (``--py-files``), the interpreter choice and the environment the operator gives
spark-submit are proven to reach separate executor processes. The Spark driver and executors run
an interpreter that cannot see this source tree (the editable install's path file is skipped), so
the job can only import ``spark_jobs`` and ``core`` from the shipped bundle.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from collections import defaultdict
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion import ShardedReader
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED, read_run_record
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from tests.spark_cluster import WorkerSpec, standalone_cluster

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory):
    """``spark://127.0.0.1:<port>`` with one registered worker (2 cores, 2g); both stopped afterwards."""
    with standalone_cluster(tmp_path_factory.mktemp("spark_standalone"), (WorkerSpec(cores=2, memory="2g"),)) as master:
        yield master


def python_without_the_source_tree(tmp_path):
    """This venv's interpreter with its site-packages but without processing ``.pth`` files (-S):
    third-party packages import, while the editable install's path to the checkout is gone."""
    wrapper = tmp_path / "python-no-source"
    site_packages = sysconfig.get_paths()["purelib"]
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_packages}"\n'
        f'exec "{sys.executable}" -S "$@"\n'
    )
    wrapper.chmod(0o755)
    # .core: an editable install made from an older layout may leave a bare airflow_provider_shardyfusion/
    # folder (a namespace package) in site-packages; the provider's code is what must stay hidden.
    probe = ("import pyarrow, rocksdict, pyspark\n"
             "try:\n import airflow_provider_shardyfusion.core\nexcept ImportError:\n print('hidden')")
    out = subprocess.run([str(wrapper), "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "hidden", out
    return str(wrapper)


class FakeTI:
    dag_id, task_id, run_id, try_number, map_index = "standalone_it", "write", "manual__it", 1, -1

    def __init__(self):
        self.xcoms = {}

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def test_operator_writes_through_a_standalone_cluster(standalone_master, tmp_path, monkeypatch):
    host, port = standalone_master.rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_SF_STANDALONE", json.dumps({"conn_type": "spark", "host": host, "port": int(port)}))
    rows = 20_000
    keys = [i * 31 + 5 for i in range(rows)]
    (tmp_path / "input").mkdir()
    for n in range(2):
        part = keys[n::2]
        pq.write_table(pa.table({"id": pa.array(part, pa.int64()), "payload": [f"v{k}".encode() for k in part]}),
                       tmp_path / "input" / f"part-{n}.parquet")
    root = f"file://{tmp_path}/snap"
    op = ShardedWriteOperator(
        task_id="write", output_uri=root, input_path=f"file://{tmp_path}/input", key_column="id",
        value_column="payload", num_dbs=8, spark_conn_id="sf_standalone", total_executor_cores=2,
        executor_memory="1g",
        spark_conf={"spark.ui.enabled": "false", "spark.pyspark.python": python_without_the_source_tree(tmp_path)},
    )
    context = {"ti": FakeTI(), "outlet_events": defaultdict(lambda: SimpleNamespace(extra=None))}
    summary = op.execute(context)

    assert summary["rows"] == rows and summary["num_dbs"] == 8
    # An application id issued by the standalone master, not a local-mode one.
    assert summary["spark_app_id"].startswith("app-"), summary["spark_app_id"]
    assert context["ti"].xcoms["spark_app_id"]["spark_app_id"] == summary["spark_app_id"]
    record = read_run_record(open_store(root), summary["run_id"])
    assert record.status == SUCCEEDED
    with ShardedReader(root) as reader:
        values = reader.multi_get(keys)
    assert values == [f"v{k}".encode() for k in keys]
