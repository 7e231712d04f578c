"""Real Airflow for tests: a temporary AIRFLOW_HOME with a migrated SQLite metadata DB.

Airflow reads its configuration once, at import, so DAGs run in a child process (``run_dag.py``)
with this environment; the pytest process itself never imports Airflow's settings against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.tiers import excluded_parts

if TYPE_CHECKING:
    from collections.abc import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO_ROOT / "dags_example"
RUNNER = Path(__file__).parent / "e2e" / "run_dag.py"
RESULT_MARKER = "@@DAG_TEST_RESULT@@ "

# Variables of an outer Airflow (a developer's shell, CI) that would point the child elsewhere.
_STRIPPED_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")


@dataclass
class DagTestResult:
    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, str]
    xcoms: dict[str, Any]
    output: str = field(repr=False, default="")


class DagTestFailed(AssertionError):
    pass


@dataclass
class AirflowEnv:
    home: Path
    env: dict[str, str]

    def run_dag(self, dag_id: str, *, conf: dict[str, Any] | None = None, extra_env: dict[str, str] | None = None,
                timeout: float = 600, expect_success: bool = True,
                on_line: Callable[[str], None] | None = None) -> DagTestResult:
        """``dag.test()`` of ``dag_id`` in a child process; raise with its output unless every task succeeded.

        ``on_line`` sees each output line as it comes (e.g. to act once a task has deferred).
        """
        cmd = [sys.executable, str(RUNNER), dag_id, json.dumps(conf or {})]
        proc = subprocess.Popen(cmd, env={**self.env, **(extra_env or {})}, cwd=str(REPO_ROOT), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if on_line is not None:
                    on_line(line)
            returncode = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
        output = f"$ {' '.join(cmd)}\n{''.join(lines)}"
        if not watchdog.is_alive() and returncode < 0:
            raise DagTestFailed(f"dag.test() of {dag_id!r} killed after {timeout}s\n{output}")
        results = [ln for ln in lines if ln.startswith(RESULT_MARKER)]
        if returncode != 0 or not results:
            raise DagTestFailed(f"dag.test() of {dag_id!r} exited with {returncode}\n{output}")
        data = json.loads(results[-1][len(RESULT_MARKER):])
        result = DagTestResult(output=output, **data)
        failed = {t: s for t, s in result.tasks.items() if s != "success"}
        if expect_success and (result.state != "success" or failed):
            raise DagTestFailed(f"dag.test() of {dag_id!r}: run {result.state}, tasks not successful: {failed}\n{output}")
        return result


@pytest.fixture(scope="session")
def airflow_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    if "airflow" in excluded_parts(request.config.option.markexpr or ""):
        pytest.fail("this test runs Airflow but is not marked 'airflow': add pytest.mark.airflow (tests/tiers.py)")
    home = tmp_path_factory.mktemp("airflow_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_PREFIXES)}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS_FOLDER),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        # The repo root on the path: the provider and the example DAGs import without an install.
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return AirflowEnv(home=home, env=env)


@pytest.fixture(scope="session")
def run_dag(airflow_env: AirflowEnv) -> Callable[..., DagTestResult]:
    return airflow_env.run_dag
