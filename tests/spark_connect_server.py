"""A real Spark Connect server on loopback, started from the pip pyspark as its own process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.processes import free_port, stop_process

if TYPE_CHECKING:
    from collections.abc import Iterator

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@contextmanager
def connect_server(log_dir: Path, *, env: dict[str, str] | None = None, timeout: float = 120) -> Iterator[int]:
    """Start the server (``local[2,2]``: two cores, one retry per task); yield its port; stop it."""
    with connect_server_process(log_dir, env=env, timeout=timeout) as (port, _):
        yield port


# free_port() releases the port before the JVM binds it, and other workers start servers and
# clients meanwhile: a server that lost its port to one of them is started again on another.
_PORT_TAKEN = "Failed to bind"
_START_ATTEMPTS = 3


@contextmanager
def connect_server_process(log_dir: Path, *, env: dict[str, str] | None = None,
                           timeout: float = 120) -> Iterator[tuple[int, subprocess.Popen]]:
    """As ``connect_server``, yielding the port and the server's process (the leader of its own
    process group, with its Python workers), for tests that kill it."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        port, proc, log = _start(log_dir, env)
        try:
            deadline = time.monotonic() + timeout
            while "Spark Connect server started" not in (text := log.read_text()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    if _PORT_TAKEN in text and attempt < _START_ATTEMPTS:
                        log.rename(log.with_name(f"spark-connect-server-port-taken-{attempt}.log"))
                        break
                    raise RuntimeError(f"the Spark Connect server did not start:\n{text[-3000:]}")
                time.sleep(0.2)
            else:
                yield port, proc
                return
        finally:
            stop_process(proc, timeout=30)
    raise AssertionError("unreachable: the last attempt raises or yields")


def _start(log_dir: Path, env: dict[str, str] | None) -> tuple[int, subprocess.Popen, Path]:
    port = free_port()
    spark_submit = Path(sys.executable).parent / "spark-submit"
    log = log_dir / "spark-connect-server.log"
    cmd = [str(spark_submit), "--class", SERVER_CLASS, "--master", "local[2,2]",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4", "spark-internal"]
    server_env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **(env or {})}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=server_env, stdout=out, stderr=subprocess.STDOUT, cwd=str(log_dir),
                                start_new_session=True)
    return port, proc, log


def path_without_java(tmp_path: Path, path: str | None = None) -> str:
    """``path`` (default: this PATH) with every directory holding ``java`` replaced by a copy of it
    (symlinks) without java: a worker where no JVM can start."""
    dirs: list[str] = []
    for entry in (os.environ["PATH"] if path is None else path).split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        if not os.path.exists(os.path.join(entry, "java")):
            dirs.append(entry)
            continue
        shadow = tmp_path / f"bin-{len(dirs)}"
        shadow.mkdir()
        for name in os.listdir(entry):
            if not name.startswith("java"):
                (shadow / name).symlink_to(os.path.join(entry, name))
        dirs.append(str(shadow))
    joined = os.pathsep.join(dirs)
    assert shutil.which("java", path=joined) is None
    return joined
