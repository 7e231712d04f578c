"""Promise: Spark Connect over TLS with a token writes, keeps the token out of everything it leaves
behind, and a wrong token or an untrusted certificate fails the task in seconds, naming the connection.

Real parts: a Spark Connect server on loopback that requires a token (``spark.connect.authenticate.token``,
given in its environment), behind a TLS-terminating proxy with a self-signed certificate made by the
test (Spark 4.2's Connect server has no TLS of its own: deployments terminate TLS in front of it),
the operator running the job as a Connect client child process, real snapshot folders. The
connection carries the token as its password and the CA as ``ca_cert`` in its extra.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, ShardyfusionError
from airflow_provider_shardyfusion.core.storage import open_store
from tests.operator_helpers import connections, make_context, make_op
from tests.spark_connect_server import connect_server
from tests.spark_helpers import assert_exact, int_table, read_snapshot, write_parquet
from tests.tls_proxy import self_signed, tls_proxy

pytestmark = pytest.mark.spark
TOKEN = "tok-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """(port of the TLS proxy, the certificate it serves, a certificate nobody serves)."""
    work = tmp_path_factory.mktemp("tls")
    served, stranger = self_signed(work / "certs", "served"), self_signed(work / "certs", "stranger")
    with connect_server(work, env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": TOKEN}) as port, tls_proxy(port, served) as tls_port:
        yield tls_port, served, stranger


def tls_conn(port: int, *, token: str | None = TOKEN, ca_cert: str | None = None) -> dict:
    conn: dict = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port, "extra": {"use_ssl": True}}
    if token:
        conn["password"] = token
    if ca_cert:
        conn["extra"]["ca_cert"] = ca_cert
    return conn


def test_a_write_over_tls_with_a_token_publishes_and_leaves_the_token_nowhere(monkeypatch, tmp_path, tls_server,
                                                                              capfd, figure):
    port, served, _ = tls_server
    connections(monkeypatch, spark=tls_conn(port, ca_cert=str(served.cert_path)))
    table, expected = int_table(1_000)
    root = f"file://{tmp_path}/snap"
    op = make_op(root, aws_conn_id=None, input_path="file://" + write_parquet(tmp_path, table), num_dbs=3)
    context = make_context()
    summary = op.execute(context)
    assert summary["published"] is True and summary["rows"] == 1_000
    manifest, shards = read_snapshot(root)
    assert_exact(manifest, shards, expected, "u64be")

    # Where the token could leak: the job's argv, the task log (the job's output included), the
    # process output, XCom, the asset event, and every object the run wrote (manifest, record, pointer).
    plan = op._launcher.plan
    places = {
        "job argv": " ".join(plan.argv),
        # Airflow's task logger writes to the process's stdout (structlog), with the job's output lines.
        "task log": "".join(capfd.readouterr()),
        "xcom": json.dumps(context["ti"].xcoms, default=str),
        "asset events": json.dumps({str(k): v.extra for k, v in context["outlet_events"].items()}, default=str),
    }
    store = open_store(root)
    objects = [o.key for o in store.list("")]
    for key in objects:
        places[key] = store.get(key).data.decode("latin-1")
    assert any("manifest" in k for k in objects) and any(k.startswith("runs/") for k in objects)
    assert "_CURRENT" in places and "Spark Connect session opened" in places["task log"]  # the job's output is in it
    leaks = [where for where, text in places.items() if TOKEN in text]
    assert leaks == []
    figure(rows_checked=len(expected), places_searched=len(places), token_found=len(leaks))


def test_a_wrong_token_or_an_untrusted_certificate_fails_in_seconds_naming_the_connection(monkeypatch, tmp_path,
                                                                                         tls_server, figure):
    port, served, stranger = tls_server
    wrong = "tok-wrong-" + secrets.token_urlsafe(8)
    cases = {
        "wrong token": (tls_conn(port, token=wrong, ca_cert=served.cert_pem), "refused the connection's token"),
        "no token": (tls_conn(port, token=None, ca_cert=served.cert_pem), "refused the connection's token"),
        "another CA": (tls_conn(port, ca_cert=str(stranger.cert_path)), "TLS certificate this worker does not trust"),
        "system CAs only": (tls_conn(port), "TLS certificate this worker does not trust"),
    }
    table, _ = int_table(20)
    input_path = "file://" + write_parquet(tmp_path, table)
    slowest = 0.0
    for name, (conn, expected) in cases.items():
        connections(monkeypatch, spark=conn)
        root = f"file://{tmp_path}/{name.replace(' ', '-')}"
        started = time.monotonic()
        with pytest.raises(ShardyfusionError) as caught:
            make_op(root, aws_conn_id=None, input_path=input_path, num_dbs=2).execute(make_context())
        seconds = time.monotonic() - started
        text = str(caught.value)
        assert isinstance(caught.value, ConfigError), (name, repr(caught.value))
        assert expected in text and "'sf_spark'" in text and f"127.0.0.1:{port}" in text, (name, text)
        assert TOKEN not in text and wrong not in text, name
        assert list(open_store(root).list("")) == [], name  # refused before any run record
        assert seconds < 15, (name, seconds)
        slowest = max(slowest, seconds)
    figure(settings_refused=len(cases), slowest_refusal_s=f"{slowest:.1f}", objects_written=0)
