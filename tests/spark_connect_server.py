"""A real Spark Connect server on loopback, started from the pip pyspark as its own process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.conftest import free_port, stop_process

if TYPE_CHECKING:
    from collections.abc import Iterator

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@contextmanager
def connect_server(log_dir: Path, *, env: dict[str, str] | None = None, timeout: float = 120) -> Iterator[int]:
    """Start the server (``local[2,2]``: two cores, one retry per task); yield its port; stop it."""
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
    try:
        deadline = time.monotonic() + timeout
        while "Spark Connect server started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield port
    finally:
        stop_process(proc, timeout=30)
