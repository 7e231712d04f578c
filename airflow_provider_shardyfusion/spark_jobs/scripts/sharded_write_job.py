"""The application spark-submit runs for a batch write, from the bundle's root; the job is in the zip."""

from airflow_provider_shardyfusion.spark_jobs.sharded_write_job import run_script

if __name__ == "__main__":
    run_script()
