"""Environment variables the operator sets for the Spark job it starts as a Spark Connect client.

Shared by both sides (the Airflow operator and ``spark_jobs``), so the names live once. The
Connect URL may carry a token, which is why it travels in the environment and never on argv.
"""

from __future__ import annotations

__all__ = ["BUNDLE", "CA_CERT", "PYTHON_ENV_ARCHIVE", "REMOTE_URL", "SPARK_CONF"]

REMOTE_URL = "SPARK_REMOTE"  # pyspark's own name for the Connect URL
BUNDLE = "SHARDYFUSION_BUNDLE"  # the bundle zip, shipped to the cluster with addArtifacts(pyfile=True)
PYTHON_ENV_ARCHIVE = "SHARDYFUSION_PYTHON_ENV_ARCHIVE"  # addArtifacts(archive=True) for the executors
SPARK_CONF = "SHARDYFUSION_CONNECT_CONF"  # JSON of spark_conf, set on the Connect session at runtime
CA_CERT = "SHARDYFUSION_CONNECT_CA_CERT"  # PEM the Connect client trusts for TLS (the connection's ca_cert)
