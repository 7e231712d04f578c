"""What the job needs to know about its Spark session, the same way under spark-submit and Spark Connect.

A Connect client has no ``sparkContext``: everything here comes from the session's conf or from
a query, so the rest of the job never touches the JVM-side objects.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "app_id", "default_parallelism", "is_connect", "ui_url",
]

# Rows of the probe that reveals the default parallelism: a range without an explicit partition
# count is split into exactly defaultParallelism slices once it has at least that many rows.
_PROBE_ROWS = 1 << 20


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def app_id(spark: Any) -> str | None:
    return spark.conf.get("spark.app.id", None)


def ui_url(spark: Any) -> str | None:
    """The driver's web UI, when it can be known: a Connect client only sees the server's conf, where
    the port actually bound is not recorded, so there the URL is left out rather than guessed. A
    local driver's UI ends with the job, before anyone can follow a link to it: left out too."""
    if is_connect(spark) or spark.conf.get("spark.ui.enabled", "true") == "false" \
            or str(spark.conf.get("spark.master", "")).startswith("local"):
        return None
    return spark.sparkContext.uiWebUrl


@functools.lru_cache(maxsize=8)
def _parallelism_of(spark: Any) -> int:
    from pyspark.sql import functions as F

    slices = spark.range(0, _PROBE_ROWS).select(F.spark_partition_id().alias("p"))
    top = slices.agg(F.max("p").alias("top")).collect()[0]["top"]
    return int(top) + 1


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism (the cluster's cores, or ``spark.default.parallelism``)."""
    configured = spark.conf.get("spark.default.parallelism", None)
    return max(1, int(configured)) if configured else _parallelism_of(spark)
