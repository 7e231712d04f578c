"""dag.test() of dags_example/sensors_example.py against a snapshot published in the test (file://)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core.model.run_record import RUNNING
from tests.snapshot_helpers import publish_snapshot, store_for, write_run_record

pytestmark = pytest.mark.airflow

DAG_ID = "shardyfusion_sensors_example"


def test_sensors_example_succeeds_on_published_snapshot(run_dag, file_root):
    pointer = publish_snapshot(store_for(file_root))

    result = run_dag(DAG_ID, conf={"output_uri": file_root})

    assert result.tasks == {"wait_for_current": "success", "wait_for_run_record": "success"}
    assert result.xcoms["wait_for_current"]["run_id"] == pointer.run_id
    assert result.xcoms["wait_for_current"]["manifest_ref"] == pointer.manifest_ref
    record = result.xcoms["wait_for_run_record"]
    assert record["run_id"] == pointer.run_id
    assert record["status"] == "succeeded"
    assert record["manifest_ref"] == pointer.manifest_ref


def test_sensors_example_defers_and_resumes_when_snapshot_is_published_later(run_dag, file_root):
    """Nothing is there at the first poke: the sensor defers and its trigger runs in-line until the
    snapshot is published (only once the deferral is seen in the log, so timing cannot hide it)."""
    store = store_for(file_root)
    run_id = "20260101T000000Z-deadbeef"
    write_run_record(store, run_id, RUNNING)
    publishers: list[threading.Thread] = []

    def publish_after_deferral(line: str) -> None:
        if "running trigger in line" in line and not publishers:
            # Let the trigger poll at least once (poll_interval=5 s in the DAG) before publishing.
            publishers.append(threading.Timer(2.0, publish_snapshot, (store, run_id)))
            publishers[0].start()

    try:
        result = run_dag(DAG_ID, conf={"output_uri": file_root}, on_line=publish_after_deferral, timeout=300)
    finally:
        for publisher in publishers:
            publisher.cancel()
            publisher.join(timeout=30)

    assert publishers, "the sensor never deferred"
    assert result.tasks == {"wait_for_current": "success", "wait_for_run_record": "success"}
    assert result.xcoms["wait_for_current"]["run_id"] == run_id
    assert result.xcoms["wait_for_run_record"]["run_id"] == run_id
    assert "Trigger completed" in result.output


def test_sensors_example_defaults_to_the_quickstart_output(run_dag, tmp_path):
    """Without an ``output_uri`` param the sensors wait where the quickstart publishes (same demo dir),
    so run after the quickstart they succeed at once instead of waiting 30 minutes."""
    quickstart_root = f"file://{tmp_path}/shardyfusion_quickstart/snapshot"
    pointer = publish_snapshot(store_for(quickstart_root))

    result = run_dag(DAG_ID, extra_env={"SHARDYFUSION_DEMO_DIR": str(tmp_path)}, timeout=300)

    assert result.tasks == {"wait_for_current": "success", "wait_for_run_record": "success"}
    assert result.xcoms["wait_for_current"]["run_id"] == pointer.run_id
    assert result.xcoms["wait_for_run_record"]["manifest_ref"] == pointer.manifest_ref
    assert "running trigger in line" not in result.output  # found at the first poke: no deferral


def test_example_helper_is_not_a_dag_file():
    import ast

    dags = Path(__file__).resolve().parents[2] / "dags_example"
    ignored = [line.strip() for line in (dags / ".airflowignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ignored == ["_shardyfusion_examples.py", "run_demo.py", "try_dag.py"]  # a helper and two scripts
    for name in ("quickstart.py", "quickstart_s3.py", "sensors_example.py", "run_demo.py"):
        tree = ast.parse((dags / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
                   {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "quickstart" not in imported and "quickstart_s3" not in imported, name
    # The helper builds DAGs only inside functions: nothing at module level creates one.
    helper = ast.parse((dags / "_shardyfusion_examples.py").read_text())
    top_level_calls = [n for stmt in helper.body if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
                       for n in ast.walk(stmt) if isinstance(n, ast.Call)]
    assert not any(getattr(c.func, "id", "") in ("DAG", "build_quickstart_dag") for c in top_level_calls)
