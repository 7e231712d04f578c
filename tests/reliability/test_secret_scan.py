"""One canary secret, put everywhere a user might put it, found nowhere it must not be (issue 22 #6).

The canary goes into the AWS connection (where credentials belong), and where they do not: into
``input_path``, a ``spark_conf`` value, an ``input_options`` value and ``python_env_archive`` as URI
user info, into ``input_path`` as the signature of a presigned URL (also in its fragment, and with its
``=`` percent-encoded), into a URI inside ``input_sql``,
into ``spark_conf`` as an S3A secret key and into ``input_options`` as an Azure account key. The
connection's run chooses its S3A credentials provider in ``spark_conf`` (a class name, allowed) and
writes a real snapshot to the S3 server on loopback; spark-submit is stubbed (building the real
command line through the spark provider's hook), because the process-level scan of a real
spark-submit (``ps`` while it runs) is in ``tests/e2e/test_quickstart_dag.py``. Scanned: the
command line, the job config, logs, XCom, every object under the root (records, manifests,
pointer, shards), lineage and the errors of the refused arguments.
"""

from __future__ import annotations

import json
import logging

import pytest
from openlineage.client.serde import Serde

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.storage import open_store
from tests.operator_helpers import connections, make_context, make_op, stub_submit
from tests.snapshot_factory import build_snapshot

pytestmark = pytest.mark.s3
CANARY = "CanaryS3cret/9d27b1e5"
ROWS = [(k, f"value-{k}") for k in range(0, 200, 3)]


def scan(where: str, text: str) -> list[str]:
    return [where] if CANARY in text else []


def test_a_canary_in_the_connection_input_path_and_spark_conf_is_found_nowhere(
        monkeypatch, tmp_path, s3_server, s3_root, s3_options, caplog, capfd, figure):
    caplog.set_level(logging.DEBUG)
    logs: list[str] = []

    def task_logs() -> str:
        # The Airflow task logger writes to stdout, not through caplog's handler: read both.
        out, err = capfd.readouterr()
        logs.append(caplog.text + out + err)
        return logs[-1]

    connections(monkeypatch, aws={"conn_type": "aws", "login": "AKIACANARY", "password": CANARY,
                                  "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}})
    seen = stub_submit(monkeypatch, lambda config: build_snapshot(
        config.output_uri, ROWS, num_dbs=4, run_id=config.run_id, storage_options=s3_options))
    context = make_context()
    provider = {"spark.hadoop.fs.s3a.aws.credentials.provider":
                "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"}
    op = make_op(s3_root, aws_conn_id="sf_aws", input_path="s3://inputs/in/", run_id="run-canary", spark_conf=provider)
    summary = op.execute(context)
    assert summary["rows"] == len(ROWS)
    call = seen.last
    assert call["env"]["AWS_SECRET_ACCESS_KEY"] == CANARY  # control: the secret did reach spark-submit
    assert provider.items() <= call["conf"].items()  # a provider names a class, not a secret: it is passed on

    found = scan("spark-submit argv", " ".join(call["cmd"])) + scan("job config", call["config"].to_json())
    found += scan("spark conf", json.dumps(call["conf"])) + scan("XCom", json.dumps(context["ti"].xcoms, default=str))
    found += scan("logs", task_logs())
    assert "run-canary" in logs[-1], "control: the write's log lines were captured"
    store = open_store(s3_root, s3_options)
    keys = [o.key for o in store.list("")]
    assert {"_CURRENT", "runs/run_id=run-canary/run.json"} <= set(keys) and any(k.endswith(".sst") for k in keys)
    for key in keys:
        found += scan(f"object {key}", store.get(key).data.decode("latin-1"))
    lineage = op.get_openlineage_facets_on_complete(None)
    assert lineage.outputs, "the write reported lineage"
    found += scan("lineage", json.dumps([json.loads(Serde.to_json(d)) for d in [*lineage.inputs, *lineage.outputs]]))

    # Where credentials do not belong, the operator refuses them before anything runs, without echoing them.
    calls = len(seen.calls)
    refused = [
        ("input_path", dict(input_path=f"s3a://AKIACANARY:{CANARY}@bucket/in/")),
        ("input_path", dict(input_path=f"https://bucket.s3.amazonaws.com/in/part-0.parquet?X-Amz-Signature={CANARY}")),
        ("input_path", dict(input_path=f"https://bucket.s3.amazonaws.com/in/part-0.parquet#X-Amz-Signature={CANARY}")),
        ("input_path", dict(input_path=f"https://bucket.s3.amazonaws.com/in/part-0.parquet?X-Amz-Signature%3D{CANARY}")),
        ("input_sql", dict(input_path=None, input_sql=f"SELECT * FROM parquet.`s3a://AKIACANARY:{CANARY}@bucket/in/`")),
        ("spark_conf", dict(spark_conf={**provider, "spark.hadoop.fs.s3a.secret.key": CANARY})),
        ("spark_conf['spark.eventLog.dir']", dict(spark_conf={"spark.eventLog.dir": f"s3a://AKIACANARY:{CANARY}@b/l"})),
        ("input_options['path']", dict(input_options={"path": f"s3a://AKIACANARY:{CANARY}@bucket/in/"})),
        ("input_options keys", dict(input_options={"fs.azure.account.key.acct.dfs.core.windows.net": CANARY})),
        ("python_env_archive", dict(python_env_archive=f"s3://AKIACANARY:{CANARY}@bucket/env.zip#env")),
    ]
    for argument, override in refused:
        bad = make_op(s3_root, aws_conn_id="sf_aws", run_id=f"run-refused-{len(found)}", **override)
        with pytest.raises(ConfigError) as caught:
            bad.execute(make_context())
        assert argument in str(caught.value), caught.value
        found += scan(f"error for {argument}", str(caught.value))
    found += scan("logs", task_logs())
    assert len(seen.calls) == calls, "a refused argument reached spark-submit"
    assert [k.key for k in store.list("runs/") if "refused" in k.key] == []
    assert not found, f"the canary leaked into: {found}"
    figure(objects_scanned=len(keys), arguments_refused=len(refused), leaks=len(found))
