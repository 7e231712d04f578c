"""``StreamingSnapshotOperator`` with a stubbed spark-submit (the real query: tests/e2e/test_streaming_dag.py).

The stub builds the real spark-submit command line through the spark provider's hook, decodes
the streaming job's JSON from it and writes the report the job would write.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_shardyfusion.core.errors import ConfigError, SparkSubmitError, StorageError
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.stream.job import decode_job_config, report_key, sanitize_stream_id, stop_key
from airflow_provider_shardyfusion.operators import spark_job
from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator
from tests.operator_helpers import connections, make_context

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts"  # the two spark-submit applications


def stream_context():
    return {**make_context(), "outlet_events": OutletEventAccessors()}


def make_stream_op(root: str, **kw) -> StreamingSnapshotOperator:
    args = dict(task_id="ingest", output_uri=root, source_path="s3://inputs/data/in", checkpoint_location="/cp",
                key_column="id", value_column="payload", num_dbs=2, delete_column="deleted",
                spark_conn_id="sf_spark")
    args.update(kw)
    return StreamingSnapshotOperator(**args)


def stub_job(monkeypatch, report):
    seen: list[dict] = []
    real_factory = spark_job._submit_hook_class

    def factory():
        class StubbedHook(real_factory()):
            def submit(self, application="", **kwargs):
                cmd = self._build_spark_submit_command(application)
                b64 = cmd[cmd.index("--config-b64") + 1]
                config, stream = decode_job_config(base64.urlsafe_b64decode(b64).decode())
                seen.append({"application": application, "config": config, "stream": stream})
                if report is not None:
                    # The job always names its stream first; what the test gives overrides it.
                    written = {"stream_id": stream.stream_id, **report} if isinstance(report, dict) else report
                    open_store(config.output_uri).put(report_key(stream.stream_id, stream.report_id),
                                                      json.dumps(written).encode())

        return StubbedHook

    monkeypatch.setattr(spark_job, "_submit_hook_class", factory)
    return seen


BATCHES = [{"batch_id": 3, "action": "skipped", "run_id": "s-b000000000003", "reason": "already live", "rows": None},
           {"batch_id": 4, "action": "written", "run_id": "s-b000000000004", "reason": "written (delta)", "rows": 7},
           {"batch_id": 5, "action": "published", "run_id": "s-b000000000005-r1", "reason": "x", "rows": None}]


def test_execute_submits_the_streaming_job_and_reports_its_batches(monkeypatch, tmp_path):
    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"
    seen = stub_job(monkeypatch, {"finished": True, "error": None, "batches": BATCHES})
    op = make_stream_op(root, source_options={"maxFilesPerTrigger": 1})
    aliases = [o for o in op.outlets if isinstance(o, AssetAlias)]
    assert len(aliases) == 1 and not [o for o in op.outlets if isinstance(o, Asset)]
    ctx = {**make_context(), "outlet_events": OutletEventAccessors()}
    result = op.execute(ctx)
    call = seen[0]
    assert call["application"].endswith("/streaming_job.py")
    assert call["stream"].stream_id == "dag_x.write"  # FakeTI: <dag_id>.<task_id>
    assert call["stream"].source_options == {"maxFilesPerTrigger": "1"}
    assert call["stream"].trigger == "available_now" and call["stream"].checkpoint_location == "/cp"
    assert call["config"].delta.write_mode == "delta" and call["config"].delta.delete_column == "deleted"
    assert call["config"].options.publish is True and call["config"].input.path == "s3://inputs/data/in"
    assert [(b["batch_id"], b["action"]) for b in result["batches"]] == [(3, "skipped"), (4, "written"),
                                                                         (5, "published")]
    assert set(result["batches"][0]) == {"batch_id", "run_id", "action", "rows"}
    assert result["published"] == 2 and result["stream_id"] == "dag_x.write"
    events = ctx["outlet_events"][aliases[0]].asset_alias_events
    assert [e.extra["batch_id"] for e in events] == [4, 5]
    assert {e.dest_asset_key.uri for e in events} == {root}


def test_a_failed_job_raises_and_names_the_batches_published_before(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_job(monkeypatch, {"finished": True, "error": "StreamingQueryException: boom", "batches": BATCHES[1:2]})
    with pytest.raises(SparkSubmitError, match=r"boom.*published before: \[4\]; nothing is live \(the next"):
        make_stream_op(f"file://{tmp_path}/snap").execute(stream_context())


def test_a_job_without_report_fails(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_job(monkeypatch, None)
    with pytest.raises(SparkSubmitError, match="left no report"):
        make_stream_op(f"file://{tmp_path}/snap").execute(stream_context())


def test_a_job_whose_report_cannot_be_read_says_so(monkeypatch, tmp_path):
    connections(monkeypatch)
    stub_job(monkeypatch, ["not", "an", "object"])
    with pytest.raises(StorageError, match=r"stream 'dag_x.write': the streaming job ended but its report cannot "
                                           r"be read \(.*must be a JSON object, got list\)"):
        make_stream_op(f"file://{tmp_path}/snap").execute(stream_context())


def test_a_malformed_batch_entry_fails_the_task_naming_the_field(monkeypatch, tmp_path):
    """A batch the operator cannot read is never left out of the XCom and the asset events in silence."""
    connections(monkeypatch)
    stub_job(monkeypatch, {"finished": True, "error": None, "batches": [BATCHES[1], {**BATCHES[1], "batch_id": "5"}]})
    with pytest.raises(StorageError, match=r"report cannot be read \(the streaming job's report runs/_streams/dag_x\.write/"
                                           r".* is malformed: stream report: field 'batch_id' is missing or not int "
                                           r"\(got '5'\) at \$\.batches\[1\]\.batch_id\)"):
        make_stream_op(f"file://{tmp_path}/snap").execute(stream_context())


@pytest.mark.parametrize(("kw", "match"), [
    ({"trigger": "once"}, "trigger 'once'"),
    ({"trigger": "processing_time"}, "needs processing_time"),
    ({"source_options": {"asyncProgressTrackingEnabled": "true"}}, "async progress tracking"),
    ({"stream_id": "bad id!"}, "stream_id 'bad id!' is invalid"),
    ({"source_path": None}, "file source: give source_path"),
    ({"source_options": {"aws_secret_access_key": "x"}}, "look like credentials"),
    ({"source_options": {"path": "s3a://AKIAEXAMPLE:topsecret@b/in/"}}, r"^source_options\['path'\] 's3a://\*\*\*@"),
    ({"checkpoint_location": "s3a://AKIAEXAMPLE:topsecret@b/cp/"}, r"^checkpoint_location 's3a://\*\*\*@b/cp/'"),
    ({"source_path": "s3a://AKIAEXAMPLE:topsecret@b/in/"}, r"^source_path 's3a://\*\*\*@b/in/'"),
    ({"source_path": "s3a://b/in/?X-Amz-Signature=topsecret"},
     r"^source_path 's3a://b/in/\?X-Amz-Signature=\*\*\*' carries credentials in its query string"),
    ({"source_options": {"path": "https://a.blob.core.windows.net/c/in?sv=1&sig=topsecret"}},
     r"^source_options\['path'\] 'https://a.blob.core.windows.net/c/in\?sv=1&sig=\*\*\*'"),
    ({"source_options": "maxFilesPerTrigger=1"}, r"^source_options 'maxFilesPerTrigger=1' must be a mapping"),
    ({"stop_timeout": float("nan")}, r"^stop_timeout nan must be a finite number"),
])
def test_bad_stream_arguments_fail_before_spark(monkeypatch, tmp_path, kw, match):
    connections(monkeypatch)
    seen = stub_job(monkeypatch, None)
    with pytest.raises(ConfigError, match=match):
        make_stream_op(f"file://{tmp_path}/snap", **kw).execute(stream_context())
    assert not seen


@pytest.mark.parametrize(("kw", "match"), [
    ({"write_mode": "full"}, r"does not take 'write_mode' \(the writer chooses each micro-batch's write mode"),
    ({"publish": False}, r"'publish' \(every micro-batch is published"),
    ({"input_path": "/x", "run_id": "r1"}, r"'input_path' \(the stream's source is the input.*; 'run_id' \("),
    ({"deferrable": True}, r"'deferrable' \(the task runs the query itself"),
    ({"base_run_id": "r0"}, r"'base_run_id' \(every micro-batch is written on the live snapshot"),
])
def test_write_arguments_a_stream_does_not_take_are_one_config_error_at_parse_time(tmp_path, kw, match):
    # Before: write_mode/publish/input_path/deferrable raised a bare TypeError ("got multiple values"),
    # run_id and base_run_id were accepted and silently ignored.
    with pytest.raises(ConfigError, match=match):
        make_stream_op(f"file://{tmp_path}/snap", **kw)


def test_stream_id_default_is_sanitized():
    assert sanitize_stream_id("my dag.group.task/x") == "my_dag.group.task_x"
    assert len(sanitize_stream_id("a" * 300)) == 96


def test_on_kill_asks_the_job_to_stop_then_kills_spark_submit(monkeypatch, tmp_path):
    connections(monkeypatch)
    root = f"file://{tmp_path}/snap"
    op = make_stream_op(root, trigger="processing_time", processing_time="1 minute", stop_timeout=5)
    stream = op.stream_settings(make_context())
    killed = []
    op._stream, op._active_output_uri = stream, root
    op._launcher = type("H", (), {"on_kill": lambda self: killed.append(True)})()
    store = open_store(root)
    store.put(report_key(stream.stream_id, stream.report_id),
              json.dumps({"stream_id": stream.stream_id, "finished": True, "batches": []}).encode())
    op.on_kill()
    assert store.exists(stop_key(stream.stream_id, stream.report_id)) and killed == [True]


def test_registered_in_the_provider_info():
    from airflow_provider_shardyfusion import get_provider_info

    modules = [m for entry in get_provider_info()["operators"] for m in entry["python-modules"]]
    assert "airflow_provider_shardyfusion.operators.streaming_snapshot" in modules


def test_importing_the_streaming_operator_is_light():
    code = (
        "import sys\n"
        "import airflow_provider_shardyfusion.operators.streaming_snapshot as m\n"
        "m.StreamingSnapshotOperator(task_id='t', output_uri='file:///x', source_path='/in', value_column='v',\n"
        "                            num_dbs=2, checkpoint_location='/cp')\n"
        "heavy = [n for n in ('pyspark', 'rocksdict', 'boto3', 'botocore', 'py4j', 'pyarrow') if n in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_bundle_carries_the_streaming_job_and_writer(tmp_path):
    from airflow_provider_shardyfusion.submission import bundle as bundle_mod

    names = [name for name, _ in bundle_mod.bundle_entries()]
    assert "airflow_provider_shardyfusion/spark_jobs/streaming_job.py" in names
    assert "airflow_provider_shardyfusion/spark_jobs/foreach_batch.py" in names
    assert "airflow_provider_shardyfusion/streaming.py" in names
    built = bundle_mod.build_bundle(tmp_path)
    script = built.application(bundle_mod.STREAMING_SCRIPT)
    assert Path(script).read_bytes() == (SCRIPTS / "streaming_job.py").read_bytes()
    with pytest.raises(FileNotFoundError):
        built.application("other_job.py")
