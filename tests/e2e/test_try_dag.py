"""``make try``: a user's DAG file run with ``dag.test()`` in the demo's throw-away Airflow; the exit
code says whether every task succeeded (plain ``dag.test()`` exits 0 when one failed).

Both tests share one throw-away Airflow home (migrated once by the first run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRY = REPO / "dags_example" / "try_dag.py"
FAILING = Path(__file__).with_name("dags") / "typo_column_dag.py"

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("try-home")


def try_dag(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TRY), *args, "--home", str(home)], cwd=str(REPO),
                          capture_output=True, text=True, timeout=900)


def test_a_failed_task_makes_try_exit_non_zero(home):
    proc = try_dag(home, str(FAILING))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-5000:]
    assert "ok   make_input: success" in proc.stdout and "FAIL write: failed" in proc.stdout
    assert "1 of 2 tasks did not succeed: write" in proc.stderr
    # The summary repeats the task's one-line error (it is far above, among the streamed log lines).
    summary = proc.stderr[proc.stderr.index("1 of 2 tasks did not succeed"):]
    assert "try: the last error logged: " in summary and "value_column 'paylod' is not a column" in summary, summary
    assert "value_column 'paylod' is not a column of input_path" in out  # the task's own error, streamed
    # The operator refused before anything was written, and its extra link read no absent XCom.
    assert not (home / "data" / "typo-snapshot").exists()
    assert "XCom not found" not in out


def test_a_file_that_is_not_there_or_has_no_dag(home, tmp_path):
    assert try_dag(home, str(tmp_path / "missing.py")).returncode == 2
    (tmp_path / "no_dag.py").write_text("x = 1\n")
    proc = try_dag(home, str(tmp_path / "no_dag.py"))
    assert proc.returncode == 2 and "DAGs found: []" in proc.stderr


@pytest.mark.spark
def test_an_example_dag_runs_and_exits_zero(home):
    proc = try_dag(home, str(REPO / "dags_example" / "quickstart.py"), "--conf", '{"rows": 300}')
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "DAG shardyfusion_quickstart run " in proc.stdout and ": success" in proc.stdout
    assert "FAIL" not in proc.stdout
    assert (home / "data" / "shardyfusion_quickstart" / "snapshot" / "_CURRENT").exists()
