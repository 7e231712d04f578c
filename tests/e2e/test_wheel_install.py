"""Managed-Airflow install: the built wheel alone, in a fresh virtualenv, away from the source tree.

MWAA / Composer / Astronomer install a wheel and parse DAGs; nothing of this repository is on
``sys.path`` there. This test builds the wheel, installs it (plus pyspark, as a platform would
provide Spark) into a new venv, and checks: Airflow lists the provider; importing every operator /
sensor / hook / trigger module stays light; the bundled PySpark application is found inside the
installed package; and the quickstart DAG runs end to end from a DAGs folder that only holds the
DAG file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
PYSPARK_PIN = "pyspark==4.2.0"
RESULT_MARKER = "@@DAG_TEST_RESULT@@ "


def _run(cmd: list, *, env: dict, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=timeout)
    shown = " ".join(map(str, cmd))
    assert proc.returncode == 0, f"$ {shown} exited {proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(venv python, clean env, scratch dir) with only the built wheel (and pyspark) installed."""
    scratch = tmp_path_factory.mktemp("wheel_install")
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW_", "AIRFLOW__", "PYTHON", "VIRTUAL_ENV", "PYSPARK_"))}
    # The development venv must not be on PATH either: spark-submit and python come from the new venv.
    dev_bin = str(Path(sys.executable).parent)
    base_env["PATH"] = os.pathsep.join(p for p in base_env.get("PATH", "").split(os.pathsep) if p and p != dev_bin)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", scratch / "dist"], env=base_env, cwd=REPO)
    wheels = list((scratch / "dist").glob("airflow_provider_shardyfusion-*.whl"))
    assert len(wheels) == 1, wheels

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is needed to install the wheel into a fresh venv (make install provides it)"
    venv = scratch / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], env=base_env, cwd=scratch)
    python = venv / "bin" / "python"
    _run([uv, "pip", "install", "--python", python, wheels[0], PYSPARK_PIN], env=base_env, cwd=scratch, timeout=1800)
    # pyspark-client (pulled by the spark provider) shares the pyspark/ folder: put pyspark's files back last.
    # Uninstall + install reuses the wheel just built (--reinstall would build it from its sdist again).
    _run([uv, "pip", "uninstall", "--python", python, "pyspark"], env=base_env, cwd=scratch)
    _run([uv, "pip", "install", "--python", python, "--no-deps", PYSPARK_PIN], env=base_env, cwd=scratch, timeout=1800)

    home = scratch / "airflow_home"
    dags = scratch / "dags"
    home.mkdir()
    dags.mkdir()
    env = {**base_env,
           "PATH": f"{venv / 'bin'}{os.pathsep}{base_env.get('PATH', '')}",
           "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python),
           # A private temp dir: the Spark bundle must be built from the installed files, not reused.
           "TMPDIR": str(scratch / "tmp")}
    (scratch / "tmp").mkdir()
    work = scratch / "cwd"  # not the repository: nothing of the source tree is importable
    work.mkdir()
    return python, env, scratch, work, dags


def test_airflow_lists_the_installed_provider(wheel_venv):
    python, env, _, work, _ = wheel_venv
    proc = _run([python.parent / "airflow", "providers", "list", "--output", "json"], env=env, cwd=work)
    start = proc.stdout.index("[")
    providers = {p["package_name"]: p for p in json.loads(proc.stdout[start:])}
    assert "airflow-provider-shardyfusion" in providers, sorted(providers)


def test_installed_modules_import_light_and_come_from_the_wheel(wheel_venv):
    python, env, _, work, _ = wheel_venv
    code = r"""
import importlib, json, sys
import airflow_provider_shardyfusion as pkg
info = pkg.get_provider_info()
modules = sorted({m for kind in ("operators", "sensors", "hooks", "triggers") for e in info[kind] for m in e["python-modules"]})
wanted = json.loads(sys.argv[1])
for name in modules:
    if name in wanted:
        importlib.import_module(name)
heavy = [m for m in ("pyspark", "rocksdict", "boto3", "botocore", "py4j") if m in sys.modules]
import tempfile
from airflow_provider_shardyfusion.submission.bundle import STREAMING_SCRIPT, build_bundle
built = build_bundle(tempfile.mkdtemp())
apps = [built.entry_script, built.application(STREAMING_SCRIPT)]
print(json.dumps({"file": pkg.__file__, "heavy": heavy, "modules": modules, "apps": [open(a).read() for a in apps]}))
"""
    # Every module the source tree has must import from the wheel (others are not written yet).
    present = [m for m in _provider_modules() if (REPO / (m.replace(".", "/") + ".py")).exists()]
    assert "airflow_provider_shardyfusion.operators.sharded_write" in present
    out = json.loads(_run([python, "-c", code, json.dumps(present)], env=env, cwd=work).stdout.strip().splitlines()[-1])
    site = str(python.parent.parent)
    assert out["file"].startswith(site), out["file"]
    assert out["heavy"] == [], f"importing {present} pulled in {out['heavy']}"
    # The installed wheel builds the bundle: its applications are the package's two scripts.
    scripts = REPO / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts"
    assert out["apps"] == [(scripts / name).read_text() for name in ("sharded_write_job.py", "streaming_job.py")]


def _provider_modules() -> list[str]:
    sys.path.insert(0, str(REPO))
    try:
        from airflow_provider_shardyfusion import get_provider_info
    finally:
        sys.path.remove(str(REPO))
    info = get_provider_info()
    return sorted({m for kind in ("operators", "sensors", "hooks", "triggers") for e in info[kind]
                   for m in e["python-modules"]})


def test_quickstart_dag_runs_from_the_installed_wheel(wheel_venv):
    python, env, scratch, work, dags = wheel_venv
    for name in ("quickstart.py", "_shardyfusion_examples.py", ".airflowignore"):  # the DAG file and its helper
        shutil.copy(REPO / "dags_example" / name, dags / name)
    runner = work / "run_dag.py"
    shutil.copy(REPO / "tests" / "e2e" / "run_dag.py", runner)
    demo = scratch / "demo"
    run_env = {**env, "SHARDYFUSION_DEMO_DIR": str(demo),
               "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"})}
    _run([python.parent / "airflow", "db", "migrate"], env=run_env, cwd=work)
    rows = 5_000
    proc = _run([python, runner, "shardyfusion_quickstart", json.dumps({"rows": rows})], env=run_env, cwd=work)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    assert lines, proc.stdout[-8000:] + proc.stderr[-8000:]
    result = json.loads(lines[-1][len(RESULT_MARKER):])
    assert result["state"] == "success" and set(result["tasks"].values()) == {"success"}, \
        proc.stdout[-8000:] + proc.stderr[-8000:]
    summary = result["xcoms"]["write_snapshot"]
    assert summary["rows"] == rows and summary["num_dbs"] == 16
    lookups = result["xcoms"]["read_back"]["lookups"]
    assert lookups["13"] == "payload-13" and lookups["7"] is None
    # The bundle was built from the installed package into this run's private temp dir.
    bundles = list((scratch / "tmp").glob(f"shardyfusion-bundles-{os.getuid()}/*/bundle.zip"))
    assert len(bundles) == 1, bundles
    assert str(REPO) not in proc.stdout.replace(str(scratch), "")
