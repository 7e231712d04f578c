"""``ShardedWriteOperator`` and its bundle without running Spark (SPEC §2, §8, §8.1).

spark-submit is replaced by a stub that plays the writer's part on a real local store (it writes
the run record the Spark job would write), so each outcome the operator must handle is exercised
exactly: success, the writer's failure, the job refusing its config, spark-submit dying early,
deferral. The real submission runs in the e2e / integration tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset, AssetAlias

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    InputDataError,
    PublishManifestError,
    RunRecordError,
    ShardyfusionError,
)
from airflow_provider_shardyfusion.core.model.config import WriteConfig, build_write_config
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RUNNING, SUCCEEDED, RunError, read_run_record
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.operators import sharded_write as sw
from airflow_provider_shardyfusion.operators import spark_job
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator, SparkSubmitError
from airflow_provider_shardyfusion.submission import bundle as bundle_mod
from tests.operator_helpers import FakeTI, connections, make_context, make_op, stub_submit
from tests.polling import FakeClock
from tests.snapshot_helpers import publish_snapshot, publish_written_run, write_run_record

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts"  # the two spark-submit applications
SECRET = "UnitTestSecretKey/4f1c9e0b7a"
YARN_CLUSTER = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}


# ---- helpers ---------------------------------------------------------------------------------


def job_record(config: WriteConfig, status: str, **kw) -> None:
    """A run record as the Spark job writes it: ``writer.airflow`` names the try that submitted it."""
    store = open_store(config.output_uri)
    record = write_run_record(store, config.run_id, status, **kw)
    record = dataclasses.replace(record, writer={"airflow": config.airflow_context})
    store.put(layout.run_record_key(config.run_id), record.to_bytes())


STATS = {"rows": 1000, "bytes": 4096, "num_dbs": 4, "empty_shards": 1, "shards_written": 3, "attempts_seen": 3}


def writer_succeeds(config: WriteConfig):
    """What the Spark job leaves behind on success: manifest, ``_CURRENT``, a succeeded run record."""
    store = open_store(config.output_uri)
    publish_snapshot(store, config.run_id)
    record = read_run_record(store, config.run_id)
    record = dataclasses.replace(record, num_dbs=4, stats=STATS, writer={"spark_app_id": "local-123",
                                                                                "spark_ui_url": "http://10.0.0.5:4040"})
    store.put(layout.run_record_key(config.run_id), record.to_bytes())


# ---- constructor -----------------------------------------------------------------------------


def test_every_user_argument_is_templated_and_assigned_verbatim():
    params = [p for p in inspect.signature(ShardedWriteOperator.__init__).parameters.values()
              if p.kind is p.KEYWORD_ONLY]
    not_templated = {"deferrable", "poll_interval", "deferral_timeout"}
    assert {p.name for p in params} - not_templated == set(ShardedWriteOperator.template_fields)
    # Templates render after __init__: any value (even an invalid one) must be kept exactly as given.
    values = {name: object() for name in ShardedWriteOperator.template_fields}
    values["output_uri"] = "{{ var.value.snapshot_root }}"
    op = ShardedWriteOperator(task_id="t", **values)
    for name, value in values.items():
        assert getattr(op, name) is value, name


def test_signature_matches_spec_8_1_defaults():
    sig = inspect.signature(ShardedWriteOperator.__init__).parameters
    expected = dict(input_path=None, input_format="parquet", input_options=None, input_table=None, input_sql=None,
                    key_column="id", value_column=None, value_columns=None, value_format=None, num_dbs=None,
                    max_keys_per_shard=None, cel_expr=None, cel_columns=None, routing_values=None,
                    infer_routing_values=False, key_encoding=None, run_id=None, batch_size=50_000,
                    verify_routing=True, sample_size=20, cache_input=False, sort_within_partitions=True,
                    max_writes_per_second=None, max_write_bytes_per_second=None, shard_retry=None,
                    spark_conn_id="spark_default", spark_conf=None, spark_env_vars=None, python_env_archive=None,
                    aws_conn_id="aws_default", deferrable=False)
    assert {k: sig[k].default for k in expected} == expected
    assert sig["output_uri"].default is inspect.Parameter.empty


def test_output_uri_becomes_an_outlet_asset_unless_templated():
    op = make_op("file:///data/out/")
    assert [o for o in op.outlets if isinstance(o, Asset)] == [Asset("file:///data/out")]
    assert make_op("s3://bucket-{{ ds_nodash }}/x").outlets == []
    mine = Asset("s3://other-bucket/x")
    assert make_op("file:///data/out", outlets=[mine]).outlets == [mine, Asset("file:///data/out")]


# ---- validation before Spark -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"num_dbs": 0}, "num_dbs"),
        ({"input_path": None}, "input_path"),
        ({"value_format": "xml"}, "xml"),
        ({"run_id": "bad/run"}, "run_id"),
        ({"output_uri": "ftp://x/y"}, "output_uri"),
        ({"batch_size": -1}, "batch_size"),
        ({"spark_conf": ["not", "a", "mapping"]}, "spark_conf"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"poll_interval": float("nan")}, "poll_interval nan must be a finite number"),
        ({"poll_interval": float("inf")}, "poll_interval inf must be a finite number"),
        ({"spark_conf": "{'spark.x': 1"}, r"spark_conf .* must be a mapping of string keys; .*native_obj=True"),
        ({"input_options": "header=true"}, r"input_options 'header=true' must be a mapping of string keys; "),
    ],
)
def test_bad_argument_fails_naming_it_before_any_submit(monkeypatch, tmp_path, override, named):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    monkeypatch.setattr(bundle_mod, "build_bundle", lambda *a, **k: pytest.fail("bundle built for a bad config"))
    op = make_op(f"file://{tmp_path}/snap", **override)
    with pytest.raises(ConfigError, match=named):
        op.execute(make_context())
    assert seen.calls == []


# ---- success / failure through the run record ------------------------------------------------


def test_success_returns_summary_from_the_run_record_and_emits_asset_event(monkeypatch, tmp_path):
    connections(monkeypatch)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    op = make_op(root, run_id="run-ok-1", spark_env_vars={"MY_FLAG": "1"}, executor_memory="2g")
    ctx = make_context()
    summary = op.execute(ctx)

    assert set(summary) == {"run_id", "output_uri", "manifest_ref", "run_record_ref", "num_dbs", "rows", "bytes",
                            "empty_shards", "spark_app_id", "published"}
    assert summary["published"] is True
    assert summary["run_id"] == "run-ok-1" and summary["spark_app_id"] == "local-123"
    assert (summary["num_dbs"], summary["rows"], summary["bytes"], summary["empty_shards"]) == (4, 1000, 4096, 1)
    assert summary["run_record_ref"] == f"{root}/runs/run_id=run-ok-1/run.json"
    assert summary["manifest_ref"].startswith(f"{root}/manifests/")
    json.dumps(summary)  # XCom-safe
    assert ctx["outlet_events"][Asset(root)].extra == summary
    assert ctx["ti"].xcoms["run_id"] == "run-ok-1"
    # The extra link's data: the application id and the UI address the driver reported.
    assert ctx["ti"].xcoms["spark_app_id"] == {"spark_app_id": "local-123", "url": "http://10.0.0.5:4040"}

    call = seen.last
    config = call["config"]
    assert config.run_id == "run-ok-1" and config.sharding.num_dbs == 4
    assert config.airflow_context == {"dag_id": "dag_x", "task_id": "write", "run_id": "manual__1",
                                      "try_number": 2, "map_index": -1}
    cmd = call["cmd"]
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert cmd[cmd.index("--executor-memory") + 1] == "2g"
    py_files = cmd[cmd.index("--py-files") + 1]
    assert py_files.endswith("bundle.zip") and zipfile.is_zipfile(py_files)
    assert call["application"].endswith("sharded_write_job.py") and Path(call["application"]).is_file()
    assert call["env"]["MY_FLAG"] == "1"
    assert call["env"]["PYSPARK_PYTHON"] == sys.executable  # workers must import the same packages


def writer_stages(config: WriteConfig):
    """What the Spark job leaves behind with publish=False: manifest and a succeeded record, no _CURRENT."""
    store = open_store(config.output_uri)
    key = layout.manifest_key(config.run_id, layout.utc_now())
    store.put(key, b"{}")
    record = write_run_record(store, config.run_id, SUCCEEDED, manifest_ref=store.uri(key))
    store.put(layout.run_record_key(config.run_id), dataclasses.replace(record, stats=STATS).to_bytes())


def test_publish_false_stages_the_run_without_an_asset_event(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_stages)
    root = f"file://{tmp_path}/snap"
    op = make_op(root, run_id="run-staged", publish=False)
    assert not [o for o in op.outlets if isinstance(o, (Asset, AssetAlias))]  # nothing goes live: no event
    ctx = make_context()
    summary = op.execute(ctx)
    assert seen.last["config"].options.publish is False  # the job is told to leave _CURRENT alone
    assert summary["published"] is False and summary["run_id"] == "run-staged" and summary["rows"] == 1000
    assert summary["manifest_ref"].startswith(f"{root}/manifests/")
    assert not ctx["outlet_events"]
    assert not open_store(root).exists(layout.CURRENT_KEY)


def test_a_write_superseded_by_a_newer_live_run_succeeds_staged(monkeypatch, tmp_path, caplog):
    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"

    def newer_run_goes_live_first(config: WriteConfig):
        store = open_store(config.output_uri)
        publish_written_run(store, "run-newer", started_minutes_ago=0)
        # This run started earlier: the never-backwards rule keeps it staged, and its job ends well.
        publish_written_run(store, config.run_id, started_minutes_ago=10, writer={"airflow": config.airflow_context})

    stub_submit(monkeypatch, newer_run_goes_live_first)
    ctx = make_context()
    summary = make_op(root, run_id="run-older").execute(ctx)
    assert summary["published"] is False and summary["superseded_by"] == "run-newer"
    assert summary["run_id"] == "run-older"
    # Airflow emits a declared outlet's event on every success; its extra tells consumers this run is not live.
    assert ctx["outlet_events"][Asset(root)].extra == summary
    assert json.loads(open_store(root).get(layout.CURRENT_KEY).data)["run_id"] == "run-newer"
    assert "stays staged" in caplog.text and "allow_older=True" in caplog.text


def test_a_succeeded_run_that_never_went_live_fails_after_the_pointer_settle_time(monkeypatch, tmp_path):
    from airflow_provider_shardyfusion.core.lifecycle.run_outcome import POINTER_SETTLE

    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"
    stub_submit(monkeypatch, lambda config: publish_written_run(
        open_store(config.output_uri), config.run_id, live=False, writer={"airflow": config.airflow_context}))
    op = make_op(root, run_id="run-lost", poll_interval=0.1)
    clock = FakeClock()
    op._clock, op._sleep = clock, clock.sleep
    with pytest.raises(PublishManifestError, match=r"run 'run-lost' was written completely .* did not go live: "
                                                   r"_CURRENT at .* does not exist"):
        op.execute(make_context())
    assert sum(clock.slept) == pytest.approx(POINTER_SETTLE.total_seconds(), abs=1.0)


def test_a_waiter_that_sees_succeeded_before_the_pointer_moved_waits_for_the_move(monkeypatch, tmp_path):
    """The writer records ``succeeded`` just before moving ``_CURRENT``; a deferred or re-attached
    operator may read the record in between and must not call the run a failure."""
    import threading

    from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"

    def record_then_move_later(config: WriteConfig):
        store = open_store(config.output_uri)
        publish_written_run(store, config.run_id, live=False, writer={"airflow": config.airflow_context})
        mover = threading.Timer(1.0, lambda: publish_run(SnapshotRoot(store), run_id=config.run_id))
        mover.start()

    stub_submit(monkeypatch, record_then_move_later)
    ctx = make_context()
    summary = make_op(root, run_id="run-slow", poll_interval=0.2).execute(ctx)
    assert summary["published"] is True and "superseded_by" not in summary
    assert ctx["outlet_events"][Asset(root)].extra == summary
    assert json.loads(open_store(root).get(layout.CURRENT_KEY).data)["run_id"] == "run-slow"


def test_templated_publish_emits_the_event_through_an_alias_only_when_published(monkeypatch, tmp_path):
    from airflow.sdk.execution_time.context import OutletEventAccessors

    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"
    for rendered, behaviour, events in ((True, writer_succeeds, 1), (False, writer_stages, 0)):
        stub_submit(monkeypatch, behaviour)
        op = make_op(root, publish="{{ params.go_live }}")
        aliases = [o for o in op.outlets if isinstance(o, AssetAlias)]
        assert len(aliases) == 1 and not [o for o in op.outlets if isinstance(o, Asset)]
        op.publish = rendered  # what render_template_as_native_obj gives
        ctx = {**make_context(), "outlet_events": OutletEventAccessors()}
        summary = op.execute(ctx)
        added = ctx["outlet_events"][aliases[0]].asset_alias_events
        assert summary["published"] is rendered and len(added) == events
        if events:
            assert added[0].dest_asset_key.uri == root and added[0].extra == summary


def test_generated_run_ids_are_fresh_per_execute(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    op = make_op(f"file://{tmp_path}/snap")
    first, second = op.execute(make_context())["run_id"], op.execute(make_context())["run_id"]
    assert first != second and op.run_id is None
    assert [c["config"].run_id for c in seen.calls] == [first, second]
    layout.validate_run_id(first)


def test_writer_failure_raises_the_writers_type_and_message(monkeypatch, tmp_path):
    connections(monkeypatch)
    message = "column 'id': duplicate key 42 (rule: keys must be unique; allow_duplicate_keys=True to keep the last)"

    def writer_fails(config):
        write_run_record(open_store(config.output_uri), config.run_id, FAILED,
                         error=RunError("InputDataError", message, "Traceback ... InputDataError"))
        return ["some spark log line", f"shardyfusion job failed: InputDataError: {message}"]

    stub_submit(monkeypatch, writer_fails)
    with pytest.raises(InputDataError) as info:
        make_op(f"file://{tmp_path}/snap").execute(make_context())
    assert str(info.value) == message


def test_unknown_writer_error_type_keeps_its_name(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_submit(monkeypatch, lambda c: write_run_record(open_store(c.output_uri), c.run_id, FAILED,
                                                        error=RunError("Py4JJavaError", "Java heap space")))
    with pytest.raises(ShardyfusionError, match=r"^Py4JJavaError: Java heap space$"):
        make_op(f"file://{tmp_path}/snap").execute(make_context())


def failing_submit(monkeypatch, lines, returncode):
    """spark-submit that prints ``lines`` and exits with ``returncode`` as the spark provider reports it."""
    from airflow.exceptions import AirflowException

    hook_cls = spark_job._submit_hook_class

    def factory():
        class Failing(hook_cls()):
            def submit(self, application="", **kwargs):
                cmd = self._build_spark_submit_command(application)
                for line in lines:
                    self.output_tail.append(self.redacted(line))
                raise AirflowException(f"Cannot execute: {self._mask_cmd(cmd)}. Error code is: {returncode}.")

        return Failing

    monkeypatch.setattr(spark_job, "_submit_hook_class", factory)


def test_job_refusing_its_config_before_any_run_record(monkeypatch, tmp_path):
    """Exit code 2 of the job: no run record, its one line on stderr names type and message."""
    connections(monkeypatch)
    failing_submit(monkeypatch, ["INFO starting", "shardyfusion job failed: ConfigError: input_format 'x' is odd"], 2)
    with pytest.raises(ConfigError, match=r"^input_format 'x' is odd$"):
        make_op(f"file://{tmp_path}/snap").execute(make_context())


def test_spark_submit_dying_without_run_record_shows_the_output_tail(monkeypatch, tmp_path):
    connections(monkeypatch)
    failing_submit(monkeypatch, [f"log line {i}" for i in range(100)] + ["Error: JAVA_HOME is not set"], 101)
    with pytest.raises(SparkSubmitError) as info:
        make_op(f"file://{tmp_path}/snap", run_id="run-dead").execute(make_context())
    text = str(info.value)
    assert "exit code 101" in text and "no run record" in text and "run-dead" in text
    assert "Error: JAVA_HOME is not set" in text and "log line 99" in text
    assert "log line 10\n" not in text  # a tail, not the whole log
    assert "--config-b64" not in text


def test_running_record_after_client_mode_exit_is_marked_failed(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_submit(monkeypatch, lambda c: job_record(c, RUNNING))
    root = f"file://{tmp_path}/snap"
    with pytest.raises(SparkSubmitError, match="still says 'running'"):
        make_op(root, run_id="run-orphan").execute(make_context())
    record = read_run_record(open_store(root), "run-orphan")
    assert record.status == FAILED and record.error.type == "RunAbandoned"


# ---- credentials -----------------------------------------------------------------------------


def s3_conn(endpoint="http://127.0.0.1:9"):
    return {"conn_type": "aws", "login": "AKIAUNITTEST", "password": SECRET,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def test_credentials_reach_spark_submit_only_through_its_environment(monkeypatch):
    connections(monkeypatch, aws=s3_conn())
    seen = stub_submit(monkeypatch, lambda c: [f"a line that leaks {SECRET}"])
    op = make_op("s3://some-bucket/snap", aws_conn_id="sf_aws", run_id="run-s3")
    monkeypatch.setattr(sw.ShardedWriteOperator, "_read_record", lambda self, config: None)
    with pytest.raises(SparkSubmitError) as info:
        op.execute(make_context())
    call = seen.last
    assert call["env"]["AWS_SECRET_ACCESS_KEY"] == SECRET and call["env"]["AWS_ACCESS_KEY_ID"] == "AKIAUNITTEST"
    assert SECRET not in " ".join(call["cmd"])
    assert SECRET not in call["config"].to_json()
    assert call["config"].storage_options.endpoint_url == "http://127.0.0.1:9"
    assert SECRET not in str(info.value) and "a line that leaks ***" in str(info.value)


def test_a_connection_without_keys_forwards_no_frozen_credentials(monkeypatch):
    # The driver's own default chain refreshes temporary credentials; a copy taken here could expire.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMTHEWORKERENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    connections(monkeypatch, aws={"conn_type": "aws", "extra": {"endpoint_url": "http://127.0.0.1:9"}})
    seen = stub_submit(monkeypatch, lambda c: None)
    op = make_op("s3://some-bucket/snap", aws_conn_id="sf_aws", run_id="run-chain")
    monkeypatch.setattr(sw.ShardedWriteOperator, "_read_record", lambda self, config: None)
    with pytest.raises(SparkSubmitError):
        op.execute(make_context())
    env = seen.last["env"]
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert seen.last["config"].storage_options.endpoint_url == "http://127.0.0.1:9"


# ---- cluster modes and deferral (YARN / Kubernetes cannot run here: the command is checked) ---


def test_deferrable_cluster_mode_submits_without_waiting_and_defers_on_the_run_record(monkeypatch, tmp_path):
    """YARN / Kubernetes clusters cannot run in this environment: spark-submit is stubbed and the
    test checks the command it would run, then drives the real RunRecordTrigger on a local store."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_shardyfusion.triggers.run_record import RunRecordTrigger

    connections(monkeypatch, spark=YARN_CLUSTER, aws=s3_conn())
    seen = stub_submit(monkeypatch, lambda c: None)
    root = f"file://{tmp_path}/snap"
    op = make_op(root, deferrable=True, run_id="run-deferred", aws_conn_id="sf_aws", poll_interval=0.05,
                 python_env_archive="hdfs:///envs/sf.tar.gz#pyenv")
    with pytest.raises(TaskDeferred) as info:
        op.execute(make_context())
    trigger = info.value.trigger
    assert isinstance(trigger, RunRecordTrigger) and info.value.method_name == "execute_complete"
    assert trigger.run_id == "run-deferred" and trigger.output_uri == root and trigger.poll_interval == 0.05
    assert trigger.fail_run_on_kill  # the operator owns the run: a user's kill while deferred fails it

    cmd = " ".join(seen.last["cmd"])
    assert "--master yarn" in cmd and "--deploy-mode cluster" in cmd
    assert "spark.yarn.submit.waitAppCompletion=false" in cmd
    assert "--archives hdfs:///envs/sf.tar.gz#pyenv" in cmd
    assert "spark.pyspark.python=./pyenv/bin/python" in cmd
    assert "spark.executorEnv.PYSPARK_PYTHON=./pyenv/bin/python" in cmd
    # The driver runs on the cluster: forwarding credentials would need argv, so they are not sent.
    assert SECRET not in cmd and "AWS_SECRET_ACCESS_KEY" not in seen.last["env"]

    # The writer finishes on the cluster; the trigger (run in-line) sees the record and resumes the task.
    writer_succeeds(seen.last["config"])

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first_event())
    ctx = make_context()
    summary = op.execute_complete(ctx, event)
    assert summary["run_id"] == "run-deferred" and summary["manifest_ref"]
    assert ctx["outlet_events"][Asset(root)].extra == summary


def test_execute_complete_raises_the_writers_error_from_a_trigger_event(tmp_path):
    op = make_op(f"file://{tmp_path}/snap")
    event = {"status": "error", "message": "run 'r' failed: InputDataError: null key in column 'id'",
             "error_type": "InputDataError", "writer_message": "null key in column 'id'", "reason": "failed"}
    with pytest.raises(InputDataError, match=r"^null key in column 'id'$"):
        op.execute_complete(make_context(), event)


def test_deferrable_in_client_mode_runs_in_the_worker(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_submit(monkeypatch, writer_succeeds)
    summary = make_op(f"file://{tmp_path}/snap", deferrable=True).execute(make_context())
    assert summary["manifest_ref"]


# ---- on_kill ---------------------------------------------------------------------------------


def test_on_kill_stops_spark_and_marks_the_run_killed(monkeypatch, tmp_path):
    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"
    op = make_op(root)
    killed = []
    op._launcher = SimpleNamespace(on_kill=lambda: killed.append(True))
    op._active_run_id, op._active_output_uri = "run-killed", root
    write_run_record(open_store(root), "run-killed", RUNNING)
    op.on_kill()
    record = read_run_record(open_store(root), "run-killed")
    assert killed == [True]
    assert record.status == FAILED and record.error.type == "RunKilled" and "killed" in record.error.message


# ---- bundle ----------------------------------------------------------------------------------


def test_bundle_is_deterministic_sorted_and_complete(tmp_path):
    a = bundle_mod.build_bundle(tmp_path / "a")
    b = bundle_mod.build_bundle(tmp_path / "b")
    assert Path(a.zip_path).read_bytes() == Path(b.zip_path).read_bytes()
    assert a.sha256 == b.sha256 and Path(a.zip_path).parent.name == a.sha256
    with zipfile.ZipFile(a.zip_path) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert "airflow_provider_shardyfusion/spark_jobs/sharded_write_job.py" in names
    assert "airflow_provider_shardyfusion/spark_jobs/driver.py" in names
    assert not any(n.startswith("spark_jobs/") for n in names)  # one address, the package's
    assert "airflow_provider_shardyfusion/__init__.py" in names
    assert "airflow_provider_shardyfusion/core/model/config.py" in names
    assert "airflow_provider_shardyfusion/core/storage/s3.py" in names
    assert all(n.endswith(".py") and "__pycache__" not in n for n in names)
    # Only core and the job ship to executors: no Airflow side.
    assert not any(n.startswith(("airflow_provider_shardyfusion/operators", "airflow_provider_shardyfusion/hooks"))
                   for n in names)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}
    assert Path(a.entry_script).read_bytes() == (SCRIPTS / "sharded_write_job.py").read_bytes()


def test_bundle_is_cached_by_content(tmp_path):
    first = bundle_mod.build_bundle(tmp_path)
    stamp = Path(first.zip_path).stat().st_mtime_ns
    again = bundle_mod.build_bundle(tmp_path)
    assert again == first and Path(again.zip_path).stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.sha256]  # no staging leftovers


def test_a_tampered_cache_entry_is_replaced_not_shipped(tmp_path):
    good = bundle_mod.build_bundle(tmp_path)
    expected = Path(good.zip_path).read_bytes()
    Path(good.zip_path).write_bytes(b"PK planted by someone else")
    Path(good.entry_script).write_text("import os; os.system('steal')\n")
    again = bundle_mod.build_bundle(tmp_path)
    assert Path(again.zip_path).read_bytes() == expected
    assert Path(again.entry_script).read_bytes() == (SCRIPTS / "sharded_write_job.py").read_bytes()


def test_bundle_cache_must_be_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="not private to this user"):
        bundle_mod.build_bundle(shared)
    assert str(os.getuid()) in str(bundle_mod.default_cache_dir())


def _package_copy(where: Path) -> Path:
    """A copy of the bundled part of the package, to change its code."""
    pkg = ROOT / "airflow_provider_shardyfusion"
    for name in ("__init__.py", "compat.py", "streaming.py"):
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pkg / name, where / name)
    for sub in ("core", "spark_jobs"):
        shutil.copytree(pkg / sub, where / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return where


def test_bundle_changes_when_the_code_changes(tmp_path):
    pkg = _package_copy(tmp_path / "pkg")
    v1 = bundle_mod.build_bundle(tmp_path / "cache", package=pkg)
    (pkg / "spark_jobs" / "driver.py").write_text("print('v2')\n")
    v2 = bundle_mod.build_bundle(tmp_path / "cache", package=pkg)
    assert v1.sha256 != v2.sha256
    with zipfile.ZipFile(v2.zip_path) as zf:
        assert zf.read("airflow_provider_shardyfusion/spark_jobs/driver.py") == b"print('v2')\n"


def test_missing_entry_script_is_a_clear_error(tmp_path):
    pkg = _package_copy(tmp_path / "pkg")
    (pkg / "spark_jobs" / "scripts" / "sharded_write_job.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"sharded_write_job\.py was not found"):
        bundle_mod.build_bundle(tmp_path / "cache", package=pkg)


# ---- import weight ---------------------------------------------------------------------------


def test_importing_the_operator_does_not_import_spark_rocksdb_or_boto3():
    code = (
        "import sys\n"
        "import airflow_provider_shardyfusion.operators.sharded_write as m\n"
        "import airflow_provider_shardyfusion.submission.bundle\n"
        # file:// only: Airflow's own s3:// asset URI normalizer (amazon provider) imports boto3.
        "m.ShardedWriteOperator(task_id='t', output_uri='file:///x', input_path='/in', value_column='v', num_dbs=2)\n"
        "heavy = [n for n in ('pyspark', 'rocksdict', 'boto3', 'botocore', 'py4j') if n in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ---- deferral timeout (issue 13) ---------------------------------------------------------------


@pytest.mark.parametrize(("kw", "expected"), [
    ({"deferral_timeout": 300}, timedelta(minutes=5)),
    ({"deferral_timeout": timedelta(hours=3), "execution_timeout": timedelta(hours=1)}, timedelta(hours=3)),
    ({"execution_timeout": timedelta(hours=2)}, timedelta(hours=2)),  # Airflow does not time deferred waits
    ({}, timedelta(hours=24)),
])
def test_the_deferred_wait_has_a_timeout(monkeypatch, tmp_path, kw, expected):
    from airflow.sdk.exceptions import TaskDeferred

    connections(monkeypatch, spark=YARN_CLUSTER)
    stub_submit(monkeypatch, lambda c: None)
    op = make_op(f"file://{tmp_path}/snap", deferrable=True, **kw)
    with pytest.raises(TaskDeferred) as info:
        op.execute(make_context())
    assert info.value.timeout == expected


def test_a_bad_deferral_timeout_fails_before_any_submit(monkeypatch, tmp_path):
    connections(monkeypatch, spark=YARN_CLUSTER)
    seen = stub_submit(monkeypatch, writer_succeeds)
    with pytest.raises(ConfigError, match="deferral_timeout"):
        make_op(f"file://{tmp_path}/snap", deferrable=True, deferral_timeout=-5).execute(make_context())
    assert seen.calls == []


# ---- retries of a fixed run id and ownership (issue 11) ------------------------------------------


def try_identity(try_number: int, **over) -> dict:
    ti = FakeTI
    return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index,
            "try_number": try_number, **over}


def earlier_record(root: str, run_id: str, status: str, by: dict, **kw):
    store = open_store(root)
    record = write_run_record(store, run_id, status, **kw)
    store.put(layout.run_record_key(run_id), dataclasses.replace(record, writer={"airflow": by}).to_bytes())


def test_a_retry_after_a_failed_try_writes_a_fresh_run_and_never_reports_the_old_error(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    earlier_record(root, "daily", FAILED, try_identity(1), error=RunError("InputDataError", "bad row in try 1"))
    summary = make_op(root, run_id="daily").execute(make_context())  # FakeTI is try 2
    assert [c["config"].run_id for c in seen.calls] == ["daily-try2"]
    assert summary["run_id"] == "daily-try2" and summary["published"] is True
    assert read_run_record(open_store(root), "daily").error.message == "bad row in try 1"  # untouched


def test_a_retry_reattaches_to_the_earlier_tries_running_run_in_the_worker(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    earlier_record(root, "daily", RUNNING, try_identity(1))
    waits = []

    def earlier_try_finishes(seconds):  # the earlier try's writer completes while this try waits
        waits.append(seconds)
        writer_succeeds(build_write_config(output_uri=root, run_id="daily", input_path="/in", value_column="v",
                                           num_dbs=4))

    ctx = make_context()
    op = make_op(root, run_id="daily", poll_interval=0.5)
    clock = FakeClock()
    op._clock, op._sleep = clock, lambda s: (clock.sleep(s), earlier_try_finishes(s))
    summary = op.execute(ctx)
    assert seen.calls == [] and waits == [0.5]  # nothing submitted twice
    assert summary["run_id"] == "daily" and summary["manifest_ref"] and ctx["ti"].xcoms["run_id"] == "daily"
    assert ctx["outlet_events"][Asset(root)].extra == summary


def test_a_deferrable_retry_reattaches_through_the_trigger_without_owning_the_run(monkeypatch, tmp_path):
    from airflow.sdk.exceptions import TaskDeferred

    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    earlier_record(root, "daily", RUNNING, try_identity(1))
    op = make_op(root, run_id="daily", deferrable=True, deferral_timeout=600)
    with pytest.raises(TaskDeferred) as info:
        op.execute(make_context())
    assert seen.calls == [] and info.value.trigger.run_id == "daily"
    assert info.value.trigger.fail_run_on_kill is False and info.value.timeout == timedelta(minutes=10)
    op.on_kill()  # a kill of this try does not fail the earlier try's run
    assert read_run_record(open_store(root), "daily").status == RUNNING


def test_a_run_id_used_by_another_task_is_refused_before_submitting_and_left_alone(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    earlier_record(root, "shared", RUNNING, try_identity(1, dag_id="another_dag"))
    with pytest.raises(RunRecordError, match=r"already used .* by task another_dag\.write"):
        make_op(root, run_id="shared").execute(make_context())
    assert seen.calls == []
    assert read_run_record(open_store(root), "shared").status == RUNNING


def test_a_writer_racing_for_the_run_id_is_never_marked_by_this_try(monkeypatch, tmp_path):
    connections(monkeypatch)
    other = try_identity(1, dag_id="racer")

    def racer_wins(config):  # another writer creates the record first; our job then refuses the id
        earlier_record(config.output_uri, config.run_id, RUNNING, other)
        return [f"shardyfusion job failed: RunRecordError: a run record for run_id {config.run_id!r} already "
                "exists; run ids must be unique"]

    stub_submit(monkeypatch, racer_wins)
    root = f"file://{tmp_path}/snap"
    op = make_op(root, run_id="raced")
    with pytest.raises(RunRecordError, match="already exists; run ids must be unique"):
        op.execute(make_context())
    assert read_run_record(open_store(root), "raced").status == RUNNING  # not marked RunAbandoned
    op.on_kill()
    assert read_run_record(open_store(root), "raced").status == RUNNING  # nor RunKilled


def test_a_reattached_run_whose_writer_dies_fails_this_try_without_marking_the_run(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, writer_succeeds)
    root = f"file://{tmp_path}/snap"
    earlier_record(root, "daily", RUNNING, try_identity(1))

    def lease_runs_out(seconds):  # the earlier try's driver stops renewing: its lease is in the past
        earlier_record(root, "daily", RUNNING, try_identity(1), now=layout.utc_now() - timedelta(hours=1),
                       lease_seconds=60)

    op = make_op(root, run_id="daily", poll_interval=1)
    op._sleep = lease_runs_out
    with pytest.raises(RunRecordError, match="writer lost"):
        op.execute(make_context())
    assert seen.calls == [] and read_run_record(open_store(root), "daily").status == RUNNING
