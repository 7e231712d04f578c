"""OpenLineage (issue 13): each operator's ``get_openlineage_facets_on_complete`` after a real
``execute`` on a file:// snapshot (real RocksDB shards), checked with the OpenLineage provider's own
types; naming per the OpenLineage spec; and the provider stays optional and out of DAG parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.base import DefaultExtractor
from openlineage.client.event_v2 import Dataset, OutputDataset
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    lifecycle_state_change_dataset,
    output_statistics_output_dataset,
    schema_dataset,
    sql_job,
)
from openlineage.client.serde import Serde

from airflow_provider_shardyfusion import openlineage as ol
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardWriteError
from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator
from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator
from tests.operator_helpers import connections, make_context, make_op, stub_submit
from tests.snapshot_factory import build_snapshot

ROOT = Path(__file__).resolve().parents[2]

DROP = lifecycle_state_change_dataset.LifecycleStateChange.DROP
CREATE = lifecycle_state_change_dataset.LifecycleStateChange.CREATE
OVERWRITE = lifecycle_state_change_dataset.LifecycleStateChange.OVERWRITE
ROWS = [(k, {"name": f"user-{k}", "score": k * 10}) for k in range(0, 300, 7)]


def extract(op) -> OperatorLineage:
    """What the OpenLineage provider itself gets from the operator after a successful try."""
    lineage = DefaultExtractor(op).extract_on_complete(task_instance=None)
    assert lineage is not None
    return lineage


def facets_json(dataset) -> dict:
    return json.loads(Serde.to_json(dataset))


# ---- naming (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3://bucket/data/in", ("s3://bucket", "data/in")),
    ("s3a://bucket/data/in/", ("s3://bucket", "data/in")),
    ("s3://bucket", ("s3://bucket", "/")),
    ("gs://b/x/y", ("gs://b", "x/y")),
    ("file:///data/in", ("file", "/data/in")),
    ("/data/in/part-*.parquet", ("file", "/data/in")),
    ("file://host1/data", ("file://host1", "/data")),
    ("hdfs://nn:8020/warehouse/t", ("hdfs://nn:8020", "/warehouse/t")),
])
def test_locations_are_named_per_the_openlineage_spec(uri, expected):
    assert ol.location_dataset(uri) == expected


def test_tables_are_named_by_metastore_when_known():
    conf = {"spark.hadoop.hive.metastore.uris": "thrift://meta.internal:9083,thrift://meta2:9083"}
    assert ol.table_dataset("sales.orders", conf) == ("hive://meta.internal:9083", "sales.orders")
    assert ol.table_dataset("orders", conf) == ("hive://meta.internal:9083", "default.orders")
    assert ol.table_dataset("orders", None) == (ol.TABLE_FALLBACK_NAMESPACE, "default.orders")
    assert ol.table_dataset("glue.sales.orders", conf) == (ol.TABLE_FALLBACK_NAMESPACE, "glue.sales.orders")


def test_snapshot_and_run_data_names_follow_the_layout():
    assert ol.snapshot_dataset("s3a://bkt/snap/") == ("s3://bkt", "snap")
    assert ol.snapshot_dataset("/srv/snap") == ("file", "/srv/snap")
    assert ol.run_data_dataset("s3://bkt/snap", "r1") == ("s3://bkt", "snap/shards/run_id=r1")


# ---- write ---------------------------------------------------------------------------------


def writer_builds_snapshot(config):
    """What the Spark job leaves behind: real shards, manifest, succeeded record, ``_CURRENT``."""
    build_snapshot(config.output_uri, ROWS, num_dbs=4, run_id=config.run_id, key_column="id", value_format="json")


def test_write_lineage_input_to_snapshot_with_statistics_and_schema(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_submit(monkeypatch, writer_builds_snapshot)
    root = f"file://{tmp_path}/snap"
    (tmp_path / "in").mkdir()  # the write's input is checked before submitting; the stub reads none
    op = make_op(root, run_id="run-ol-1", input_path=f"file://{tmp_path}/in/", value_column=None,
                 value_columns=["name", "score"], value_format="json")
    assert op.get_openlineage_facets_on_complete(None) == OperatorLineage()  # nothing written yet
    summary = op.execute(make_context())
    with ShardedReader(root, cache_dir=str(tmp_path / "cache")) as reader:  # the snapshot is real
        assert reader.get(7) == {"name": "user-7", "score": 70}

    lineage = extract(op)
    assert lineage.inputs == [Dataset(namespace="file", name=f"{tmp_path}/in")]
    assert len(lineage.outputs) == 1
    out = lineage.outputs[0]
    assert isinstance(out, OutputDataset) and (out.namespace, out.name) == ("file", f"{tmp_path}/snap")
    stats = out.outputFacets["outputStatistics"]
    assert isinstance(stats, output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet)
    assert stats.rowCount == summary["rows"] == len(ROWS)
    assert stats.size == summary["bytes"] > 0
    assert out.facets["version"] == dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion="run-ol-1")
    schema = out.facets["schema"]
    assert isinstance(schema, schema_dataset.SchemaDatasetFacet)
    # key_encoding was left to the key type: the manifest says what the writer chose.
    assert [(f.name, f.type, f.ordinal_position) for f in schema.fields] == [
        ("id", "int", 1), ("name", None, 2), ("score", None, 3)]
    assert "u64be" in schema.fields[0].description and "JSON" in schema.fields[1].description
    assert lineage.job_facets == {}
    # The event body serializes as OpenLineage JSON.
    body = facets_json(out)
    assert body["outputFacets"]["outputStatistics"]["rowCount"] == len(ROWS)
    assert body["facets"]["schema"]["_schemaURL"].endswith("SchemaDatasetFacet")


def test_write_lineage_for_table_and_sql_inputs_and_an_unreadable_manifest(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_submit(monkeypatch, writer_builds_snapshot)
    root = f"file://{tmp_path}/snap"
    conf = {"spark.hadoop.hive.metastore.uris": "thrift://meta:9083"}
    op = make_op(root, run_id="run-ol-2", input_path=None, input_table="sales.users", spark_conf=conf,
                 value_column=None, value_columns=["name", "score"], value_format="json")
    op.execute(make_context())
    assert extract(op).inputs == [Dataset(namespace="hive://meta:9083", name="sales.users")]

    sql = make_op(root, input_path=None, input_sql="SELECT id, payload FROM raw.events", key_encoding="u32be")
    # As execute leaves it, for a run whose manifest is gone: the schema falls back to the arguments.
    sql._lineage_summary = {"run_id": "gone", "output_uri": root, "rows": 3, "bytes": 99,
                            "manifest_ref": f"{root}/manifests/missing/manifest.json"}
    lineage = extract(sql)
    assert lineage.inputs == []
    assert lineage.job_facets == {"sql": sql_job.SQLJobFacet(query="SELECT id, payload FROM raw.events")}
    fields = lineage.outputs[0].facets["schema"].fields
    assert [(f.name, f.type) for f in fields] == [("id", "int"), ("payload", "binary")]
    assert lineage.outputs[0].outputFacets["outputStatistics"].rowCount == 3


# ---- publish -------------------------------------------------------------------------------


def publish(root: str, run_id: str, **kw) -> tuple[PublishSnapshotOperator, dict]:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    op = PublishSnapshotOperator(task_id="publish", output_uri=root, run_id=run_id, **kw)
    return op, op.execute({"outlet_events": OutletEventAccessors()})


def test_publish_lineage_names_the_live_and_the_replaced_run(tmp_path):
    root = f"file://{tmp_path}/snap"
    now = layout.utc_now()
    for n, run_id in enumerate(("run-a", "run-b")):
        build_snapshot(root, [(k, f"{run_id}-{k}".encode()) for k in range(50)], num_dbs=2, run_id=run_id,
                       publish=False, published_at=now - timedelta(minutes=10 - n))

    op, _ = publish(root, "run-a")
    first = extract(op).outputs[0]
    assert (first.namespace, first.name) == ("file", f"{tmp_path}/snap")
    assert first.facets["lifecycleStateChange"].lifecycleStateChange == CREATE
    assert first.facets["version"].datasetVersion == "run-a"

    op, result = publish(root, "run-b")
    lineage = extract(op)
    assert lineage.inputs == [] and len(lineage.outputs) == 1
    live = lineage.outputs[0]
    assert live.facets["lifecycleStateChange"].lifecycleStateChange == OVERWRITE
    custom = facets_json(live)["facets"][ol.PUBLISH_FACET]
    assert custom["liveRunId"] == "run-b" and custom["previousRunId"] == "run-a"
    assert custom["manifestRef"] == result["pointer"]["manifest_ref"] and custom["rollback"] is False
    assert custom["_schemaURL"] == ol.PUBLISH_FACET_SCHEMA_URL
    with ShardedReader(root, cache_dir=str(tmp_path / "cache")) as reader:
        assert reader.get(3) == b"run-b-3"

    op, _ = publish(root, "run-b")  # already live: nothing changed, no lifecycle change
    again = extract(op).outputs[0]
    assert "lifecycleStateChange" not in again.facets and facets_json(again)["facets"][ol.PUBLISH_FACET]["moved"] is False

    op, _ = publish(root, "run-a", allow_older=True)
    back = facets_json(extract(op).outputs[0])["facets"]
    assert back["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"
    assert back[ol.PUBLISH_FACET]["rollback"] is True and back[ol.PUBLISH_FACET]["previousRunId"] == "run-b"


# ---- cleanup -------------------------------------------------------------------------------


def test_cleanup_lineage_drops_exactly_the_deleted_runs(tmp_path):
    root = f"file://{tmp_path}/snap"
    store = open_store(root)
    t = layout.utc_now()
    for n, run_id in enumerate(("old-a", "old-b", "live")):
        build_snapshot(root, [(k, f"{run_id}-{k}".encode()) for k in range(40)], num_dbs=2, run_id=run_id,
                       published_at=t - timedelta(days=3 - n))
    failed = RunRecordLifecycle(store, "failed", heartbeat_seconds=3600, clock=lambda: t - timedelta(days=2)).start()
    store.put(f"{layout.attempt_key('failed', 0, 0, 1)}/000001.sst", b"x" * 64)
    failed.fail(ShardWriteError("disk full"))
    store.put(f"{layout.attempt_key('ghost', 1, 0, 4)}/000001.sst", b"y" * 32)  # a folder without a record

    def op(**kw):
        return DeferredCleanupOperator(task_id="cleanup", output_uri=root, keep_runs=1, grace_period=0, **kw)

    dry = op(dry_run=True)
    dry.execute({})
    assert extract(dry) == OperatorLineage()  # a dry run deletes nothing

    real = op()
    report = real.execute({})
    assert report["errors"] == [] and set(report["marked_deleted"]) == {"old-a", "old-b", "failed"}
    lineage = extract(real)
    dropped = {d.name: d for d in lineage.outputs}
    assert set(dropped) == {f"{tmp_path}/snap/shards/run_id={r}" for r in ("old-a", "old-b", "failed", "ghost")}
    assert {d.namespace for d in lineage.outputs} == {"file"}
    assert all(d.facets["lifecycleStateChange"].lifecycleStateChange == DROP for d in lineage.outputs)
    # What the lineage says is gone is gone; the live run is untouched and still reads.
    left = {o.key for o in store.list("")}
    assert not [k for k in left if k.startswith(layout.SHARDS_DIR) and "run_id=live/" not in k]
    assert SnapshotRoot(store).read_run("old-a").deleted_at is not None
    with ShardedReader(root, cache_dir=str(tmp_path / "cache")) as reader:
        assert reader.get(5) == b"live-5"


def test_cleanup_lineage_of_an_abandoned_cleanup_reports_only_marked_runs():
    report = {"dry_run": False, "abandoned": True, "marked_deleted": ["r1"], "errors": [],
              "plan": {"output_uri": "s3://bkt/snap", "items": [
                  {"category": "failed_runs", "run_id": "r1"}, {"category": "orphans", "run_id": "r2"}]}}
    lineage = ol.cleanup_lineage(report)
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://bkt", "snap/shards/run_id=r1")]
    report.update(abandoned=False, errors=[{"target": "shards/run_id=r2/db=00000/attempt=00/CURRENT", "error": "x"}])
    assert [d.name for d in ol.cleanup_lineage(report).outputs] == ["snap/shards/run_id=r1"]


# ---- optional, and out of DAG parsing ---------------------------------------------------------

ISOLATION = textwrap.dedent(
    """
    import json, sys

    BLOCK = {block!r}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCK):
                raise ImportError(f"import of {{name!r}} is blocked in this test")
            return None

    def lineage_modules():
        return {{m for m in sys.modules if m.split(".")[0] == "openlineage"
                or m.startswith("airflow.providers.openlineage") or m == "airflow_provider_shardyfusion.openlineage"}}

    import airflow  # noqa: F401  (Airflow's own provider discovery reads every provider's info)

    baseline = lineage_modules()
    if BLOCK:  # from here on, as if the provider and the client were not installed
        sys.meta_path.insert(0, Blocker())
    from airflow_provider_shardyfusion.operators.cleanup import DeferredCleanupOperator
    from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator
    from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator

    out = {{"baseline": sorted(baseline), "loaded": sorted(lineage_modules() - baseline)}}
    op = ShardedWriteOperator(task_id="w", output_uri="file:///tmp/x", input_path="/in", key_column="id",
                              value_column="v", num_dbs=2)
    op._lineage_summary = {{"run_id": "r", "output_uri": "file:///tmp/x", "rows": 1, "bytes": 1,
                           "manifest_ref": "file:///tmp/x/manifests/none/manifest.json"}}
    pub = PublishSnapshotOperator(task_id="p", output_uri="file:///tmp/x", run_id="r")
    pub._lineage_result = {{"pointer": {{"run_id": "r"}}, "moved": True}}
    out["results"] = [type(o.get_openlineage_facets_on_complete(None)).__name__
                      for o in (op, pub, DeferredCleanupOperator(task_id="c", output_uri="file:///tmp/x"))]
    print(json.dumps(out))
    """
)


def run_isolated(block: tuple[str, ...]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", ISOLATION.format(block=block)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_operators_does_not_import_openlineage():
    out = run_isolated(())
    assert out["loaded"] == []
    # Only the provider's registration (what `import airflow` reads of every provider), no client.
    assert not [m for m in out["baseline"] if m.split(".")[0] == "openlineage" or m.endswith(".extractors")]
    # Installed, it answers with the provider's type once asked.
    assert out["results"] == ["OperatorLineage"] * 3


def test_without_the_openlineage_provider_the_methods_return_none():
    out = run_isolated(("openlineage", "airflow.providers.openlineage"))
    assert out["loaded"] == []
    assert out["results"] == ["NoneType"] * 3
