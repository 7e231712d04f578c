"""Delta snapshots: a daily full write, hourly deltas on it, and a compaction (SPEC
§13).

Three DAGs share one snapshot root, ``file://<demo dir>/shardyfusion_delta/snapshot``:

- ``shardyfusion_delta_full`` (daily): writes the whole table (``rows`` rows) and
  publishes it; a chain starts on a full snapshot.

      generate_table → write_full

- ``shardyfusion_delta_hourly`` (hourly): writes only what changed since the live
  snapshot, checks it, and publishes it on top of it. The change table holds upserts and
  deletions (``deleted`` is true); readers then download only the new layers.

      generate_changes
        → write_delta (write_mode="delta", publish=False)
        → validate_delta (max_delta_ratio, the deleted keys must read None,
                          upserted keys must be there)
        → publish_delta (refused unless _CURRENT still names the delta's base)
        → read_back

- ``shardyfusion_delta_compact`` (weekly): merges every shard's layers into one full
  layer (same data, chain depth 0), then cleans up; the runs whose layers the kept runs
  read stay.

      compact_snapshot (write_mode="compact") → cleanup

The changes are deterministic: batch ``b`` (Param ``batch``; default the hours since the
epoch of the run) of ``changes`` rows on a table of ``rows`` rows updates ``changes //
2`` existing keys, deletes ``changes // 4`` more, inserts ``changes // 4`` new ones and
deletes one key that was never written. Consecutive batches overlap by half a window, so
a batch re-inserts keys the previous one deleted. Full writes here regenerate the
starting table (a real daily full write reads the source table, which already holds the
day's changes).

Spark comes from ``spark_default`` (see the quickstart). The demo dir is
``$SHARDYFUSION_DEMO_DIR`` or ``<tmp>/shardyfusion-demo``; each DAG run generates its
input in its own folder.
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator
from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from airflow_provider_shardyfusion.operators.validate import ValidateManifestOperator

DEMO_DIR = os.path.abspath(
    os.environ.get("SHARDYFUSION_DEMO_DIR")
    or os.path.join(tempfile.gettempdir(), "shardyfusion-demo")
)
OUTPUT_URI = f"file://{DEMO_DIR}/shardyfusion_delta/snapshot"
NUM_DBS = 8
DEFAULT_ROWS = 20_000
DEFAULT_CHANGES = 1_000
SPARK_CONF = {"spark.sql.shuffle.partitions": str(NUM_DBS), "spark.ui.enabled": "false"}
STAGED_RUN_ID = "{{ ti.xcom_pull(task_ids='write_delta')['run_id'] }}"


# ---- the data: a pure function of (rows, changes, batch); a test rebuilds it ----


def key_of(i: int) -> int:
    """Row ``i``'s key: spread out, non-negative (the default ``u64be`` encoding).

    Every key is ≡ 13 mod 7919.
    """
    return i * 7919 + 13


def never_written_key(batch: int) -> int:
    """A key no row ever has (≡ 5 mod 7919): its deletion is counted as
    ``deleted_absent``."""
    return batch * 7919 + 5


def value_of(key: int, batch: int) -> str:
    """The value ``key`` gets from batch ``batch`` (0: the full table)."""
    return f"value-{key}-b{batch}"


def full_table(rows: int) -> dict[int, str]:
    return {key_of(i): value_of(key_of(i), 0) for i in range(rows)}


def batch_changes(
    rows: int, changes: int, batch: int
) -> tuple[dict[int, str], list[int]]:
    """Batch ``batch``'s upserts (key → value) and deleted keys.

    A window of ``3 * (changes // 4)`` rows of the starting table, starting at ``batch *
    (changes // 2)`` (wrapping): its first ``2 * (changes // 4)`` keys are updated, the
    rest deleted; ``changes // 4`` keys past the table are inserted, new in every batch;
    and ``never_written_key(batch)`` is deleted.
    """
    quarter = changes // 4
    if batch < 1 or quarter < 1 or 3 * quarter > rows:
        raise ValueError(
            f"batch {batch} of {changes} changes on {rows} rows: need batch >= 1 and "
            "4 <= changes <= 4/3 rows"
        )
    start = batch * (changes // 2)
    window = [key_of((start + j) % rows) for j in range(3 * quarter)]
    inserted = [key_of(rows + (batch - 1) * quarter + j) for j in range(quarter)]
    upserts = {k: value_of(k, batch) for k in [*window[: 2 * quarter], *inserted]}
    deletes = [*window[2 * quarter :], never_written_key(batch)]
    return upserts, deletes


def input_dir(dag_id: str, run_id: str) -> str:
    """One folder per DAG run (Airflow run ids hold ':' and '+': kept out of paths)."""
    return os.path.join(
        DEMO_DIR, dag_id, "input", re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
    )


def write_parquet(
    path: str,
    keys: list[int],
    values: list[str | None],
    deleted: list[bool] | None = None,
) -> str:
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    columns: dict[str, Any] = {
        "id": pa.array(keys, pa.int64()),
        "value": pa.array(values, pa.string()),
    }
    if deleted is not None:
        columns["deleted"] = pa.array(deleted, pa.bool_())
    pq.write_table(pa.table(columns), os.path.join(path, "part-00000.parquet"))
    return path


def batch_of(params: dict[str, Any], dag_run: Any) -> int:
    """``params.batch``, else the hours since the epoch when the run was due (one batch
    per hourly run)."""
    if params.get("batch") is not None:
        return int(params["batch"])
    return int(dag_run.run_after.timestamp() // 3600)


# ---- the DAGs ------------------------------------------------------------------------


def _read(keys: list[int]) -> dict[str, Any]:
    """Read ``keys`` from the live snapshot through ``ShardedReader``: its run, chain
    and values."""
    from airflow_provider_shardyfusion import ShardedReader

    with ShardedReader(OUTPUT_URI) as reader:
        values = reader.multi_get(keys)
        manifest = reader.manifest
        return {
            "run_id": reader.run_id,
            "write_mode": manifest.write_mode,
            "chain_depth": manifest.chain_depth,
            "base_run_id": manifest.base_run_id,
            "rows": manifest.row_count,
            "lookups": {
                str(k): v.decode() if isinstance(v, bytes) else v
                for k, v in zip(keys, values, strict=True)
            },
        }


with DAG(
    dag_id="shardyfusion_delta_full",
    description=(
        "Write and publish the whole table: the full snapshot a delta chain starts on"
    ),
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["shardyfusion", "example", "delta"],
    params={
        "rows": Param(
            DEFAULT_ROWS, type="integer", minimum=1, description="rows of the table"
        )
    },
    render_template_as_native_obj=True,
) as full_dag:

    @task
    def generate_table(
        params: dict[str, Any] | None = None, run_id: str | None = None
    ) -> str:
        table = full_table(int((params or {})["rows"]))
        path = write_parquet(
            input_dir("shardyfusion_delta_full", str(run_id)),
            list(table),
            list(table.values()),
        )
        return f"file://{path}"  # inputs name their scheme: a bare path is refused

    ShardedWriteOperator(
        task_id="write_full",
        output_uri=OUTPUT_URI,
        input_path=generate_table(),
        key_column="id",
        value_column="value",
        num_dbs=NUM_DBS,
        spark_conf=SPARK_CONF,
        aws_conn_id=None,
    )


with DAG(
    dag_id="shardyfusion_delta_hourly",
    description=(
        "Write only the changed rows on the live snapshot, validate them, publish them"
    ),
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # a delta is written on the live snapshot: one at a time
    tags=["shardyfusion", "example", "delta"],
    params={
        "rows": Param(
            DEFAULT_ROWS,
            type="integer",
            minimum=1,
            description="rows of the full table",
        ),
        "changes": Param(
            DEFAULT_CHANGES,
            type="integer",
            minimum=4,
            description="changed rows per batch",
        ),
        "batch": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description=(
                "the batch to apply (default: hours since the epoch of the run)"
            ),
        ),
        "max_delta_ratio": Param(
            0.1,
            type="number",
            minimum=0,
            description="validation gate: (puts + deletes) / base rows",
        ),
        "max_chain_depth": Param(
            16,
            type="integer",
            minimum=1,
            description="a delta on a base this deep is written compacted",
        ),
    },
    render_template_as_native_obj=True,
) as hourly_dag:

    @task(multiple_outputs=True)
    def generate_changes(
        params: dict[str, Any] | None = None,
        run_id: str | None = None,
        dag_run: Any = None,
    ) -> dict[str, Any]:
        params = params or {}
        batch = batch_of(params, dag_run)
        upserts, deletes = batch_changes(
            int(params["rows"]), int(params["changes"]), batch
        )
        keys = [*upserts, *deletes]
        path = write_parquet(
            input_dir("shardyfusion_delta_hourly", str(run_id)),
            keys,
            [*upserts.values(), *[None] * len(deletes)],
            deleted=[False] * len(upserts) + [True] * len(deletes),
        )
        return {
            "path": f"file://{path}",
            "batch": batch,
            "upserted_keys": list(upserts),
            "deleted_keys": deletes,
        }

    changes = generate_changes()

    write_delta = ShardedWriteOperator(
        task_id="write_delta",
        output_uri=OUTPUT_URI,
        input_path=changes["path"],
        key_column="id",
        value_column="value",
        # num_dbs, sharding and encodings come from the base snapshot.
        write_mode="delta",
        delete_column="deleted",
        max_chain_depth="{{ params.max_chain_depth }}",
        publish=False,
        spark_conf=SPARK_CONF,
        aws_conn_id=None,
    )

    validate = ValidateManifestOperator(
        task_id="validate_delta",
        output_uri=OUTPUT_URI,
        run_id=STAGED_RUN_ID,
        max_delta_ratio="{{ params.max_delta_ratio }}",
        expected_keys=changes["upserted_keys"],
        absent_keys=changes["deleted_keys"],
        aws_conn_id=None,
    )

    publish = PublishSnapshotOperator(
        task_id="publish_delta",
        output_uri=OUTPUT_URI,
        run_id=STAGED_RUN_ID,
        aws_conn_id=None,
    )

    @task
    def read_back(
        published: dict[str, Any], upserted: list[int], deleted: list[int]
    ) -> dict[str, Any]:
        live = published["pointer"]["run_id"]
        out = _read([*upserted[:2], *upserted[-2:], *deleted[:2], deleted[-1]])
        if out["run_id"] != live:
            raise RuntimeError(
                f"read run {out['run_id']!r}, but publish_delta made {live!r} live"
            )
        return out

    write_delta >> validate >> publish
    read_back(publish.output, changes["upserted_keys"], changes["deleted_keys"])


with DAG(
    dag_id="shardyfusion_delta_compact",
    description="Merge the live chain into one full layer per shard, then clean up",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["shardyfusion", "example", "delta"],
    params={
        "keep_runs": Param(
            3, type="integer", minimum=1, description="succeeded runs the cleanup keeps"
        ),
        "grace_minutes": Param(
            60,
            type="integer",
            minimum=0,
            description="cleanup leaves younger runs alone",
        ),
    },
    render_template_as_native_obj=True,
) as compact_dag:
    compact = ShardedWriteOperator(
        task_id="compact_snapshot",
        output_uri=OUTPUT_URI,
        write_mode="compact",  # no input: the live snapshot's layers, merged
        spark_conf=SPARK_CONF,
        aws_conn_id=None,
    )

    cleanup = DeferredCleanupOperator(
        task_id="cleanup",
        output_uri=OUTPUT_URI,
        keep_runs="{{ params.keep_runs }}",
        grace_period="{{ macros.timedelta(minutes=params.grace_minutes) }}",
        aws_conn_id=None,
    )

    compact >> cleanup
