"""Pure-Python heart of the provider: never imports Airflow or PySpark (shipped to executors)."""
