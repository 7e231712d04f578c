"""Run one example DAG with ``dag.test()`` and print its outcome as one JSON line.

Started by ``tests/airflow_env.py`` in a child process, because Airflow reads its configuration
(AIRFLOW_HOME, database, DAGs folder) once at import: the test process must not import it first.

Usage: python run_dag.py <dag_id> [<run_conf JSON>]
"""

from __future__ import annotations

import json
import sys

RESULT_MARKER = "@@DAG_TEST_RESULT@@ "


def main() -> int:
    dag_id = sys.argv[1]
    run_conf = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None

    from airflow.configuration import conf
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dagbag = DagBag(dag_folder=conf.get("core", "dags_folder"))
    if dag_id not in dagbag.dags:
        print(RESULT_MARKER + json.dumps({"error": f"DAG {dag_id!r} not found", "import_errors": {
            str(k): v for k, v in dagbag.import_errors.items()}}))
        return 2
    dr = dagbag.dags[dag_id].test(run_conf=run_conf)

    with create_session() as session:
        tis = dr.get_task_instances(session=session)
        states = {ti.task_id: str(ti.state.value if hasattr(ti.state, "value") else ti.state) for ti in tis}
        rows = session.scalars(XComModel.get_many(run_id=dr.run_id, dag_ids=dag_id, key="return_value")).all()
        xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows}
        dag_state = str(dr.state.value if hasattr(dr.state, "value") else dr.state)
    print(RESULT_MARKER + json.dumps({"dag_id": dag_id, "run_id": dr.run_id, "state": dag_state,
                                      "tasks": states, "xcoms": xcoms}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
