"""The snapshot lifecycle: stage a write, validate it, publish it, let a consumer see
it, clean up.

    generate_input → write_snapshot (publish=False) → validate_snapshot →
    publish_snapshot
        → consumer_waits (CurrentSnapshotSensor mode="run_id") → read_back
        → cleanup_plan (dry run) → cleanup

A staged run that fails ``validate_snapshot`` never becomes live: ``publish_snapshot``
does not run and ``_CURRENT`` keeps naming the last good snapshot. Two DAGs are defined
here:

- ``shardyfusion_snapshot_lifecycle`` on ``file://<demo
  dir>/shardyfusion_snapshot_lifecycle/snapshot``;
- ``shardyfusion_snapshot_lifecycle_s3`` on ``s3://$SHARDYFUSION_S3_BUCKET/lifecycle``
  through the ``aws_default`` connection (an S3-compatible endpoint goes in its extra
  ``endpoint_url``);
- ``shardyfusion_snapshot_lifecycle_connect``: the ``file://`` one, written through the
  Spark Connect connection ``spark_connect_default`` (see ``quickstart_connect.py``).

Params: ``rows``, ``min_rows`` (the gate: set it above ``rows`` to see a staged run
refused), ``keep_runs`` and ``grace_minutes`` for the cleanup. Spark comes from
``spark_default`` (see the quickstart). The demo dir is ``$SHARDYFUSION_DEMO_DIR`` or
``<tmp>/shardyfusion-demo``; each DAG run generates its input in its own folder, so runs
may overlap. The consumer's wait (``consumer_waits_for``) and the key function come from
``_shardyfusion_examples.py`` beside this file: copy it along.
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

from _shardyfusion_examples import DEMO_DIR, consumer_waits_for, key_of  # noqa: E402

from airflow_provider_shardyfusion.operators.cleanup import (  # noqa: E402
    DeferredCleanupOperator,
)
from airflow_provider_shardyfusion.operators.publish import (  # noqa: E402
    PublishSnapshotOperator,
)
from airflow_provider_shardyfusion.operators.sharded_write import (  # noqa: E402
    ShardedWriteOperator,
)
from airflow_provider_shardyfusion.operators.validate import (  # noqa: E402
    ValidateManifestOperator,
)

NUM_DBS = 8
STAGED_RUN_ID = "{{ ti.xcom_pull(task_ids='write_snapshot')['run_id'] }}"


def value_of(key: int, generation: str) -> str:
    return f"value-{key}-{generation}"


def build_lifecycle_dag(
    dag_id: str,
    output_uri: str,
    *,
    aws_conn_id: str | None,
    spark_conn_id: str = "spark_default",
) -> DAG:
    with DAG(
        dag_id=dag_id,
        description=(
            "Stage a snapshot, validate it, publish it,"
            " wait for it as a consumer, clean up"
        ),
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["shardyfusion", "example", "lifecycle"],
        params={
            "rows": Param(
                20_000, type="integer", minimum=1, description="rows to generate"
            ),
            "min_rows": Param(
                1,
                type="integer",
                minimum=0,
                description="validation gate: fewest rows allowed",
            ),
            "keep_runs": Param(
                3,
                type="integer",
                minimum=1,
                description="succeeded runs the cleanup keeps",
            ),
            "grace_minutes": Param(
                60,
                type="integer",
                minimum=0,
                description="cleanup leaves younger runs alone",
            ),
        },
        render_template_as_native_obj=True,
    ) as dag:

        @task
        def generate_input(
            params: dict[str, Any] | None = None, run_id: str | None = None
        ) -> str:
            import pyarrow as pa
            import pyarrow.parquet as pq

            rows = int((params or {})["rows"])
            # One folder per DAG run: overlapping runs must not read each other's files.
            path = os.path.join(
                DEMO_DIR,
                dag_id,
                "input",
                str(run_id).replace(":", "_").replace("+", "_"),
            )
            os.makedirs(path, exist_ok=True)
            keys = [key_of(i) for i in range(rows)]
            table = pa.table(
                {
                    "id": pa.array(keys, pa.int64()),
                    "value": pa.array(
                        [value_of(k, str(run_id)) for k in keys], pa.string()
                    ),
                }
            )
            pq.write_table(table, os.path.join(path, "part-00000.parquet"))
            return f"file://{path}"  # inputs name their scheme: a bare path is refused

        write = ShardedWriteOperator(
            task_id="write_snapshot",
            output_uri=output_uri,
            input_path=generate_input(),
            key_column="id",
            value_column="value",
            num_dbs=NUM_DBS,
            publish=False,
            spark_conn_id=spark_conn_id,
            # A Spark Connect session can change SQL settings only; the UI is the
            # server's business.
            spark_conf={"spark.sql.shuffle.partitions": str(NUM_DBS)}
            | (
                {}
                if spark_conn_id.startswith("spark_connect")
                else {"spark.ui.enabled": "false"}
            ),
            aws_conn_id=aws_conn_id,
        )

        validate = ValidateManifestOperator(
            task_id="validate_snapshot",
            output_uri=output_uri,
            run_id=STAGED_RUN_ID,
            min_rows="{{ params.min_rows }}",
            max_row_change_ratio=0.5,
            max_empty_shards=0,
            max_shard_skew=2.0,
            sample_lookups=16,
            expected_keys=[key_of(0), key_of(1)],
            aws_conn_id=aws_conn_id,
        )

        publish = PublishSnapshotOperator(
            task_id="publish_snapshot",
            output_uri=output_uri,
            run_id=STAGED_RUN_ID,
            aws_conn_id=aws_conn_id,
        )

        consumer = consumer_waits_for(
            "consumer_waits", output_uri, STAGED_RUN_ID, aws_conn_id=aws_conn_id
        )

        @task
        def read_back(
            pointer: dict[str, Any], params: dict[str, Any] | None = None
        ) -> dict[str, Any]:
            from airflow_provider_shardyfusion.hooks.shardyfusion import (
                ShardyfusionHook,
            )

            rows = int((params or {})["rows"])
            keys = [
                key_of(0),
                key_of(rows // 2),
                key_of(rows - 1),
                7,
            ]  # 7 is never written
            with ShardyfusionHook(aws_conn_id=aws_conn_id).get_reader(
                output_uri
            ) as reader:
                values = reader.multi_get(keys)
                found = {
                    str(k): v.decode() if isinstance(v, bytes) else v
                    for k, v in zip(keys, values, strict=True)
                }
                return {"run_id": reader.run_id, "lookups": found}

        cleanup_args = dict(
            output_uri=output_uri,
            keep_runs="{{ params.keep_runs }}",
            grace_period="{{ macros.timedelta(minutes=params.grace_minutes) }}",
            aws_conn_id=aws_conn_id,
        )
        plan = DeferredCleanupOperator(
            task_id="cleanup_plan", dry_run=True, **cleanup_args
        )
        cleanup = DeferredCleanupOperator(task_id="cleanup", **cleanup_args)

        validate >> publish >> consumer
        read_back(consumer.output) >> plan >> cleanup
        write >> validate
    return dag


lifecycle = build_lifecycle_dag(
    "shardyfusion_snapshot_lifecycle",
    f"file://{DEMO_DIR}/shardyfusion_snapshot_lifecycle/snapshot",
    aws_conn_id=None,
)
lifecycle_s3 = build_lifecycle_dag(
    "shardyfusion_snapshot_lifecycle_s3",
    f"s3://{os.environ.get('SHARDYFUSION_S3_BUCKET', 'shardyfusion-demo')}/lifecycle",
    aws_conn_id="aws_default",
)
lifecycle_connect = build_lifecycle_dag(
    "shardyfusion_snapshot_lifecycle_connect",
    f"file://{DEMO_DIR}/shardyfusion_snapshot_lifecycle_connect/snapshot",
    aws_conn_id=None,
    spark_conn_id="spark_connect_default",
)
