"""``make try DAG=path/to/dag.py``: run a DAG file of your own with ``dag.test()`` in the demo's
throw-away Airflow, and exit non-zero when a task failed (``dag.test()`` itself exits 0 then).

The Airflow is the one of ``make demo`` (``.demo/airflow``: SQLite metadata DB, Spark ``local[*]``
as ``spark_default``, examples' data under ``.demo/data``); the DAGs folder is the file's own
folder, so the file may import modules next to it. The task logs stream as the DAG runs; the last
lines list every task's state.

Usage: python dags_example/try_dag.py DAG_FILE [--dag-id ID] [--conf JSON] [--home DIR]
Exit codes: 0 every task succeeded (or was skipped); 1 a task or the run failed; 2 the file did not
load or holds no such DAG.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from run_demo import DEMO, REPO, demo_env, run  # next to this script (its folder is on sys.path)

RUNNER = REPO / "tests" / "e2e" / "run_dag.py"
RESULT_MARKER = "@@DAG_TEST_RESULT@@ "
_FINE = ("success", "skipped")
# A traceback's last line, e.g. "airflow...ConfigError: value_column 'x' is not a column": the one-line
# error the summary repeats, so it is not lost above hundreds of streamed log lines.
_ERROR_LINE = re.compile(r"(?:^|\s)((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): .+)$")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dag_file", type=Path)
    parser.add_argument("--dag-id", default="", help="needed when the file defines more than one DAG")
    parser.add_argument("--conf", default=None, help="the run's conf (params), as JSON")
    parser.add_argument("--home", type=Path, default=DEMO, help=f"the throw-away Airflow's folder (default {DEMO})")
    args = parser.parse_args(argv)
    dag_file = args.dag_file.resolve()
    if not dag_file.is_file():
        print(f"try: {args.dag_file} is not a file", file=sys.stderr)
        return 2

    env = demo_env(args.home, dag_file.parent)
    (args.home / "airflow").mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "airflow", "db", "migrate"], env, f"airflow db migrate ({env['AIRFLOW_HOME']})")
    print(f"==> dag.test() of {dag_file}", flush=True)
    cmd = [sys.executable, str(RUNNER), "--file", str(dag_file), args.dag_id, *([args.conf] if args.conf else [])]
    result: dict = {}
    last_error = None
    with subprocess.Popen(cmd, env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(RESULT_MARKER):
                result = json.loads(line[len(RESULT_MARKER):])
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
                if (found := _ERROR_LINE.search(line.rstrip())) is not None:
                    last_error = found.group(1)
    return report(result, child.returncode, last_error)


def report(result: dict, returncode: int, last_error: str | None = None) -> int:
    """Print the outcome; the exit code says whether every task succeeded."""
    if "error" in result or not result:
        print(f"\ntry: {result.get('error', f'the DAG did not run (exit code {returncode})')}", file=sys.stderr)
        for path, error in (result.get("import_errors") or {}).items():
            print(f"import error in {path}:\n{error}", file=sys.stderr)
        return 2
    tasks = result["tasks"]
    print(f"\nDAG {result['dag_id']} run {result['run_id']}: {result['state']}")
    for task_id, state in sorted(tasks.items()):
        print(f"  {'ok  ' if state in _FINE else 'FAIL'} {task_id}: {state}")
    failed = sorted(t for t, s in tasks.items() if s not in _FINE)
    if failed or result["state"] != "success":
        print(f"try: {len(failed)} of {len(tasks)} tasks did not succeed: {', '.join(failed) or '-'}", file=sys.stderr)
        if last_error is not None:
            print(f"try: the last error logged: {last_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
