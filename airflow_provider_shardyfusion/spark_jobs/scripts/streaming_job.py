"""The application spark-submit runs for a streaming query, from the bundle's root; the job is in the zip."""

from airflow_provider_shardyfusion.spark_jobs.streaming_job import run_script

if __name__ == "__main__":
    run_script()
