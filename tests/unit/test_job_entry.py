"""The entry scripts' one exit policy (spark_jobs/job_entry.py), run as spark-submit runs them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts"


def _run(script: str, config_b64: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPTS / script), "--config-b64", config_b64], env=env,
                          capture_output=True, text=True, timeout=120)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize(("script", "job", "config", "says"), [
    ("sharded_write_job.py", "shardyfusion job", "{not json", "ConfigError: "),
    ("streaming_job.py", "shardyfusion streaming job", "{not json", "ConfigError: streaming job config is not valid JSON"),
    # A stream setting of the wrong type: refused before Spark starts, naming the field.
    ("streaming_job.py", "shardyfusion streaming job",
     json.dumps({"write_config": {}, "stream": {"stream_id": "s", "checkpoint_location": "/cp", "report_id": 5}}),
     None),
])
def test_a_rejected_config_exits_2_with_one_failure_line(script, job, config, says):
    proc = _run(script, _b64(config))
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{job} failed: ")]
    assert len(lines) == 1, proc.stderr
    if says is not None:
        assert says in lines[0], lines[0]


def test_the_streaming_job_names_a_bad_stream_setting():
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.stream.job import StreamSettings, encode_job_config

    config = build_write_config(input_path="/in", key_column="id", value_column="v", num_dbs=2, output_uri="file:///tmp/out",
                                run_id="r1")
    job = json.loads(encode_job_config(config, StreamSettings("s1", "/cp", "r1", source_path="/in")))
    job["stream"]["stream_reset"] = "yes"
    proc = _run("streaming_job.py", _b64(json.dumps(job)))
    assert proc.returncode == 2, proc.stderr
    assert ("shardyfusion streaming job failed: ConfigError: stream settings: field 'stream_reset' is missing or "
            "not bool (got 'yes') at $.stream_reset") in proc.stderr.splitlines()


def test_bad_base64_is_rejected_too():
    proc = _run("sharded_write_job.py", "%%%")
    assert proc.returncode == 2, proc.stderr
    assert any(line.startswith("shardyfusion job failed: ") for line in proc.stderr.splitlines()), proc.stderr
