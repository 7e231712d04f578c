"""Wait for a published snapshot, then confirm its writer finished cleanly, both deferrable.

``wait_for_current`` waits until ``<output_uri>/_CURRENT`` exists and returns the pointer (XCom);
``wait_for_run_record`` then waits for the run record of the run it names (or of ``params.run_id``)
and fails with the writer's own error if that run failed or its writer died.

The output root comes from the DAG param ``output_uri``, defaulting to the environment variable
``SHARDYFUSION_EXAMPLE_OUTPUT_URI`` or ``file:///tmp/shardyfusion-example/snap``. Run it with
``python dags_example/sensors_example.py`` (``dag.test()``; triggers run in-line) once something
has published there, e.g. the quickstart DAG.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_shardyfusion.sensors.current import CurrentSnapshotSensor
from airflow_provider_shardyfusion.sensors.run_record import RunRecordSensor

DEFAULT_OUTPUT_URI = os.environ.get("SHARDYFUSION_EXAMPLE_OUTPUT_URI", "file:///tmp/shardyfusion-example/snap")

with DAG(
    dag_id="shardyfusion_sensors_example",
    description="Deferrable shardyfusion sensors: wait for _CURRENT, then for the run record it names",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["shardyfusion", "example"],
    params={
        "output_uri": Param(DEFAULT_OUTPUT_URI, type="string", description="snapshot root (file:// or s3://)"),
        "run_id": Param(None, type=["null", "string"], description="run to wait for; default: the one _CURRENT names"),
    },
) as dag:
    wait_for_current = CurrentSnapshotSensor(
        task_id="wait_for_current",
        output_uri="{{ params.output_uri }}",
        mode="exists",
        deferrable=True,
        poll_interval=5,
        timeout=timedelta(minutes=30),
    )

    wait_for_run_record = RunRecordSensor(
        task_id="wait_for_run_record",
        output_uri="{{ params.output_uri }}",
        run_id="{{ params.run_id or ti.xcom_pull(task_ids='wait_for_current')['run_id'] }}",
        deferrable=True,
        poll_interval=5,
        timeout=timedelta(minutes=30),
    )

    wait_for_current >> wait_for_run_record


if __name__ == "__main__":
    dag.test()
