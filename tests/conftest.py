"""Shared fixtures: real local stores, and a real S3 API server (moto_server) on loopback."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.figures import figure_lines
from tests.processes import free_port, stop_process
from tests.tiers import (
    S3_MARKER_MESSAGE,
    excluded_parts,
    markers_for,
    refuse_s3_connections,
    refuse_spark_in_process,
    write_spark_refusal,
)

ROOT = Path(__file__).resolve().parents[1]

# py4j logs "Closing down clientserver connection" from __del__ after pytest closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)
VENV_BIN = str(Path(sys.executable).parent)

# Local Spark and spark-submit find the right interpreter and binaries whichever way pytest runs.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Fake S3 credentials for the moto server, set before any Spark Python worker starts (workers
# inherit the environment once); they also keep real credentials of the machine out of tests.
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing-secret", AWS_DEFAULT_REGION="us-east-1")
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)
if VENV_BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = VENV_BIN + os.pathsep + os.environ.get("PATH", "")
# The suite starts hundreds of Python processes (DAG runs, spark-submit drivers, Spark's Python
# workers, CLIs); with PYTHONDONTWRITEBYTECODE each compiles Airflow, PySpark & co. from source again
# (~4 s of CPU per Airflow process). Their bytecode goes to a cache of the suite's own instead, so the
# source tree and the venv stay as free of .pyc files as the variable asked.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / ".pytest_cache" / "pycache"))
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


_SPARK_REFUSAL: list[Path] = []


def _spark_refusal() -> Path:
    if not _SPARK_REFUSAL:
        _SPARK_REFUSAL.append(write_spark_refusal(Path(tempfile.mkdtemp(prefix="shardyfusion-no-spark-"))))
    return _SPARK_REFUSAL[0]


def pytest_configure(config):
    # A tier without Spark: any Spark launch (in-process session or spark-submit) fails at once.
    if "spark" in excluded_parts(config.option.markexpr or ""):
        refusal = _spark_refusal()
        os.environ["SPARK_HOME"] = str(refusal)
        os.environ["PATH"] = str(refusal / "bin") + os.pathsep + os.environ["PATH"]


@pytest.fixture(autouse=True)
def _no_log_handler_outlives_its_stream():
    """A test that runs an Airflow operator sets Airflow's logging up on the streams of that moment,
    capsys's; once capsys closed them, every later log line in the worker printed "--- Logging
    error ---" to stderr, failing the next test that expects a quiet stderr (order-dependent)."""
    yield
    for logger in (logging.root, *logging.root.manager.loggerDict.values()):
        for handler in list(getattr(logger, "handlers", ())):
            if getattr(getattr(handler, "stream", None), "closed", False):
                logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    """In every run, not only a tier run: a test not marked 'spark' cannot launch Spark or get a
    session of one already running, and one not marked 's3' cannot reach the S3 server, so
    `make test` catches the missing marker that would turn `make test-fast` red."""
    if request.node.get_closest_marker("spark") is None:
        refusal = _spark_refusal()
        monkeypatch.setenv("SPARK_HOME", str(refusal))
        monkeypatch.setenv("PATH", str(refusal / "bin") + os.pathsep + os.environ["PATH"])
        refuse_spark_in_process(monkeypatch)
    if request.node.get_closest_marker("s3") is None:
        refuse_s3_connections(monkeypatch, _S3_PORTS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.scheduling import FileSeconds, LongestFileFirst

    config.pluginmanager.register(FileSeconds(), "shardyfusion-file-seconds")
    return LongestFileFirst(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for marker in sorted(markers_for(tuple(getattr(item, "fixturenames", ())), params)):
            item.add_marker(marker)


def pytest_terminal_summary(terminalreporter):
    # Here, not in tests/reliability/conftest.py: under xdist only the root conftest runs in the controller.
    lines = figure_lines(terminalreporter.stats)
    if lines:
        terminalreporter.section("reliability figures")
        for line in lines:
            terminalreporter.write_line(line)


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not listen on 127.0.0.1:{port} within {timeout}s")


# Ports of the S3 servers this process started: connections to them fail in a test not marked 's3'.
_S3_PORTS: set[int] = set()


@pytest.fixture(scope="session")
def s3_endpoint(request):
    """A moto S3 server on a free loopback port, reached by boto3 over HTTP; stopped afterwards.

    Session-wide; tests ask for ``s3_server``, which checks the asking test's marker each time."""
    if "s3" in excluded_parts(request.config.option.markexpr or ""):
        pytest.fail(S3_MARKER_MESSAGE)
    port = free_port()
    moto = Path(VENV_BIN) / "moto_server"
    cmd = [str(moto)] if moto.exists() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _S3_PORTS.add(port)
    try:
        _wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _S3_PORTS.discard(port)
        stop_process(proc)


@pytest.fixture
def s3_server(request, s3_endpoint):
    """The S3 server's endpoint URL, for a test marked 's3' only (``request.getfixturevalue`` included)."""
    if request.node.get_closest_marker("s3") is None:
        pytest.fail(S3_MARKER_MESSAGE)
    return s3_endpoint


@pytest.fixture
def s3_options(s3_server):
    return {"endpoint_url": s3_server, "region_name": "us-east-1", "addressing_style": "path"}


@pytest.fixture
def s3_root(s3_server, s3_options):
    """A fresh bucket per test: ``s3://<bucket>/snap``."""
    from airflow_provider_shardyfusion.core.storage import StorageOptions
    from airflow_provider_shardyfusion.core.storage.s3 import make_s3_client

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    make_s3_client(StorageOptions.from_dict(s3_options)).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/snap"


@pytest.fixture
def file_root(tmp_path):
    return f"file://{tmp_path}/snap"


@pytest.fixture(params=["file", "s3"])
def any_root(request):
    """Run a test once against the local store and once against the S3 server."""
    if request.param == "file":
        return request.getfixturevalue("file_root"), None
    return request.getfixturevalue("s3_root"), request.getfixturevalue("s3_options")
