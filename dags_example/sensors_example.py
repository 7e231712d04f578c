"""Wait for a published snapshot, then confirm its writer finished cleanly, both
deferrable.

``wait_for_current`` waits until ``<output_uri>/_CURRENT`` exists and returns the
pointer (XCom); ``wait_for_run_record`` then waits for the run record of the run it
names (or of ``params.run_id``) and fails with the writer's own error if that run failed
or its writer died.

The output root comes from the DAG param ``output_uri``, defaulting to the environment
variable ``SHARDYFUSION_EXAMPLE_OUTPUT_URI`` or else the quickstart DAG's output
(``<demo dir>/ shardyfusion_quickstart/snapshot``, demo dir as in ``quickstart.py``):
after one quickstart run it succeeds at once; triggered first, it defers until the
quickstart publishes. Run it with ``python dags_example/sensors_example.py``
(``dag.test()``; triggers run in-line).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

_HERE = os.path.dirname(os.path.abspath(__file__))
if (
    _HERE not in sys.path
):  # the DAG processor has the DAGs folder on sys.path; file-path imports do not
    sys.path.append(_HERE)

from _shardyfusion_examples import snapshot_uri  # noqa: E402

from airflow_provider_shardyfusion.sensors.current import (  # noqa: E402
    CurrentSnapshotSensor,
)
from airflow_provider_shardyfusion.sensors.run_record import (  # noqa: E402
    RunRecordSensor,
)

# The quickstart's DAG id names its output folder (it is defined in quickstart.py only).
DEFAULT_OUTPUT_URI = os.environ.get("SHARDYFUSION_EXAMPLE_OUTPUT_URI") or snapshot_uri(
    "shardyfusion_quickstart"
)

with DAG(
    dag_id="shardyfusion_sensors_example",
    description=(
        "Deferrable shardyfusion sensors: wait for _CURRENT,"
        " then for the run record it names"
    ),
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["shardyfusion", "example"],
    params={
        "output_uri": Param(
            DEFAULT_OUTPUT_URI,
            type="string",
            description="snapshot root (file:// or s3://)",
        ),
        "run_id": Param(
            None,
            type=["null", "string"],
            description="run to wait for; default: the one _CURRENT names",
        ),
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
        run_id=(
            "{{ params.run_id"
            " or ti.xcom_pull(task_ids='wait_for_current')['run_id'] }}"
        ),
        deferrable=True,
        poll_interval=5,
        timeout=timedelta(minutes=30),
    )

    wait_for_current >> wait_for_run_record


if __name__ == "__main__":
    dag.test()
