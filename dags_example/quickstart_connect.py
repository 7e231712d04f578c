"""Quickstart through Spark Connect: the quickstart DAG with the write running as a
Connect client.

For managed Airflow (MWAA, Cloud Composer, Astronomer), whose workers have no Java and
no Spark: the task runs the bundled job as a Spark Connect client, and the cluster
behind the Connect server does the work. The worker needs only this provider (the
apache-spark provider brings the thin ``pyspark-client``). Connection
``spark_connect_default``, e.g.::

    AIRFLOW_CONN_SPARK_CONNECT_DEFAULT='{"conn_type": "spark_connect", "host":
    "sc://connect.internal",
                                         "port": 15002, "password": "<token>", "extra":
                                         {"use_ssl": true}}'

The cluster's executors need rocksdict, xxhash, cel-python, pyarrow and msgspec: in its
image, or shipped with ``python_env_archive``. Output root:
``$SHARDYFUSION_DEMO_DIR/shardyfusion_quickstart_connect`` (a ``file://`` root works
when the Connect server runs on this machine; use ``s3://`` otherwise). Spark settings
that a Connect session cannot change at run time (``spark.ui.enabled``, executor sizes)
belong to the server's own configuration.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

from _shardyfusion_examples import build_quickstart_dag, snapshot_uri  # noqa: E402

DAG_ID = "shardyfusion_quickstart_connect"

dag = build_quickstart_dag(
    DAG_ID,
    snapshot_uri(DAG_ID),
    aws_conn_id=None,
    spark_conn_id="spark_connect_default",
    spark_conf={"spark.sql.shuffle.partitions": "16"},
    description=(
        "Generate a table, publish a 16-shard snapshot through Spark Connect,"
        " read keys back"
    ),
)


if __name__ == "__main__":
    dag.test()
