"""Quickstart: generate a table, publish it as a 16-shard snapshot with Spark, read keys
back.

Runs on the embedded default: Spark in local mode and a ``file://`` output root, no
services.

- ``generate`` writes ``params.rows`` rows (``id`` int64, ``payload`` string) as Parquet
  into ``<demo dir>/shardyfusion_quickstart/input/<run id>`` (one folder per run, so
  concurrent runs do not meet; ``params.duplicate_keys`` repeats one key, to see the
  writer refuse it);
- ``write_snapshot`` (``ShardedWriteOperator``) shards them into 16 RocksDB databases
  under ``<demo dir>/shardyfusion_quickstart/snapshot`` and publishes the snapshot
  (XCom: the summary; an asset event);
- ``read_back`` looks a few keys up through ``ShardedReader`` and returns them.

The demo dir is ``$SHARDYFUSION_DEMO_DIR`` or ``<tmp>/shardyfusion-demo``. Spark comes
from the ``spark_default`` connection, e.g. ``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type":
"spark", "host": "local[*]"}'`` (the JSON form: the URI form ``spark://local[2]`` is not
read as a local master, and the spark provider then falls back to YARN). ``make demo``
sets all of this up (``dags_example/run_demo.py``).
"""

from __future__ import annotations

import os
import sys

# Airflow's DAG processor puts the DAGs folder on sys.path; a bare ``python
# quickstart.py`` does too, an import by file path (tests) does not.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

# key_of & co. are re-exported for the tests and the demo.
from _shardyfusion_examples import (  # noqa: E402,F401
    DEFAULT_ROWS,
    DEMO_DIR,
    NUM_DBS,
    build_quickstart_dag,
    generate_input,
    input_dir,
    key_of,
    payload_of,
    sample_keys,
    snapshot_uri,
)

DAG_ID = "shardyfusion_quickstart"

dag = build_quickstart_dag(DAG_ID, snapshot_uri(DAG_ID))


if __name__ == "__main__":
    dag.test()
