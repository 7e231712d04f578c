"""Run one ``availableNow`` streaming query through ``foreach_batch_writer`` in its own process.

Used by the streaming kill tests: ``python -m tests.reliability.stream_runner ROOT SOURCE CHECKPOINT STREAM``;
faults come from ``SHARDYFUSION_TEST_FAULTS`` behind its switch (``spark_jobs.faults``). Prints one JSON line of the
writer's outcomes when the query ends.
"""

from __future__ import annotations

import json
import sys

SCHEMA = "id LONG, payload STRING, deleted BOOLEAN"


def main(root: str, source: str, checkpoint: str, stream_id: str) -> None:
    from pyspark.sql import SparkSession

    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.spark_jobs import faults
    from airflow_provider_shardyfusion.streaming import foreach_batch_writer

    spark = (SparkSession.builder.master("local[2]").appName("shardyfusion-stream-runner")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    config = build_write_config(output_uri=root, input_path=source, key_column="id", value_column="payload",
                                num_dbs=4, write_mode="delta", delete_column="deleted")
    writer = foreach_batch_writer(config, stream_id=stream_id, faults=faults.from_environment())
    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source).writeStream
             .foreachBatch(writer).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    print(json.dumps({"outcomes": [o.to_dict() for o in writer.outcomes]}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
