"""A real Spark standalone cluster on loopback (one master, N workers), for integration tests.

Each worker can bind its own loopback address (the whole 127.0.0.0/8 is loopback on Linux), so
Spark sees several *hosts* on one machine. That matters for speculative execution: Spark never
places a speculative copy on a host where the task already runs, so one host never speculates.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.processes import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

SPARK_CLASS = str(Path(sys.executable).with_name("spark-class"))
MASTER_HOST = "127.0.0.1"


@dataclass(frozen=True)
class WorkerSpec:
    host: str = MASTER_HOST
    cores: int = 1
    memory: str = "1g"


def alive_workers(webui_port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://{MASTER_HOST}:{webui_port}/json/", timeout=2) as resp:
        state = json.load(resp)
    return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((MASTER_HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(ready, procs, logs: Path, deadline: float, what: str) -> None:
    while not ready():
        for name, proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"Spark daemon {name} exited early (code {proc.returncode}); logs in "
                                   f"{logs}:\n{_tail(logs / f'{name}.log')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} in time; logs in {logs}")
        time.sleep(0.2)


@contextmanager
def standalone_cluster(logs: Path, workers: Sequence[WorkerSpec] = (WorkerSpec(),), *,
                       wait_for_workers: bool = True, timeout: float = 120.0) -> Iterator[str]:
    """Yield ``spark://127.0.0.1:<port>`` once every worker is ALIVE; stop all daemons afterwards.

    With ``wait_for_workers=False`` it yields as soon as the master listens and the workers are
    launched, so a driver can start its JVM meanwhile (it should then wait for its executors itself,
    e.g. with ``spark.scheduler.minRegisteredResourcesRatio=1.0``).
    Daemon logs go to ``logs/<name>.log``; each worker gets its own ``SPARK_WORKER_DIR`` and
    ``SPARK_LOCAL_IP`` (its executors inherit both), and executors run this interpreter.
    """
    logs.mkdir(parents=True, exist_ok=True)
    base_env = {**os.environ, "SPARK_LOG_DIR": str(logs), "PYSPARK_PYTHON": sys.executable}
    port, webui = free_port(), free_port()
    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, local_ip: str, *args: str, **env: str) -> None:
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([SPARK_CLASS, *args], env={**base_env, "SPARK_LOCAL_IP": local_ip, **env},
                                    stdout=out, stderr=subprocess.STDOUT)
        procs.append((name, proc))

    try:
        start("master", MASTER_HOST, "org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
              "--port", str(port), "--webui-port", str(webui))
        deadline = time.monotonic() + timeout
        # A worker that finds no master retries only after 5-15 s: start workers once it listens.
        _wait(lambda: _listening(port), procs, logs, deadline, f"the master did not listen on port {port}")
        for i, w in enumerate(workers):
            start(f"worker{i}", w.host, "org.apache.spark.deploy.worker.Worker", f"spark://{MASTER_HOST}:{port}",
                  "--host", w.host, "--cores", str(w.cores), "--memory", w.memory, "--webui-port", str(free_port()),
                  SPARK_WORKER_DIR=str(logs / f"work{i}"))

        def registered() -> bool:
            try:
                return len(alive_workers(webui)) >= len(workers)
            except OSError:
                return False

        if wait_for_workers:
            _wait(registered, procs, logs, deadline,
                  f"{len(workers)} worker(s) did not register with spark://{MASTER_HOST}:{port}")
        yield f"spark://{MASTER_HOST}:{port}"
    finally:
        for _, proc in reversed(procs):
            proc.terminate()
        for _, proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
