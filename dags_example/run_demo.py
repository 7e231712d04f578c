"""``make demo``: run the quickstart DAG end to end on this machine and show what it published.

Sets up a throw-away Airflow under ``.demo/`` (SQLite metadata DB, this folder as the DAGs folder,
connections from environment variables: Spark ``local[*]``), migrates the DB, runs the
``shardyfusion_quickstart`` DAG with ``dag.test()`` in a child process (Airflow reads its
configuration once, at import), then prints the published snapshot and a sample look-up read
straight from the output folder with ``ShardedReader``.

Usage: python dags_example/run_demo.py [--rows N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / ".demo"
DAG_ID = "shardyfusion_quickstart"


def demo_env(home: Path = DEMO, dags_folder: Path = REPO / "dags_example") -> dict[str, str]:
    """The throw-away Airflow's environment: everything under ``home``, DAGs from ``dags_folder``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags_folder),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        # JSON, not a URI: "spark://local[*]" would not parse as a local master (→ YARN).
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[*]"}),
        SHARDYFUSION_DEMO_DIR=str(home / "data"),
        SPARK_LOCAL_IP=env.get("SPARK_LOCAL_IP", "127.0.0.1"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PATH=venv_bin + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
    )
    return env


def run(cmd: list[str], env: dict[str, str], what: str) -> subprocess.CompletedProcess[str]:
    print(f"==> {what}", flush=True)
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        raise SystemExit(f"demo failed: {what} exited with {proc.returncode} (output above)")
    return proc


def show_read_back(output_uri: str, manifest_ref: str, rows: int) -> None:
    """Read one key of the published snapshot here, outside Airflow: the snapshot is plain files
    plus a pointer."""
    sys.path.insert(0, str(REPO))
    from airflow_provider_shardyfusion import ShardedReader

    sys.path.insert(0, str(REPO / "dags_example"))
    from _shardyfusion_examples import key_of

    # Importing the examples imports Airflow, which sends every INFO record of this process to the
    # console: the reader's per-shard download lines would land between the demo's blocks. They
    # belong in a service's log; warnings still show.
    logging.getLogger("airflow_provider_shardyfusion").setLevel(logging.WARNING)
    key = key_of(rows // 3) if rows else 0
    with ShardedReader(output_uri) as reader:
        value = reader.get(key)
        print(f"\nShardedReader({output_uri!r}).get({key}) -> {value!r}")
        print(f"snapshot run {reader.run_id}: {reader.manifest.num_dbs} shards, manifest {manifest_ref}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()

    env = demo_env()
    (DEMO / "airflow").mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "airflow", "db", "migrate"], env, f"airflow db migrate ({env['AIRFLOW_HOME']})")
    runner = REPO / "tests" / "e2e" / "run_dag.py"
    proc = run([sys.executable, str(runner), DAG_ID, json.dumps({"rows": args.rows})], env,
               f"dag.test() of {DAG_ID} ({args.rows} rows, Spark local[*], file:// output)")
    (DEMO / "last_run.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@DAG_TEST_RESULT@@ ")]
    result = json.loads(lines[-1].split(" ", 1)[1]) if lines else {}
    failed = {t: s for t, s in result.get("tasks", {}).items() if s != "success"}
    if result.get("state") != "success" or failed:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        raise SystemExit(f"demo failed: DAG run {result.get('state')!r}, tasks {failed or result.get('tasks')}"
                         f" (full log: {DEMO / 'last_run.log'})")

    summary = result["xcoms"]["write_snapshot"]
    print("\nPublished snapshot (ShardedWriteOperator XCom):")
    print(json.dumps(summary, indent=2))
    print("\nLook-ups done by the DAG's read_back task:")
    print(json.dumps(result["xcoms"].get("read_back"), indent=2))

    show_read_back(summary["output_uri"], summary["manifest_ref"], args.rows)
    print(f"\nAirflow home: {env['AIRFLOW_HOME']}   full log: {DEMO / 'last_run.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
