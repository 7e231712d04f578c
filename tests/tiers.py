"""Test tiers: which real parts a test uses, so ``-m "not s3"`` (and spark, airflow) means what it says.

Markers come from the fixtures a test really requests (the S3 server, a Spark session, a migrated
Airflow), so a new test is placed in its tier without anyone remembering a marker. A test that
reaches a part its tier excludes by another road (``request.getfixturevalue``, a helper that runs
spark-submit) is caught by the guards in ``tests/conftest.py`` and fails naming the marker it needs.
"""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Collection
    from pathlib import Path

# Fixture name → marker of the real part it starts.
FIXTURE_MARKERS = {
    "s3_server": "s3",
    "s3_endpoint": "s3",
    "spark": "spark",
    "speculative_spark": "spark",
    "standalone_master": "spark",
    "connect_conn": "spark",
    "thin_server": "spark",
    "airflow_env": "airflow",
    "run_dag": "airflow",
}
# A parametrized test whose store parameter is "s3" talks to the S3 server in that case only.
S3_PARAM_VALUES = frozenset({"s3"})


def markers_for(fixturenames: list[str] | tuple[str, ...], params: dict[str, object]) -> set[str]:
    found = {marker for name, marker in FIXTURE_MARKERS.items() if name in fixturenames}
    if any(isinstance(value, str) and value in S3_PARAM_VALUES for value in params.values()):
        found.add("s3")
    return found


def excluded_parts(markexpr: str) -> set[str]:
    """The parts a ``-m`` expression leaves out, read from its ``not <marker>`` terms."""
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return {words[i + 1] for i, word in enumerate(words[:-1]) if word == "not" and words[i + 1] in {"s3", "spark", "airflow"}}


SPARK_MARKER_MESSAGE = "this test runs Spark but is not marked 'spark': add pytest.mark.spark (tests/tiers.py)"
S3_MARKER_MESSAGE = "this test uses the S3 server but is not marked 's3': add pytest.mark.s3 (tests/tiers.py)"

# Where a process gets a Spark session or context once pyspark is imported. A JVM gateway outlives
# `stop()` and is only launched when none exists, so after any Spark test in the same process the
# refusing SPARK_HOME is never consulted again: these entry points are refused instead.
# (module, class inside it, attribute names); Spark Connect's session has entry points of its own.
SPARK_ENTRY_POINTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("pyspark.core.context", "SparkContext", ("_ensure_initialized", "getOrCreate")),
    ("pyspark.sql.session", "SparkSession", ("getActiveSession", "active")),
    ("pyspark.sql.session", "SparkSession.Builder", ("getOrCreate", "create")),
    ("pyspark.sql.connect.session", "SparkSession", ("getActiveSession", "active")),
    ("pyspark.sql.connect.session", "SparkSession.Builder", ("getOrCreate", "create")),
)


def _refuse_spark(*_args: Any, **_kwargs: Any) -> Any:
    pytest.fail(SPARK_MARKER_MESSAGE)


def refuse_spark_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every in-process way to a Spark session or context fail with the marker message.

    Only modules already imported are patched: a pyspark module not imported yet holds no gateway
    and no session, and a launch from it goes through the refusing SPARK_HOME.
    """
    for module_name, class_path, names in SPARK_ENTRY_POINTS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        owner: Any = module
        for part in class_path.split("."):
            owner = getattr(owner, part)
        for name in names:
            if name in vars(owner):
                monkeypatch.setattr(owner, name, _refuse_spark)


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def refuse_s3_connections(monkeypatch: pytest.MonkeyPatch, ports: Collection[int]) -> None:
    """Make every exchange of this process with the S3 server(s) on ``ports`` fail with the marker message.

    At the socket, so it holds whichever client talks (boto3, aiobotocore, plain HTTP) and however
    the address reached the test (a session fixture a marked test created, a global): new
    connections are refused, and a pooled one a marked test left open refuses to send.
    ``pytest.fail`` raises a BaseException, which the clients' retry loops do not swallow.
    """
    if not ports:
        return
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex
    send, sendall = socket.socket.send, socket.socket.sendall

    def check(address: Any) -> None:
        if (isinstance(address, tuple) and len(address) >= 2 and address[0] in _LOOPBACK
                and address[1] in ports):
            pytest.fail(S3_MARKER_MESSAGE)

    def check_peer(sock: socket.socket) -> None:
        try:
            peer = sock.getpeername()
        except OSError:  # not connected: the send fails on its own
            return
        check(peer)

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        check(address)
        connect(sock, address)

    def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
        check(address)
        return connect_ex(sock, address)

    def guarded_send(sock: socket.socket, data: Any, *flags: int) -> int:
        check_peer(sock)
        return send(sock, data, *flags)

    def guarded_sendall(sock: socket.socket, data: Any, *flags: int) -> None:
        check_peer(sock)
        sendall(sock, data, *flags)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_connect_ex)
    monkeypatch.setattr(socket.socket, "send", guarded_send)
    monkeypatch.setattr(socket.socket, "sendall", guarded_sendall)


def write_spark_refusal(folder: Path) -> Path:
    """A SPARK_HOME whose launchers refuse to start: a test that runs Spark unmarked fails saying so."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    message = SPARK_MARKER_MESSAGE
    for name in ("spark-submit", "spark-class", "pyspark"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"{message}\" >&2\nexit 3\n")
        script.chmod(0o755)
    return folder
