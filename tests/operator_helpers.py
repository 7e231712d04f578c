"""Helpers shared by the operator tests: a fake task context, connections, and a stubbed spark-submit.

The stub stands in for a cluster this machine cannot run (YARN, Kubernetes); it still builds the
real spark-submit command line through the spark provider's hook, so tests see what would run.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import defaultdict
from types import SimpleNamespace

from airflow_provider_shardyfusion.core.model.config import WriteConfig
from airflow_provider_shardyfusion.operators import spark_job
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator

LOCAL_SPARK = {"conn_type": "spark", "host": "local[2]"}


class FakeTI:
    dag_id, task_id, run_id, try_number, map_index = "dag_x", "write", "manual__1", 2, -1

    def __init__(self):
        self.xcoms: dict[str, object] = {}

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def make_context():
    return {"ti": FakeTI(), "outlet_events": defaultdict(lambda: SimpleNamespace(extra=None))}


def make_op(root: str, **kw) -> ShardedWriteOperator:
    args = dict(task_id="write", output_uri=root, input_path="s3://inputs/data/in", key_column="id", value_column="payload",
                num_dbs=4, spark_conn_id="sf_spark")
    args.update(kw)
    return ShardedWriteOperator(**args)


def execute_in_thread(op: ShardedWriteOperator) -> tuple[threading.Thread, dict]:
    """Start ``op.execute`` in a thread (for tests that stop or break the write meanwhile); the dict
    gets ``result`` or ``error`` when it ends."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = op.execute(make_context())
        except BaseException as exc:
            outcome["error"] = exc

    task = threading.Thread(target=run, daemon=True)
    task.start()
    return task, outcome


def connections(monkeypatch, spark=LOCAL_SPARK, aws: dict | None = None):
    monkeypatch.setenv("AIRFLOW_CONN_SF_SPARK", json.dumps(spark))
    if aws is not None:
        monkeypatch.setenv("AIRFLOW_CONN_SF_AWS", json.dumps(aws))


class Submitted:
    """What the stubbed spark-submit saw, for assertions."""

    def __init__(self):
        self.calls: list[dict] = []

    @property
    def last(self) -> dict:
        return self.calls[-1]


def stub_submit(monkeypatch, behaviour):
    """Replace spark-submit: build the real command line (as the spark provider would), then ``behaviour``."""
    seen = Submitted()
    real_factory = spark_job._submit_hook_class

    def factory():
        real = real_factory()

        class StubbedHook(real):
            def submit(self, application="", **kwargs):
                cmd = self._build_spark_submit_command(application)
                b64 = cmd[cmd.index("--config-b64") + 1]
                config = WriteConfig.from_json(base64.urlsafe_b64decode(b64).decode())
                seen.calls.append({"cmd": cmd, "env": dict(self._env or {}), "config": config,
                                   "application": application, "conf": dict(self._conf)})
                for line in behaviour(config) or ():
                    self.output_tail.append(self.redacted(line))

        return StubbedHook

    monkeypatch.setattr(spark_job, "_submit_hook_class", factory)
    return seen
