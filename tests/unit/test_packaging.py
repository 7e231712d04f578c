"""Packaging: the pyspark / pyspark-client trap (SPEC §12), provider registration (SPEC §8), the
wheel carrying spark_jobs/ inside the package (SPEC §2), and the reader-only wheel (issue 39) being the
provider's own files."""

from __future__ import annotations

import configparser
import glob
import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import airflow_provider_shardyfusion
from airflow_provider_shardyfusion import get_provider_info

ROOT = Path(__file__).resolve().parents[2]
DIST = "airflow-provider-shardyfusion"
# make install puts pyspark and pyspark-client into the dev venv at this one version.
SPARK_VERSION = re.search(r"^PYSPARK_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
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


@pytest.fixture(scope="module")
def reader_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("reader_wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT / "reader")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (found,) = out.glob("shardyfusion_reader-*.whl")
    return found


# What the reader distribution (reader/pyproject.toml) maps in from the package.
READER_FILES = ("__init__.py", "__main__.py", "py.typed", "cli.py")
READER_ROOMS = ("core/", "serve/")


def test_reader_wheel_is_the_providers_files_unchanged(wheel, reader_wheel):
    """One copy of the code: every module the reader wheel ships is the provider wheel's, byte for byte,
    at the same version, with the same console script; Airflow's and Spark's rooms stay out."""
    package = "airflow_provider_shardyfusion/"
    with zipfile.ZipFile(wheel) as provider, zipfile.ZipFile(reader_wheel) as reader:
        ours = {n for n in reader.namelist() if n.startswith(package)}
        expected = {n for n in provider.namelist() if n.startswith(package)
                    and (n[len(package):] in READER_FILES or n[len(package):].startswith(READER_ROOMS))}
        assert ours == expected, sorted(ours ^ expected)
        dist_info = f"shardyfusion_reader-{airflow_provider_shardyfusion.__version__}.dist-info/"
        assert all(n.startswith((package, dist_info)) for n in reader.namelist()), reader.namelist()
        for name in sorted(ours):
            assert reader.read(name) == provider.read(name), name
        scripts = []
        for zf in (provider, reader):
            parser = configparser.ConfigParser()
            parser.read_string(zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode())
            scripts.append(dict(parser["console_scripts"]))
        assert scripts[0] == scripts[1] == {"shardyfusion": "airflow_provider_shardyfusion.cli:main"}
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in reader.namelist())
    assert reader_wheel.name == f"shardyfusion_reader-{airflow_provider_shardyfusion.__version__}-py3-none-any.whl"
    assert any(n.endswith("serve/app.py") for n in ours) and not any("/operators/" in n for n in ours)


def test_reader_requirements_are_what_reading_needs(reader_wheel):
    reqs = _requirements(reader_wheel)
    base = {name for name, variants in reqs.items() if any(r.marker is None for r in variants)}
    assert base == {"rocksdict", "xxhash", "msgspec", "cel-python", "boto3", "opentelemetry-api"}
    serve = {name for name, variants in reqs.items() if any(r.marker and r.marker.evaluate({"extra": "serve"}) for r in variants)}
    assert serve == {"fastapi", "uvicorn", "httptools", "uvloop"}
    provider_floors = {r.name.lower(): str(r.specifier) for r in map(Requirement, _pyproject_dependencies())}
    for name in base & set(provider_floors):  # the provider's floors, not another set to keep in step
        assert str(reqs[name][0].specifier) == provider_floors[name], name


def _pyproject_dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "airflow_provider_shardyfusion/__init__.py" in names
        assert "airflow_provider_shardyfusion/core/model/routing.py" in names
        assert "airflow_provider_shardyfusion/core/storage/s3.py" in names
        assert "airflow_provider_shardyfusion/spark_jobs/__init__.py" in names
        assert not any(n.startswith("spark_jobs/") for n in names)  # one address: inside the package only
        assert not any(n.startswith("tests/") for n in names)
        # every source file of spark_jobs/ made it into the wheel, the two applications included
        jobs = sorted((ROOT / "airflow_provider_shardyfusion" / "spark_jobs").rglob("*.py"))
        assert "airflow_provider_shardyfusion/spark_jobs/scripts/sharded_write_job.py" in names
        assert "airflow_provider_shardyfusion/spark_jobs/scripts/streaming_job.py" in names
        for path in jobs:
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" not in rel:
                assert rel in names
        ep_file = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(ep_file).decode())
    assert parser["apache_airflow_provider"]["provider_info"] == ENTRY_POINT


def test_wheel_ships_py_typed_license_and_urls(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "airflow_provider_shardyfusion/py.typed" in names
        assert "airflow_provider_shardyfusion/compat.py" in names
        license_files = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert license_files and b"Apache License" in zf.read(license_files[0])
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    urls = dict(line.split(": ", 1)[1].split(", ", 1) for line in metadata.splitlines() if line.startswith("Project-URL: "))
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(urls) and all(u.startswith("https://") for u in urls.values())


def _requirements(wheel) -> dict[str, list[Requirement]]:
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out: dict[str, list[Requirement]] = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist: "):
            req = Requirement(line.split(": ", 1)[1])
            out.setdefault(req.name.lower(), []).append(req)
    return out


def test_install_requirements_are_ranges_with_the_tested_floors(wheel):
    """No exact pins (Airflow constraints files must be able to choose), and the floors are the ones
    README "Supported versions" explains and tests/deploy/ installs."""
    from airflow_provider_shardyfusion import compat

    reqs = _requirements(wheel)
    for variants in reqs.values():
        for req in variants:
            assert not any(spec.operator in ("==", "===") for spec in req.specifier), f"exact pin: {req}"
    assert "pyspark-client" not in reqs  # the spark provider brings it; compat refuses a mix at run time
    floors = {name: min((spec.version for r in reqs[name] for spec in r.specifier if spec.operator == ">="),
                        default=None) for name in reqs}
    assert floors["apache-airflow"] == "3.3.0"
    assert floors["apache-airflow-providers-apache-spark"] == compat.SPARK_PROVIDER_FLOOR == "5.6.0"
    assert floors["apache-airflow-providers-amazon"] == "9.4.0"
    # The hook builds sessions with the amazon provider's SessionFactory (not its public API): capped.
    assert {str(s) for r in reqs["apache-airflow-providers-amazon"] for s in r.specifier if s.operator == "<"} == {"<10"}
    spark_extra = [r for r in reqs["pyspark"] if r.marker and r.marker.evaluate({"extra": "spark"})]
    assert spark_extra and str(spark_extra[0].specifier) in ("<5,>=4.1", ">=4.1,<5")
    connect_extra = [r for r in reqs["apache-airflow-providers-apache-spark"]
                     if r.marker and r.marker.evaluate({"extra": "connect"})]
    assert connect_extra and str(connect_extra[0].specifier) in ("<7,>=6.0", ">=6.0,<7")
