"""ShardedWriteOperator with a ``spark_connect`` connection, against a real Spark Connect server.

The server runs as its own process on loopback (started once for this module from the pip
pyspark). The operator runs the job as a Connect client in a child process of the task, exactly
as on a worker without Java: nothing here calls spark-submit for the job. Every snapshot is read
back and compared with the input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, InputDataError, RunFailedError
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.model.run_record import read_run_record
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.operators import spark_job
from tests.fault_env import set_faults
from tests.operator_helpers import connections, execute_in_thread, make_context, make_op
from tests.polling import wait_for
from tests.spark_connect_server import connect_server
from tests.spark_helpers import assert_exact, assert_reader_agrees, int_table, read_snapshot, write_parquet
from tests.stream_files import put_changes

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def connect_conn(tmp_path_factory):
    with connect_server(tmp_path_factory.mktemp("connect")) as port:
        yield {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}


@pytest.fixture
def no_spark_submit(monkeypatch):
    """The job must not go through spark-submit: fail loudly if the operator tries."""
    def refuse():
        raise AssertionError("spark-submit was used with a Spark Connect connection")
    monkeypatch.setattr(spark_job, "_submit_hook_class", refuse)


def write(monkeypatch, connect_conn, root, **kwargs):
    connections(monkeypatch, spark=connect_conn)
    context = make_context()
    op = make_op(root, aws_conn_id=None, **kwargs)
    return op, context, op.execute(context)


def test_int_keys_written_through_spark_connect_read_back_exactly(monkeypatch, tmp_path, connect_conn, no_spark_submit):
    table, expected = int_table(3_000)
    root = f"file://{tmp_path}/snap"
    op, context, summary = write(monkeypatch, connect_conn, root, input_path="file://" + write_parquet(tmp_path, table),
                                 num_dbs=4)
    assert summary["published"] is True and summary["rows"] == 3_000 and summary["num_dbs"] == 4
    assert context["ti"].xcoms["run_id"] == summary["run_id"]
    manifest, shards = read_snapshot(root)
    assert_exact(manifest, shards, expected, "u64be")
    assert_reader_agrees(root, expected, absent=[10**9])
    record = read_run_record(open_store(root), summary["run_id"])
    assert record.writer["spark_app_id"].startswith("local-") and record.writer["spark_ui_url"] is None
    # The asset event of the snapshot carries the run, as with spark-submit.
    (asset,) = [o for o in op.outlets if getattr(o, "uri", None) == root]
    assert context["outlet_events"][asset].extra["run_id"] == summary["run_id"]
    # OpenLineage, as the OpenLineage provider extracts it after the try: the input and the snapshot with its rows.
    from airflow.providers.openlineage.extractors.base import DefaultExtractor

    lineage = DefaultExtractor(op).extract_on_complete(task_instance=None)
    assert lineage is not None and [(d.namespace, d.name) for d in lineage.inputs] == [("file", f"{tmp_path}/input.parquet")]
    (out,) = lineage.outputs
    assert (out.namespace, out.name) == ("file", f"{tmp_path}/snap")
    assert out.outputFacets["outputStatistics"].rowCount == 3_000


def test_string_keys_cel_categorical_staged_then_published(monkeypatch, tmp_path, connect_conn, no_spark_submit):
    rows = 2_000
    names = [f"user-{i:05d}-é" for i in range(rows)]
    regions = [["eu", "us", "apac"][i % 3] for i in range(rows)]
    table = pa.table({"name": names, "region": regions, "payload": [f"p{i}" for i in range(rows)]})
    root = f"file://{tmp_path}/cat"
    _, _, summary = write(monkeypatch, connect_conn, root, input_path="file://" + write_parquet(tmp_path, table),
                          key_column="name", value_column="payload", num_dbs=None, cel_expr="region",
                          cel_columns={"region": "string"}, routing_values=["us", "eu", "apac"], publish=False)
    snapshots = SnapshotRoot(open_store(root))
    assert summary["published"] is False and snapshots.current() is None  # staged: nothing live
    publish_run(snapshots, run_id=summary["run_id"])
    manifest, shards = read_snapshot(root)
    order = ["us", "eu", "apac"]
    assert manifest.num_dbs == 3 and list(manifest.sharding.routing_values) == order
    expected = {n: f"p{i}".encode() for i, n in enumerate(names)}
    assert_exact(manifest, shards, expected, "utf8", router=lambda k: order.index(regions[names.index(k)]))
    assert encoding.decode_key(next(iter(shards[0])), "utf8") in expected


@pytest.mark.s3
def test_the_s3_server_as_storage(monkeypatch, tmp_path, connect_conn, s3_server, s3_root, s3_options,
                                  no_spark_submit):
    """Executors reach S3 with the cluster's own credentials (the server's environment); the client
    with the task's connection."""
    table, expected = int_table(1_500, seed=3)
    connections(monkeypatch, spark=connect_conn, aws={"conn_type": "aws", "login": "testing",
                                                      "password": "testing-secret",
                                                      "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}})
    op = make_op(s3_root, aws_conn_id="sf_aws", input_path="file://" + write_parquet(tmp_path, table), num_dbs=3)
    summary = op.execute(make_context())
    assert summary["published"] is True
    manifest, shards = read_snapshot(s3_root, s3_options)
    assert_exact(manifest, shards, expected, "u64be")


def test_a_bad_input_fails_with_the_writers_own_error(monkeypatch, tmp_path, connect_conn, no_spark_submit):
    table = pa.table({"id": pa.array([1, 2, 3, 2], pa.int64()), "payload": ["a", "b", "c", "d"]})
    root = f"file://{tmp_path}/dup"
    with pytest.raises(RunFailedError) as caught:
        write(monkeypatch, connect_conn, root, input_path="file://" + write_parquet(tmp_path, table), num_dbs=2)
    assert caught.value.error_type == InputDataError.__name__ and "duplicate key 2" in str(caught.value)
    assert SnapshotRoot(open_store(root)).current() is None


def test_deferrable_with_a_connect_connection_is_a_config_error(monkeypatch, tmp_path, connect_conn, no_spark_submit):
    table, _ = int_table(10)
    root = f"file://{tmp_path}/d"
    with pytest.raises(ConfigError, match=r"deferrable=True cannot be used with the Spark Connect connection 'sf_spark'"):
        write(monkeypatch, connect_conn, root, input_path="file://" + write_parquet(tmp_path, table), deferrable=True)
    assert list(open_store(root).list("")) == []  # refused before any run record


def test_on_kill_mid_write_marks_the_run_killed_and_publishes_nothing(monkeypatch, tmp_path, connect_conn,
                                                                      no_spark_submit):
    table, _ = int_table(2_000)
    marker, release = tmp_path / "held.pid", tmp_path / "release"
    set_faults(monkeypatch, {"hold_shard_write": {
        "db_id": 1, "attempt": 0, "marker": str(marker), "release": str(release), "seconds": 120}})
    connections(monkeypatch, spark=connect_conn)
    root = f"file://{tmp_path}/kill"
    op = make_op(root, aws_conn_id=None, input_path="file://" + write_parquet(tmp_path, table), num_dbs=4, run_id="run-killed")
    task, outcome = execute_in_thread(op)
    wait_for(marker.exists, 120, "a shard write to be held on the Connect server")
    started = time.monotonic()
    op.on_kill()
    task.join(timeout=120)
    release.touch()
    assert not task.is_alive() and "error" in outcome, outcome
    assert time.monotonic() - started < 60
    record = read_run_record(open_store(root), "run-killed")
    assert record.status == "failed" and record.error.type == "RunKilled", record.to_dict()
    assert SnapshotRoot(open_store(root)).current() is None


THIN_CLIENT_PACKAGES = ("pyspark-client=={version}", "pyarrow", "pandas>=2.2", "numpy", "xxhash", "cel-python",
                        "rocksdict", "msgspec", "boto3", "grpcio", "grpcio-status", "googleapis-common-protos", "zstandard")


@pytest.fixture(scope="module")
def thin_python(tmp_path_factory):
    """A venv with pyspark-client and the writer's libraries but not this provider's code, nor Spark's jars."""
    import pyspark

    tmp_path = tmp_path_factory.mktemp("thin")
    venv, uv = tmp_path / "thin", Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    packages = [p.format(version=pyspark.__version__) for p in THIN_CLIENT_PACKAGES]
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages], check=True)
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import importlib.util as u, pyspark, os; print(u.find_spec("
                            "'airflow_provider_shardyfusion') is None, os.path.isdir(os.path.join("
                            "os.path.dirname(pyspark.__file__), 'jars')))"], capture_output=True, text=True, check=True,
                           cwd=str(tmp_path), env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert probe.stdout.split() == ["True", "False"], probe  # no provider code, no Spark jars
    return python


@pytest.fixture(scope="module")
def thin_server(tmp_path_factory, thin_python):
    """A Connect server whose Python workers (executors, the streaming driver side) run ``thin_python``."""
    log_dir = tmp_path_factory.mktemp("thin-server")
    with connect_server(log_dir, env={"PYSPARK_PYTHON": thin_python}) as port:
        yield port, log_dir / "spark-connect-server.log"


def test_a_thin_client_and_executors_that_only_get_the_shipped_bundle(tmp_path, thin_python, thin_server):
    """What a managed Airflow worker has: pyspark-client (no jars, no Java needed) and not this provider's
    code on the executors. One venv without either plays both: the job's client process (importing the job
    from the bundle zip) and the Connect server's Python workers (importing it from addArtifacts only)."""
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.write import job_environment as job_env
    from airflow_provider_shardyfusion.submission.bundle import build_bundle
    from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, encode_config

    table, expected = int_table(2_500, seed=7)
    root = f"file://{tmp_path}/snap"
    config = build_write_config(output_uri=root, input_path="file://" + write_parquet(tmp_path, table), key_column="id",
                                value_column="payload", num_dbs=4)
    bundle = build_bundle()
    port, _ = thin_server
    job = subprocess.run(
        [thin_python, bundle.entry_script, CONFIG_ARG, encode_config(config.to_json())], capture_output=True,
        text=True, env={**os.environ, job_env.REMOTE_URL: f"sc://127.0.0.1:{port}", job_env.BUNDLE: bundle.zip_path,
                        "PYTHONPATH": bundle.zip_path}, cwd=str(tmp_path), timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    manifest, shards = read_snapshot(root)
    assert_exact(manifest, shards, expected, "u64be")


def test_a_stream_ingested_through_spark_connect_one_snapshot_per_batch(monkeypatch, tmp_path, thin_server,
                                                                         no_spark_submit):
    """StreamingSnapshotOperator with a Connect connection: its query runs from a client child of the task and
    each micro-batch is written by the server's driver, whose Python has only what the client shipped."""
    from airflow.sdk import AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.core.stream.batches import batch_run_id
    from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator

    port, server_log = thin_server
    connections(monkeypatch, spark={"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})
    source = tmp_path / "source"
    source.mkdir()
    root = f"file://{tmp_path}/snap"
    model = {k: f"v0-{k}" for k in range(300)}
    put_changes(source, 0, model)

    events: list = []

    def ingest() -> dict:
        op = StreamingSnapshotOperator(
            task_id="ingest", output_uri=root, source_path=f"file://{source}", checkpoint_location=str(tmp_path / "cp"),
            source_schema="id LONG, payload STRING, deleted BOOLEAN", source_options={"maxFilesPerTrigger": 1},
            stream_id="orders.connect", key_column="id", value_column="payload", delete_column="deleted",
            num_dbs=3, spark_conn_id="sf_spark", aws_conn_id=None)
        context = {**make_context(), "outlet_events": OutletEventAccessors()}
        result = op.execute(context)
        (alias,) = [o for o in op.outlets if isinstance(o, AssetAlias)]
        events.extend(context["outlet_events"][alias].asset_alias_events)
        return result

    first = ingest()
    assert [(b["batch_id"], b["action"], b["rows"]) for b in first["batches"]] == [(0, "written", 300)]
    changes = [({k: f"v1-{k}" for k in range(0, 60, 3)} | {500: "v1-500"}, [1, 2, 999]),
               ({1: "v2-1", 7: "v2-7"}, [0, 500])]
    for n, (upserts, deletes) in enumerate(changes, start=1):
        put_changes(source, n, upserts, deletes)
        model.update(upserts)
        for k in deletes:
            model.pop(k, None)
    second = ingest()
    assert [(b["batch_id"], b["action"]) for b in second["batches"]] == [(1, "written"), (2, "written")]
    assert second["live_run_id"] == batch_run_id("orders.connect", 2)
    with ShardedReader(root) as reader:
        keys = sorted(model)
        assert reader.multi_get(keys) == [model[k].encode() for k in keys]
        assert reader.multi_get([0, 2, 500, 999]) == [None] * 4
        assert reader.manifest.writer["batch_id"] == 2 and reader.manifest.row_count == len(model)
    # One asset event per published batch, for the snapshot's root.
    assert [e.extra["batch_id"] for e in events] == [0, 1, 2] and {e.dest_asset_key.uri for e in events} == {root}
    # The micro-batches ran on the server's driver, from the bundle the client shipped.
    assert server_log.read_text().count("micro-batch writer of stream orders.connect started on the Connect "
                                        "server from") == 2


def test_python_env_archive_becomes_the_executors_interpreter(tmp_path, thin_python):
    """A Connect server whose own Python workers have no library the writer needs (no pyarrow, no
    rocksdict): the job fails there, unless python_env_archive ships an environment that has them, which
    addArtifacts(archive=True) unpacks on the cluster and spark.sql.execution.pyspark.python runs."""
    import zipfile

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.write import job_environment as job_env
    from airflow_provider_shardyfusion.submission.bundle import build_bundle
    from airflow_provider_shardyfusion.submission.plan import CONFIG_ARG, encode_config

    uv = Path(sys.executable).parent / "uv"
    bare = tmp_path / "bare"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(bare)], check=True)
    probe = subprocess.run([str(bare / "bin" / "python"), "-c", "import pyarrow"], capture_output=True, text=True)
    assert probe.returncode != 0  # the server's Python workers cannot run the writer on their own
    # The environment to ship, as venv-pack or conda-pack would give it: the interpreter copied (Spark
    # refuses to unpack a symlink that points outside the archive) and the writer's libraries.
    env = tmp_path / "writer-env"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(env)], check=True)
    libraries = [p for p in THIN_CLIENT_PACKAGES if not p.startswith("pyspark")]
    subprocess.run([str(uv), "pip", "install", "-q", "--link-mode", "copy", "--python", str(env / "bin" / "python"),
                    *libraries], check=True)
    # A zip keeps the files' modes where the cluster unpacks it (Hadoop's tar unpacking drops the
    # executable bit); entries "bin/...", "lib/...": its root becomes <alias>/ there.
    archive = tmp_path / "writer-env.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        for path in sorted(env.rglob("*")):
            packed.write(path, str(path.relative_to(env)))
    table, expected = int_table(1_500, seed=11)
    bundle = build_bundle()

    def run(root: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        config = build_write_config(output_uri=root, input_path="file://" + write_parquet(tmp_path, table), key_column="id",
                                    value_column="payload", num_dbs=3)
        return subprocess.run(
            [thin_python, bundle.entry_script, CONFIG_ARG, encode_config(config.to_json())], capture_output=True,
            text=True, env={**os.environ, job_env.REMOTE_URL: f"sc://127.0.0.1:{port}", job_env.BUNDLE: bundle.zip_path,
                            "PYTHONPATH": bundle.zip_path, **env}, cwd=str(tmp_path), timeout=600)

    with connect_server(tmp_path, env={"PYSPARK_PYTHON": str(bare / "bin" / "python")}) as port:
        without = run(f"file://{tmp_path}/without", {})
        assert without.returncode != 0 and "ModuleNotFoundError" in without.stderr, without.stderr[-3000:]
        shipped = run(f"file://{tmp_path}/snap", {job_env.PYTHON_ENV_ARCHIVE: f"{archive}#writer_env"})
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    manifest, shards = read_snapshot(f"file://{tmp_path}/snap")
    assert_exact(manifest, shards, expected, "u64be")
