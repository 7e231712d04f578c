"""Spark Connect connection settings the client would misread are refused up front (pure checks)."""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.submission.connect import check_connect_settings


def check(host="spark.example", port=15002, token=False, **extra):
    check_connect_settings("sf_spark", host=host, port=port, has_token=token, extra=extra)


@pytest.mark.parametrize("kwargs", [
    {}, {"host": "sc://spark.example"}, {"host": "spark.example:15002", "port": None}, {"use_ssl": True},
    {"use_ssl": "False"}, {"token": True, "use_ssl": "true"}, {"token": True},
    {"host": "localhost", "token": True, "use_ssl": False},  # pyspark: local credentials, no TLS needed
    {"use_ssl": True, "ca_cert": "/etc/ssl/connect-ca.pem"}, {"use_ssl": "true", "ca_cert": "-----BEGIN CERT"},
])
def test_settings_the_client_reads_as_meant_pass(kwargs):
    check(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"use_ssl": "maybe"}, "\"use_ssl\": 'maybe' in its extra: it must be true or false"),
    ({"use_ssl": 1}, "\"use_ssl\": 1 in its extra"),
    ({"host": "https://spark.example"}, "a bare host name or sc://host, not https://; for TLS set \"use_ssl\": true"),
    ({"host": "grpc://spark.example"}, "not grpc://"),
    ({"host": "spark.example:15002"}, "gives a port twice: 15002 in the host 'spark.example:15002' and 15002"),
    ({"host": "spark.example/path"}, "takes no path"),
    ({"host": "spark.example:abc", "port": None}, "whose port is not a number"),
    ({"host": " "}, "has no host"),
    ({"port": 70000}, "the port 70000: a number from 1 to 65535"),
    ({"token": True, "use_ssl": "false"}, "has a token and \"use_ssl\": false"),
    ({"ca_cert": "/etc/ssl/connect-ca.pem"}, "has a \"ca_cert\" but not \"use_ssl\": true"),
    ({"token": True, "ca_cert": "/etc/ssl/connect-ca.pem"}, "has a \"ca_cert\" but not \"use_ssl\": true"),
    ({"use_ssl": True, "ca_cert": ["pem"]}, "\"ca_cert\": ['pem'] in its extra: it must be PEM text or the path"),
])
def test_settings_the_client_would_misread_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match="the Spark Connect connection 'sf_spark'") as info:
        check(**kwargs)
    assert message in str(info.value)
