"""``ServeConfig`` crossing to the server's worker processes through the project's one codec."""

from __future__ import annotations

import json

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.serve.config import SERVE_CONFIG_ENV, ServeConfig, parse_shard_ids

CONFIG = ServeConfig("file:///srv/snap", {"endpoint_url": "http://127.0.0.1:9000"}, follow_interval_s=0.5,
                     shard_ids=(0, 1, 5), value_decoding="typed", max_staleness_s=60.0, cache_dir="/c", key_type="int")


def test_a_config_reads_back_as_written(monkeypatch):
    text = CONFIG.to_json()
    assert json.loads(text)["shard_ids"] == [0, 1, 5]
    assert ServeConfig.from_json(text) == CONFIG
    monkeypatch.setenv(SERVE_CONFIG_ENV, text)
    assert ServeConfig.from_environment() == CONFIG
    assert ServeConfig.from_json('{"root": "file:///srv/snap"}') == ServeConfig("file:///srv/snap")  # defaults


@pytest.mark.parametrize(("change", "message"), [
    ({"shard_idz": [1]}, "unknown keys ['shard_idz'] at $ (allowed: ['root', 'storage_options',"),
    ({"shard_ids": [1, "2"]}, "shard_ids entry '2' is not int at $.shard_ids[1]"),
    ({"value_decoding": "xml"}, "value_decoding 'xml' is not one of ['typed', 'json', 'raw'] at $.value_decoding"),
    ({"key_type": 3}, "key_type 3 is not one of ['auto', 'int', 'str', 'bytes', 'hex'] at $.key_type"),
    ({"cache_dir": 1}, "field 'cache_dir' is missing or not str (got 1) at $.cache_dir"),
    ({"follow_interval_s": 0}, "--follow-interval-s must be a positive number of seconds, got 0"),
])
def test_a_config_a_worker_cannot_take_is_one_error_naming_the_field(change, message):
    text = json.dumps({**json.loads(CONFIG.to_json()), **change})
    with pytest.raises(ConfigError) as caught:
        ServeConfig.from_json(text)
    assert str(caught.value).startswith(f"serve config ({SERVE_CONFIG_ENV}): ")
    assert message in str(caught.value)


def test_shard_ids_text():
    assert parse_shard_ids("0-3, 7,2") == (0, 1, 2, 3, 7)
    with pytest.raises(ConfigError, match="--shard-ids '1-x': '1-x' is not a shard id"):
        parse_shard_ids("1-x")
