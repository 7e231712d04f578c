"""Airflow side of the provider: thin shells around core."""
