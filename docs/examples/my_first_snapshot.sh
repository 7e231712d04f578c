# Run from the root of your clone once `make demo` (or `make install`) has built .venv.
# airflow, spark-submit, shardyfusion and the venv's python:
export PATH="$PWD/.venv/bin:$PATH"
# a throw-away Airflow: SQLite database, no services to start
export AIRFLOW_HOME="$PWD/.airflow"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export SPARK_LOCAL_IP=127.0.0.1   # Spark binds to loopback instead of the host's name
# The JSON form: the URI form spark://local[2] is not read as a local master (it falls
# back to YARN).
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'

airflow db migrate
mkdir -p "$AIRFLOW_HOME/dags"
cp docs/examples/my_first_snapshot.py "$AIRFLOW_HOME/dags/"
airflow dags test my_first_snapshot

# The published snapshot, read outside Airflow: 42 and 999 are found, 1000 is not.
shardyfusion get "file://$AIRFLOW_HOME/my_first_snapshot/snapshot" 42 999 1000
