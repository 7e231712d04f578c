"""Real Airflow for the e2e tests (fixtures in ``tests.airflow_env``, shared with other suites)."""

from tests.airflow_env import airflow_env, run_dag  # noqa: F401 - fixtures
