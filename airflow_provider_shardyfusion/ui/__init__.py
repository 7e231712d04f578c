"""The snapshot history UI (SPEC §16): page rendering, the FastAPI app and the Airflow plugin."""
