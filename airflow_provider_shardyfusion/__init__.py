"""airflow-provider-shardyfusion: sharded RocksDB snapshots built by Spark, published atomically.

Importing this package is deliberately light (no airflow, pyspark, boto3 or rocksdict): it is
loaded at DAG-parse time in managed Airflow and shipped to Spark executors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncShardedReader", "ShardedReader", "__version__", "get_provider_info"]

__version__ = "0.1.0"

_LAZY = {
    "AsyncShardedReader": ("airflow_provider_shardyfusion.core.read.async_reader", "AsyncShardedReader"),
    "ShardedReader": ("airflow_provider_shardyfusion.core.read.reader", "ShardedReader"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_provider_info() -> dict[str, Any]:
    base = "airflow_provider_shardyfusion"
    integration = "Shardyfusion"
    return {
        "package-name": "airflow-provider-shardyfusion",
        "name": "Shardyfusion",
        "description": "Sharded RocksDB key-value snapshots built with Spark and published atomically.",
        "versions": [__version__],
        "integrations": [{"integration-name": integration, "tags": ["service"]}],
        "operators": [{"integration-name": integration, "python-modules": [
            f"{base}.operators.sharded_write", f"{base}.operators.validate", f"{base}.operators.publish",
            f"{base}.operators.cleanup", f"{base}.operators.streaming_snapshot"]}],
        "sensors": [{"integration-name": integration, "python-modules": [
            f"{base}.sensors.run_record", f"{base}.sensors.current"]}],
        "hooks": [{"integration-name": integration, "python-modules": [
            f"{base}.hooks.shardyfusion", f"{base}.hooks.spark_submit", f"{base}.hooks.spark_connect"]}],
        "triggers": [{"integration-name": integration, "python-modules": [
            f"{base}.triggers.run_record", f"{base}.triggers.current"]}],
        "extra-links": [f"{base}.operators.sharded_write.SparkApplicationLink"],
        "plugins": [{"name": "shardyfusion", "plugin-class": f"{base}.ui.plugin.ShardyfusionHistoryPlugin"}],
    }
