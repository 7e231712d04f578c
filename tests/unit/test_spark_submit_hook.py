"""``ShardyfusionSparkSubmitHook`` running a real (stand-in) spark-submit process.

The stand-in is a shell script named ``spark-submit`` first on PATH: it reports what the process
received (argv, environment) the way a real spark-submit would see it, so the test checks the
provider's real command building and process start, not a mock of them.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from airflow_provider_shardyfusion.core.errors import SparkSubmitError
from airflow_provider_shardyfusion.hooks.spark_submit import (
    OUTPUT_TAIL_LINES,
    ShardyfusionSparkSubmitHook,
    resolve_spark_connection,
)

SECRET = "HookSecretValue/51aa"
SCRIPT = """#!/bin/sh
i=0
while [ $i -lt 60 ]; do echo "line $i"; i=$((i+1)); done
echo "argv: $*"
echo "secret-in-env: ${AWS_SECRET_ACCESS_KEY:+yes}"
echo "leaked: $AWS_SECRET_ACCESS_KEY"
echo "flag: $MY_FLAG"
exit 0
"""


@pytest.fixture
def fake_spark_submit(tmp_path, monkeypatch):
    binary = tmp_path / "bin" / "spark-submit"
    binary.parent.mkdir()
    binary.write_text(SCRIPT)
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    return binary


def test_resolve_spark_connection_reads_the_providers_view(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SF_YARN", json.dumps({"conn_type": "spark", "host": "yarn",
                                                           "extra": {"deploy-mode": "cluster"}}))
    target = resolve_spark_connection("sf_yarn")
    assert (target.master, target.deploy_mode, target.spark_binary) == ("yarn", "cluster", "spark-submit")
    assert target.cluster_mode and target.is_yarn


def test_process_env_reaches_spark_submit_but_never_its_arguments(monkeypatch, fake_spark_submit):
    # YARN client mode: the provider turns env_vars into --conf spark.yarn.appMasterEnv.* arguments;
    # the process-only environment must not follow them there.
    monkeypatch.setenv("AIRFLOW_CONN_SF_YARN", json.dumps({"conn_type": "spark", "host": "yarn",
                                                           "extra": {"deploy-mode": "client"}}))
    hook = ShardyfusionSparkSubmitHook(
        conn_id="sf_yarn", env_vars={"MY_FLAG": "on"}, name="t",
        process_env={"AWS_SECRET_ACCESS_KEY": SECRET}, redact=[SECRET],
    )
    hook.submit(application="/app/job.py")
    tail = hook.tail_text().splitlines()
    argv = next(line for line in tail if line.startswith("argv: "))
    assert "spark.yarn.appMasterEnv.MY_FLAG=on" in argv  # the provider's public env_vars path
    assert "AWS_SECRET_ACCESS_KEY" not in argv and SECRET not in argv
    assert "secret-in-env: yes" in tail and "flag: on" in tail
    assert "leaked: ***" in tail and SECRET not in hook.tail_text()
    assert len(tail) == OUTPUT_TAIL_LINES and tail[0] == "line 24"  # a bounded tail: the newest 40 of 64 lines


def test_without_process_env_the_provider_behaviour_is_unchanged(monkeypatch, fake_spark_submit):
    monkeypatch.setenv("AIRFLOW_CONN_SF_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    hook = ShardyfusionSparkSubmitHook(conn_id="sf_local", env_vars={"MY_FLAG": "x"}, name="t")
    hook.submit(application="/app/job.py")
    tail = hook.tail_text().splitlines()
    assert "flag: x" in tail and "secret-in-env: " in tail
    # Every line of the job's output is logged under a short name (not the module and class path).
    assert hook.log.name == "airflow.task.hooks.shardyfusion"


@pytest.mark.parametrize(("final", "fails"), [("FINISHED", False), ("FAILED", True)])
def test_standalone_cluster_submit_waits_for_the_driver_and_fails_unless_it_finished(monkeypatch, tmp_path, final,
                                                                                      fails):
    binary = tmp_path / "bin" / "spark-submit"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho 'Driver successfully submitted as driver-20240101000000-0001'\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SF_STANDALONE", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:1",
                                                                 "extra": {"deploy-mode": "cluster"}}))
    asked = []

    class NoMaster(ShardyfusionSparkSubmitHook):
        # Mock: no standalone master runs here to answer the provider's driver status requests.
        def _start_driver_status_tracking(self):
            asked.append(self._driver_id)
            self._driver_status = final

    hook = NoMaster(conn_id="sf_standalone", name="t", wait_for_driver=True)
    if fails:
        with pytest.raises(SparkSubmitError, match="the Spark driver ended as FAILED"):
            hook.submit(application="/app/job.py")
    else:
        hook.submit(application="/app/job.py")
    assert asked == ["driver-20240101000000-0001"]
