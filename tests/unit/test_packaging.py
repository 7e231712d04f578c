"""Packaging: the pyspark / pyspark-client trap (SPEC §12), provider registration (SPEC §8), and the
wheel carrying spark_jobs/ inside the package (SPEC §2)."""

from __future__ import annotations

import configparser
import glob
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import airflow_provider_shardyfusion
from airflow_provider_shardyfusion import get_provider_info

ROOT = Path(__file__).resolve().parents[2]
DIST = "airflow-provider-shardyfusion"
SPARK_VERSION = "4.2.0"
ENTRY_POINT = "airflow_provider_shardyfusion:get_provider_info"


def test_pyspark_and_pyspark_client_agree():
    import pyspark

    assert pyspark.__version__ == SPARK_VERSION
    assert md.version("pyspark") == SPARK_VERSION
    assert md.version("pyspark-client") == SPARK_VERSION


def test_pyspark_is_the_full_distribution_in_this_venv():
    import pyspark

    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    package_dir = Path(pyspark.__file__).resolve().parent
    assert package_dir.parent == site_packages
    assert Path(sys.prefix).resolve() in package_dir.parents
    jars = package_dir / "jars"
    assert jars.is_dir(), "pyspark/jars missing: pyspark-client overwrote pyspark? reinstall pyspark"
    assert glob.glob(str(jars / f"spark-core_*-{SPARK_VERSION}.jar")), sorted(os.listdir(jars))[:20]


def test_provider_info_matches_distribution():
    info = get_provider_info()
    assert info["package-name"] == DIST
    assert md.distribution(DIST).metadata["Name"] == DIST
    assert info["versions"][0] == airflow_provider_shardyfusion.__version__ == md.version(DIST)
    for section in ("operators", "sensors", "hooks", "triggers"):
        assert info[section] and all(m["python-modules"] for m in info[section])


def test_entry_point_registered():
    eps = md.distribution(DIST).entry_points.select(group="apache_airflow_provider")
    assert [ep.value for ep in eps] == [ENTRY_POINT]
    ep = next(iter(eps))
    assert ep.load() is get_provider_info
    assert ENTRY_POINT in {e.value for e in md.entry_points(group="apache_airflow_provider")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("airflow_provider_shardyfusion-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "airflow_provider_shardyfusion/__init__.py" in names
        assert "airflow_provider_shardyfusion/core/routing.py" in names
        assert "airflow_provider_shardyfusion/core/storage/s3.py" in names
        assert "airflow_provider_shardyfusion/spark_jobs/__init__.py" in names
        assert not any(n.startswith("spark_jobs/") for n in names)  # mapped into the package, not top level
        assert not any(n.startswith("tests/") for n in names)
        # every source file of spark_jobs/ made it into the wheel
        for path in (ROOT / "spark_jobs").rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" not in rel:
                assert f"airflow_provider_shardyfusion/{rel}" in names
        ep_file = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(ep_file).decode())
    assert parser["apache_airflow_provider"]["provider_info"] == ENTRY_POINT
