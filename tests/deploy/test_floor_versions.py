"""The declared floors are real: the wheel with every direct requirement at its lowest allowed version.

``uv pip compile --resolution lowest-direct`` over the wheel's own requirements (plus the
``[spark]`` extra) gives apache-airflow 3.3.0, the spark provider 5.6.0, the amazon provider 9.4.0,
pyspark 4.1.0, cel-python 0.2, pyarrow 15, numpy 1.26, ... In a fresh venv with exactly those:
every provider module imports, the spark provider has the members we override and our subclass
really hands ``process_env`` to spark-submit's environment (the credential path), the AWS hook
builds its clients, and the pure-core unit tests pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow]

REPO = Path(__file__).resolve().parents[2]
CORE_TESTS = ("test_routing.py", "test_encoding.py", "test_config.py", "test_shard_builder.py")
EXPECTED_FLOORS = {
    "apache-airflow": "3.3.0",
    "apache-airflow-providers-apache-spark": "5.6.0",
    "apache-airflow-providers-amazon": "9.4.0",
    "pyspark": "4.1.0",
}

PROBE = r"""
import importlib, json, os
import airflow_provider_shardyfusion as pkg
from airflow_provider_shardyfusion import compat
info = pkg.get_provider_info()
for kind in ("operators", "sensors", "hooks", "triggers"):
    for entry in info[kind]:
        for module in entry["python-modules"]:
            importlib.import_module(module)
compat.check_spark_provider()
compat.check_pyspark_install()

from airflow_provider_shardyfusion.operators.spark_job import _submit_hook_class
hook = _submit_hook_class()(conn_id="spark_default", process_env={"AWS_SECRET_ACCESS_KEY": "floor-secret"},
                            redact=["floor-secret"])
cmd = hook._build_spark_submit_command("app.py")
assert hook._env["AWS_SECRET_ACCESS_KEY"] == "floor-secret", hook._env
assert not any("floor-secret" in part for part in cmd), cmd

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from botocore.config import Config
aws = AwsBaseHook(aws_conn_id=None, client_type="s3")
aws.config.merge(Config(retries={"max_attempts": 2}))
aws.get_client_type(region_name="us-east-1", deferrable=True)

# The triggers' async path on the floor: 3.3.0 lacks Connection.aextra_dejson, so the connection is
# fetched in a worker thread (aget_connection can deadlock there), then an aiobotocore session is built.
import asyncio
from airflow.sdk import Connection
from airflow_provider_shardyfusion.hooks.shardyfusion import ShardyfusionHook, _aget_connection, _options_and_session
assert not hasattr(Connection, "aextra_dejson"), "the floor Airflow takes the async connection path"
os.environ["AIRFLOW_CONN_FLOOR_AWS"] = json.dumps({"conn_type": "aws", "login": "AKIAFLOOR", "password": "floor-secret",
                                                   "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"}})
async def floor_async():
    conn = await _aget_connection(ShardyfusionHook, "floor_aws")
    return conn, *await asyncio.to_thread(_options_and_session, conn, True)
conn, options, session = asyncio.run(floor_async())
assert conn.login == "AKIAFLOOR" and options.endpoint_url == "http://127.0.0.1:9", options
assert type(session).__module__.startswith("aiobotocore"), type(session)
assert asyncio.run(ShardyfusionHook(aws_conn_id=None).aread_current("file:///nonexistent/floor")) is None

# The history UI plugin loads on the floor Airflow and its routes require authentication.
from fastapi.testclient import TestClient
from airflow_provider_shardyfusion.ui.plugin import ShardyfusionHistoryPlugin
assert TestClient(ShardyfusionHistoryPlugin.fastapi_apps[0]["app"]).get("/").status_code == 401
print("FLOOR-OK")
"""


def _run(cmd, *, env, cwd, timeout=900) -> str:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"$ {' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def test_lowest_allowed_versions_install_import_and_work(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    dev_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path / "dist"], env=env, cwd=REPO)
    (wheel,) = (tmp_path / "dist").glob("airflow_provider_shardyfusion-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requirements = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    # The wheel's own requirements as direct ones, so lowest-direct lowers each of them.
    direct = [r for r in requirements if "extra ==" not in r]
    direct += [r.split(";")[0].strip() for r in requirements if "extra == 'spark'" in r or 'extra == "spark"' in r]
    (tmp_path / "floor.in").write_text("\n".join(direct) + "\n")
    uv = shutil.which("uv", path=dev_bin) or shutil.which("uv")
    _run([uv, "pip", "compile", "--quiet", "--python-version", "3.11", "--resolution", "lowest-direct",
          tmp_path / "floor.in", "-o", tmp_path / "floor.txt"], env=env, cwd=tmp_path)
    pins = dict(line.split("==", 1) for line in (tmp_path / "floor.txt").read_text().splitlines()
                if "==" in line and not line.startswith((" ", "#")))
    assert {k: pins.get(k) for k in EXPECTED_FLOORS} == EXPECTED_FLOORS, pins
    assert "pyspark-client" not in pins  # the 5.x spark provider depends on pyspark itself

    venv = tmp_path / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, venv], env=env, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([uv, "pip", "install", "--quiet", "--python", python, "-r", tmp_path / "floor.txt", "--no-deps", wheel],
         env=env, cwd=tmp_path, timeout=1200)
    _run([uv, "pip", "install", "--quiet", "--python", python, "pytest", "pytest-timeout", "hypothesis"],
         env=env, cwd=tmp_path)
    installed = _run([uv, "pip", "freeze", "--python", python], env=env, cwd=tmp_path)
    for name, version in EXPECTED_FLOORS.items():  # the test tools did not move a floor
        assert f"{name}=={version}" in installed.splitlines(), name
    work = tmp_path / "work"  # not the repository: the installed wheel is what is imported
    work.mkdir()
    run_env = {**env, "AIRFLOW_HOME": str(tmp_path / "airflow_home"),
               "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}'}
    out = _run([python, "-c", PROBE], env=run_env, cwd=work)
    assert "FLOOR-OK" in out
    for name in CORE_TESTS:
        shutil.copy(REPO / "tests" / "unit" / name, work / name)
    out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CORE_TESTS], env=run_env, cwd=work)
    assert " passed" in out and "failed" not in out, out[-3000:]
