"""Roll the live snapshot back, then forward again:
``PublishSnapshotOperator(allow_older=True)``.

    find_target → roll_back (allow_older=True) → consumer_sees_rollback
    (CurrentSnapshotSensor, from ``_shardyfusion_examples.consumer_waits_for``)

``find_target`` picks the run to go back to: ``params.to_run_id`` if given, else the run
the live pointer replaced (``_CURRENT``'s ``previous_run_id``). Rolling forward is the
same operator with the newer run id (``allow_older`` is then not needed). Without
``allow_older=True`` a publish of an older run is refused and ``_CURRENT`` stays where
it was.

Needs ``_shardyfusion_examples.py`` beside it (copy it along). Runs on the lifecycle
example's root: ``file://<demo dir>/shardyfusion_snapshot_lifecycle/snapshot`` (override
with ``params.output_uri``).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task

_HERE = os.path.dirname(os.path.abspath(__file__))
if (
    _HERE not in sys.path
):  # the DAG processor has the DAGs folder on sys.path; file-path imports do not
    sys.path.append(_HERE)

from _shardyfusion_examples import DEMO_DIR, consumer_waits_for  # noqa: E402

from airflow_provider_shardyfusion.operators.publish import (  # noqa: E402
    PublishSnapshotOperator,
)

DEFAULT_ROOT = f"file://{DEMO_DIR}/shardyfusion_snapshot_lifecycle/snapshot"
TARGET = "{{ ti.xcom_pull(task_ids='find_target') }}"

with DAG(
    dag_id="shardyfusion_snapshot_rollback",
    description="Move _CURRENT back to an older run (or forward to a newer one)",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["shardyfusion", "example", "lifecycle"],
    params={
        "output_uri": Param(
            DEFAULT_ROOT, type="string", description="the snapshot root"
        ),
        "to_run_id": Param(
            None,
            type=["null", "string"],
            description="run to publish (default: the previous one)",
        ),
    },
) as dag:

    @task
    def find_target(params: dict[str, Any] | None = None) -> str:
        from airflow_provider_shardyfusion.core.errors import PublishManifestError
        from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook

        params = params or {}
        if params.get("to_run_id"):
            return str(params["to_run_id"])
        pointer = ShardyfusionHook(aws_conn_id=None).read_current(params["output_uri"])
        if pointer is None or pointer.previous_run_id is None:
            raise PublishManifestError(
                f"{params['output_uri']}: no earlier published run to roll back to"
            )
        return pointer.previous_run_id

    roll_back = PublishSnapshotOperator(
        task_id="roll_back",
        output_uri="{{ params.output_uri }}",
        run_id=TARGET,
        allow_older=True,
        aws_conn_id=None,
    )
    seen = consumer_waits_for(
        "consumer_sees_rollback",
        "{{ params.output_uri }}",
        TARGET,
        aws_conn_id=None,
        timeout=300,
    )
    find_target() >> roll_back >> seen
