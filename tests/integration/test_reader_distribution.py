"""The reader-only distribution (``reader/pyproject.toml``: shardyfusion-reader, issue 39 item 3).

Its wheel, built from this checkout, goes into a fresh venv with its ``serve`` extra, resolved from
the package registry as a service host would (uv's cache makes repeats quick). There, with no
Airflow, PySpark, pyarrow or numpy installed and without this checkout on ``sys.path``: the
provider's import paths work, ``ShardedReader`` reads a snapshot on the S3 test server with typed
values exactly, ``shardyfusion get`` prints the typed values as JSON, and ``shardyfusion serve``
answers over HTTP on loopback. Needs the network the first time (the registry), like tests/deploy/.
"""

from __future__ import annotations

import http.client
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from airflow_provider_shardyfusion import __version__
from airflow_provider_shardyfusion.core.model.value_schema import VALUE_ENCODING_ENGINE, from_arrow
from airflow_provider_shardyfusion.serve.app import RUN_ID_HEADER
from tests.figures import PROPERTY
from tests.polling import wait_for
from tests.processes import free_port, stop_process
from tests.snapshot_factory import build_snapshot
from tests.typed_values import ROW, SCHEMA, assert_same, encode_v3, expected_rows

pytestmark = pytest.mark.s3

REPO = Path(__file__).resolve().parents[2]
KEYS = 200
RUN_ID = "reader-dist"
ABSENT = ("airflow", "pyspark", "pyarrow", "numpy")

# Run by the venv's python, from a folder outside the checkout: argv = root, endpoint, result file.
PROBE = r"""
import importlib, importlib.util, pickle, pkgutil, sys
from pathlib import Path

ABSENT = %(absent)r
assert {name: importlib.util.find_spec(name) for name in ABSENT} == dict.fromkeys(ABSENT), "installed here"
import airflow_provider_shardyfusion as pkg
assert Path(pkg.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), pkg.__file__  # the wheel's
import airflow_provider_shardyfusion.cli
assert "fastapi" not in sys.modules and "uvicorn" not in sys.modules  # the serve extra, for serve only
modules = ["airflow_provider_shardyfusion.__main__", "airflow_provider_shardyfusion.serve.app",
           "airflow_provider_shardyfusion.serve.server"]
for room in ("read", "lifecycle", "model", "storage"):
    package = importlib.import_module("airflow_provider_shardyfusion.core." + room)
    modules += [m.name for m in pkgutil.iter_modules(package.__path__, package.__name__ + ".")]
for name in modules:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ABSENT)
assert not loaded, loaded

from airflow_provider_shardyfusion.core.read.reader import ShardedReader  # the provider's import path
from airflow_provider_shardyfusion import AsyncShardedReader

root, endpoint, out = sys.argv[1:4]
options = {"endpoint_url": endpoint, "region_name": "us-east-1", "addressing_style": "path"}
with ShardedReader(root, storage_options=options) as reader:  # typed: the run's value schema
    result = {"run_id": reader.run_id, "values": reader.multi_get(list(range(%(keys)d + 1))),
              "one": reader.get(7), "version": pkg.__version__, "modules": len(modules)}
Path(out).write_bytes(pickle.dumps(result))
"""


def _run(cmd: list[object], *, env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"$ {' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _bare_env() -> dict[str, str]:
    """This environment without the checkout on the path and without the dev venv (the S3 test
    credentials stay: tests/conftest.py sets them for every child)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "AIRFLOW"))}
    dev_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin)
    return env


def _get(port: int, path: str) -> tuple[int, dict[str, str], object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())
    finally:
        conn.close()


def _multi_get(port: int, keys: list[int]) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/multi_get", body=json.dumps({"keys": keys}), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        conn.close()



def _as_json(value):
    """A typed value as ``shardyfusion get`` and ``serve`` show it: JSON's own types, keys as text."""
    return msgspec.to_builtins(value, str_keys=True)

def test_reader_wheel_reads_and_serves_without_airflow_or_spark(request, tmp_path, s3_server, s3_root, s3_options):
    import pyarrow as pa

    schema = from_arrow(SCHEMA, SCHEMA.names)
    rows = [{**ROW, "i64": key, "s": f"k{key}-é"} for key in range(KEYS)]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)  # float32 and the like as Arrow holds them
    want = expected_rows(table, schema)
    stored = {key: encode_v3(row, schema) for key, row in enumerate(table.to_pylist())}
    build_snapshot(s3_root, stored.items(), num_dbs=4, run_id=RUN_ID, storage_options=s3_options, value_format="json",
                   value_schema=schema, value_encoding_version=VALUE_ENCODING_ENGINE, encode_value=bytes)

    env = _bare_env()
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv comes with make install"
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, REPO / "reader"], env=env, cwd=REPO)
    (wheel,) = dist.glob("shardyfusion_reader-*.whl")
    assert wheel.name == f"shardyfusion_reader-{__version__}-py3-none-any.whl"  # the provider's version

    venv = tmp_path / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, venv], env=env, cwd=tmp_path)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    started = time.monotonic()
    _run([uv, "pip", "install", "--quiet", "--python", python, f"{wheel}[serve]"], env=env, cwd=tmp_path, timeout=600)
    install_s = time.monotonic() - started
    packages = _run([uv, "pip", "freeze", "--python", python], env=env, cwd=tmp_path).splitlines()
    line = f"FIGURE {request.node.name}: reader[serve] installed in {install_s:.1f} s, {len(packages)} packages"
    print(line)
    request.node.user_properties.append((PROPERTY, line))
    assert not [p for p in packages if p.split("==")[0].lower().startswith(("apache-airflow", "pyspark", "pyarrow"))]

    work = tmp_path / "work"  # not the checkout: only the installed wheel can be imported
    work.mkdir()
    (work / "probe.py").write_text(PROBE % {"absent": ABSENT, "keys": KEYS})
    _run([python, "probe.py", s3_root, s3_server, work / "result.pkl"], env=env, cwd=work)
    result = pickle.loads((work / "result.pkl").read_bytes())
    assert (result["run_id"], result["version"]) == (RUN_ID, __version__) and result["modules"] > 40
    assert result["values"][KEYS] is None
    assert_same(result["values"][:KEYS], want)
    assert_same(result["one"], want[7])

    s3_flags = ["--endpoint-url", s3_server, "--region", "us-east-1", "--path-style"]
    out = json.loads(_run([bin_dir / "shardyfusion", "get", s3_root, "3", "150", str(KEYS + 1), *s3_flags], env=env, cwd=work))
    assert out["run_id"] == RUN_ID
    # The command shows typed values as JSON (timestamps stored as epoch microseconds as RFC 3339 text).
    assert [(r["key"], r["found"], r["value"]) for r in out["results"]] == [
        (3, True, _as_json(want[3])), (150, True, _as_json(want[150])), (KEYS + 1, False, None)]

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [str(bin_dir / "shardyfusion"), "serve", s3_root, "--port", str(port), *s3_flags,
             "--follow-interval-s", "5", "--cache-dir", str(tmp_path / "cache")],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=work,
        )
        try:
            wait_for(lambda: _ready(server, port, log), timeout=60, what=f"the reader's server on port {port} (log: {log})")
            status, headers, body = _get(port, "/v1/keys/42")
            assert (status, headers[RUN_ID_HEADER.lower()]) == (200, RUN_ID)
            assert body == {"run_id": RUN_ID, "key": 42, "found": True, "value": json.loads(stored[42])}
            answer = _multi_get(port, list(range(KEYS + 1)))
            assert answer == {"run_id": RUN_ID, "values": [json.loads(stored[k]) for k in range(KEYS)] + [None]}
            server.send_signal(signal.SIGTERM)
            # uvicorn re-raises the signal it handled; the log shows the graceful shutdown.
            assert server.wait(timeout=40) in (0, -signal.SIGTERM), log.read_text()[-2000:]
        finally:
            if server.poll() is None:
                stop_process(server)
    text = log.read_text()
    assert "Application shutdown complete" in text and "Traceback" not in text, text[-2000:]


def _ready(server: subprocess.Popen, port: int, log: Path) -> bool:
    if server.poll() is not None:
        raise AssertionError(f"the server exited with {server.returncode}: {log.read_text()[-2000:]}")
    try:
        return _get(port, "/readyz")[0] == 200
    except OSError:
        return False
