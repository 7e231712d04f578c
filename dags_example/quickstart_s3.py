"""Quickstart on S3: the quickstart DAG (built by ``_shardyfusion_examples.py``)
publishing to ``s3://``.

Output root: ``$SHARDYFUSION_DEMO_S3_URI`` (default
``s3://shardyfusion-demo/quickstart``; the bucket must exist). Storage is reached
through the ``aws_default`` connection, e.g. for an S3-compatible server on loopback::

    AIRFLOW_CONN_AWS_DEFAULT='{"conn_type": "aws", "login": "<key id>", "password":
    "<secret>",
                               "extra": {"endpoint_url": "http://127.0.0.1:9000",
                               "region_name": "us-east-1"}}'

Its credentials reach the Spark job only as environment variables of spark-submit; they
never appear in argv, logs, XCom, the manifest or the run record. The input stays a
local Parquet folder: Spark then needs no S3 connector (hadoop-aws) to read it.
"""

from __future__ import annotations

import os
import sys

# Airflow's DAG processor puts the DAGs folder on sys.path, a bare DagBag / dag.test()
# does not.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

from _shardyfusion_examples import build_quickstart_dag  # noqa: E402

S3_URI = (
    os.environ.get("SHARDYFUSION_DEMO_S3_URI") or "s3://shardyfusion-demo/quickstart"
)

dag = build_quickstart_dag(
    "shardyfusion_quickstart_s3",
    S3_URI,
    aws_conn_id="aws_default",
    description=(
        "Generate a table, publish a 16-shard RocksDB snapshot to S3, read keys back"
    ),
)


if __name__ == "__main__":
    dag.test()
