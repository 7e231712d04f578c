"""The exact bytes of a write config and its fingerprint, pinned across releases.

A run record keeps ``config_fingerprint``; runs of the same write are compared by it across provider
versions, and the Spark job computes it from the config it decoded. So ``to_json`` and
``fingerprint`` must give these strings for these configs, built here and after a trip through
``from_json`` (the job's side). The strings were computed by the hand-written serializer that
preceded the msgspec codec; a change here is a change of every recorded fingerprint.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_shardyfusion.core.model.config import WriteConfig, build_write_config
from airflow_provider_shardyfusion.core.storage import StorageOptions

CASES: dict[str, dict[str, object]] = {
    "defaults": dict(output_uri="file:///data/out", key_column="id", input_path="/data/in", value_column="payload",
                  num_dbs=4, run_id="run-1"),
    "all_options": dict(output_uri="s3://my-bucket/snap", key_column="user_id", input_path="s3://in/data", input_format="csv",
        input_options={"header": "true", "sep": ";"}, value_columns=["name", "age"], value_format="json",
        num_dbs=None, cel_expr="region", cel_columns={"region": "string"}, routing_values=["eu", "us", "ap"],
        key_encoding="utf8", run_id="run-7", batch_size=1000, verify_routing=False, sample_size=5,
        cache_input=True, sort_within_partitions=False, max_writes_per_second=100,
        max_write_bytes_per_second=1e6, shard_retry={"max_retries": 3, "initial_backoff_s": 0.5},
        sort_run_rows=10, allow_duplicate_keys=True, lease_seconds=30, heartbeat_seconds=5.0, publish=False,
        spark_conf_overrides={"spark.sql.shuffle.partitions": 8},
        storage_options={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                         "addressing_style": "path", "max_attempts": 2},
        airflow_context={"dag_id": "d", "task_id": "t", "run_id": "manual__1", "try_number": 2}),
    "delta": dict(output_uri="s3://lake/snap", key_column="id", input_table="db.changes", write_mode="delta",
        delete_column="deleted", base_run_id="20260101T000000Z-0123abcd", max_chain_depth=4, run_id="run-d"),
    "compact": dict(output_uri="s3://lake/snap", key_column="id", write_mode="compact", run_id="run-c"),
    "json_values": dict(output_uri="file:///data/out", key_column="k", input_sql="SELECT k, a, b FROM t",
        value_format="json", value_columns=["a", "b"], max_keys_per_shard=1000, key_encoding="u64be", run_id="run-j",
        shard_retry=1),
    "s3_storage": dict(output_uri="s3://bucket/prefix", key_column="id", input_path="s3://bucket/in", value_column="v",
        cel_expr="shard_hash(id) % 8u", num_dbs=8, run_id="run-s",
        storage_options={"endpoint_url": "https://s3.example.com", "region_name": "us-east-1", "addressing_style": "virtual",
                         "aws_access_key_id": "AKIDSECRETID", "aws_secret_access_key": "TOPSECRETKEY"}),
    "inferred": dict(output_uri="file:///data/out", key_column="id", input_path="/in", value_column="v",
        cel_expr="region", cel_columns=["region"], infer_routing_values=True, run_id="run-i"),
}

PINNED = {
    "defaults": (
        '{"airflow_context":null,"delta":{"base_run_id":null,"delete_column":null,"max_chain_depth":16,"write_mod'
        'e":"full"},"format_version":1,"input":{"format":"parquet","options":{},"path":"/data/in","sql":null,"tab'
        'le":null},"key_column":"id","key_encoding":null,"options":{"allow_duplicate_keys":false,"batch_size":500'
        '00,"cache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max_write_bytes_per_second":null,'
        '"max_writes_per_second":null,"publish":true,"sample_size":20,"shard_retry":null,"sort_run_rows":1000000,'
        '"sort_within_partitions":true,"verify_routing":true},"output_uri":"file:///data/out","run_id":"run-1","s'
        'harding":{"cel_columns":null,"cel_expr":null,"infer_routing_values":false,"max_keys_per_shard":null,"num'
        '_dbs":4,"routing_values":null,"strategy":"hash"},"spark_conf_overrides":{},"storage_options":{"max_attem'
        'pts":5},"value":{"column":"payload","columns":null,"format":"binary"}}',
        'sha256:4dc2559c8ac9fe39a44f26dac1a2a48b79866f4951a8ba18e6377cbb99e97086',
    ),
    "all_options": (
        '{"airflow_context":{"dag_id":"d","run_id":"manual__1","task_id":"t","try_number":2},"delta":{"base_run_i'
        'd":null,"delete_column":null,"max_chain_depth":16,"write_mode":"full"},"format_version":1,"input":{"form'
        'at":"csv","options":{"header":"true","sep":";"},"path":"s3://in/data","sql":null,"table":null},"key_colu'
        'mn":"user_id","key_encoding":"utf8","options":{"allow_duplicate_keys":true,"batch_size":1000,"cache_inpu'
        't":true,"heartbeat_seconds":5.0,"lease_seconds":30,"max_write_bytes_per_second":1000000.0,"max_writes_pe'
        'r_second":100,"publish":false,"sample_size":5,"shard_retry":{"initial_backoff_s":0.5,"max_backoff_s":30.'
        '0,"max_retries":3},"sort_run_rows":10,"sort_within_partitions":false,"verify_routing":false},"output_uri'
        '":"s3://my-bucket/snap","run_id":"run-7","sharding":{"cel_columns":{"region":"string"},"cel_expr":"regio'
        'n","infer_routing_values":false,"max_keys_per_shard":null,"num_dbs":null,"routing_values":["eu","us","ap'
        '"],"strategy":"cel"},"spark_conf_overrides":{"spark.sql.shuffle.partitions":"8"},"storage_options":{"add'
        'ressing_style":"path","endpoint_url":"http://127.0.0.1:9000","max_attempts":2,"region_name":"eu-west-1"}'
        ',"value":{"column":null,"columns":["name","age"],"format":"json"}}',
        'sha256:125abc2254e065705b04a6eb43f92f4a87a5d7b5a3a0c8dce1a3f07fbb88c94f',
    ),
    "delta": (
        '{"airflow_context":null,"delta":{"base_run_id":"20260101T000000Z-0123abcd","delete_column":"deleted","ma'
        'x_chain_depth":4,"write_mode":"delta"},"format_version":1,"input":{"format":"parquet","options":{},"path'
        '":null,"sql":null,"table":"db.changes"},"key_column":"id","key_encoding":null,"options":{"allow_duplicat'
        'e_keys":false,"batch_size":50000,"cache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max'
        '_write_bytes_per_second":null,"max_writes_per_second":null,"publish":true,"sample_size":20,"shard_retry"'
        ':null,"sort_run_rows":1000000,"sort_within_partitions":true,"verify_routing":true},"output_uri":"s3://la'
        'ke/snap","run_id":"run-d","sharding":{"cel_columns":null,"cel_expr":null,"infer_routing_values":false,"m'
        'ax_keys_per_shard":null,"num_dbs":null,"routing_values":null,"strategy":"hash"},"spark_conf_overrides":{'
        '},"storage_options":{"max_attempts":5},"value":{"column":null,"columns":null,"format":null}}',
        'sha256:875b212f7146f9385fafe8132198eff8f8621013c8b24ec943d8a72eb714952d',
    ),
    "compact": (
        '{"airflow_context":null,"delta":{"base_run_id":null,"delete_column":null,"max_chain_depth":16,"write_mod'
        'e":"compact"},"format_version":1,"input":{"format":"parquet","options":{},"path":null,"sql":null,"table"'
        ':null},"key_column":"id","key_encoding":null,"options":{"allow_duplicate_keys":false,"batch_size":50000,'
        '"cache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max_write_bytes_per_second":null,"ma'
        'x_writes_per_second":null,"publish":true,"sample_size":20,"shard_retry":null,"sort_run_rows":1000000,"so'
        'rt_within_partitions":true,"verify_routing":true},"output_uri":"s3://lake/snap","run_id":"run-c","shardi'
        'ng":{"cel_columns":null,"cel_expr":null,"infer_routing_values":false,"max_keys_per_shard":null,"num_dbs"'
        ':null,"routing_values":null,"strategy":"hash"},"spark_conf_overrides":{},"storage_options":{"max_attempt'
        's":5},"value":{"column":null,"columns":null,"format":null}}',
        'sha256:9b49d03362bfff07826568ea69ecbe93d43aa55a19ae70e23e8d89485dc8e1a3',
    ),
    "json_values": (
        '{"airflow_context":null,"delta":{"base_run_id":null,"delete_column":null,"max_chain_depth":16,"write_mod'
        'e":"full"},"format_version":1,"input":{"format":"parquet","options":{},"path":null,"sql":"SELECT k, a, b'
        ' FROM t","table":null},"key_column":"k","key_encoding":"u64be","options":{"allow_duplicate_keys":false,"'
        'batch_size":50000,"cache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max_write_bytes_pe'
        'r_second":null,"max_writes_per_second":null,"publish":true,"sample_size":20,"shard_retry":{"initial_back'
        'off_s":1.0,"max_backoff_s":30.0,"max_retries":1},"sort_run_rows":1000000,"sort_within_partitions":true,"'
        'verify_routing":true},"output_uri":"file:///data/out","run_id":"run-j","sharding":{"cel_columns":null,"c'
        'el_expr":null,"infer_routing_values":false,"max_keys_per_shard":1000,"num_dbs":null,"routing_values":nul'
        'l,"strategy":"hash"},"spark_conf_overrides":{},"storage_options":{"max_attempts":5},"value":{"column":nu'
        'll,"columns":["a","b"],"format":"json"}}',
        'sha256:8ad98be2a1c8612beb0bcaa075937a9f6e6a8a5232f9bb1072d5c6e90d1544d1',
    ),
    "s3_storage": (
        '{"airflow_context":null,"delta":{"base_run_id":null,"delete_column":null,"max_chain_depth":16,"write_mod'
        'e":"full"},"format_version":1,"input":{"format":"parquet","options":{},"path":"s3://bucket/in","sql":nul'
        'l,"table":null},"key_column":"id","key_encoding":null,"options":{"allow_duplicate_keys":false,"batch_siz'
        'e":50000,"cache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max_write_bytes_per_second"'
        ':null,"max_writes_per_second":null,"publish":true,"sample_size":20,"shard_retry":null,"sort_run_rows":10'
        '00000,"sort_within_partitions":true,"verify_routing":true},"output_uri":"s3://bucket/prefix","run_id":"r'
        'un-s","sharding":{"cel_columns":null,"cel_expr":"shard_hash(id) % 8u","infer_routing_values":false,"max_'
        'keys_per_shard":null,"num_dbs":8,"routing_values":null,"strategy":"cel"},"spark_conf_overrides":{},"stor'
        'age_options":{"addressing_style":"virtual","endpoint_url":"https://s3.example.com","max_attempts":5,"reg'
        'ion_name":"us-east-1"},"value":{"column":"v","columns":null,"format":"binary"}}',
        'sha256:3392f3abce9d21ddde1146c5ab99fb5a7d1db42ec337a02159e9ac0c74736a13',
    ),
    "inferred": (
        '{"airflow_context":null,"delta":{"base_run_id":null,"delete_column":null,"max_chain_depth":16,"write_mod'
        'e":"full"},"format_version":1,"input":{"format":"parquet","options":{},"path":"/in","sql":null,"table":n'
        'ull},"key_column":"id","key_encoding":null,"options":{"allow_duplicate_keys":false,"batch_size":50000,"c'
        'ache_input":false,"heartbeat_seconds":60.0,"lease_seconds":600.0,"max_write_bytes_per_second":null,"max_'
        'writes_per_second":null,"publish":true,"sample_size":20,"shard_retry":null,"sort_run_rows":1000000,"sort'
        '_within_partitions":true,"verify_routing":true},"output_uri":"file:///data/out","run_id":"run-i","shardi'
        'ng":{"cel_columns":{"region":null},"cel_expr":"region","infer_routing_values":true,"max_keys_per_shard":'
        'null,"num_dbs":null,"routing_values":null,"strategy":"cel"},"spark_conf_overrides":{},"storage_options":'
        '{"max_attempts":5},"value":{"column":"v","columns":null,"format":"binary"}}',
        'sha256:8ec54ca3682d099c051f7df92e5b6bf3d28a06aba0e303ee012a71104aea6f8b',
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_config_json_and_fingerprint_are_the_pinned_bytes(name):
    text, fingerprint = PINNED[name]
    config = build_write_config(**CASES[name])
    assert config.to_json() == text
    assert config.fingerprint() == fingerprint
    decoded = WriteConfig.from_json(text)  # what the Spark job holds (no secrets: they never travel)
    assert decoded == replace(config, storage_options=StorageOptions(**config.storage_options.to_dict()))
    assert decoded.to_json() == text
    assert decoded.fingerprint() == fingerprint


def test_secrets_change_neither_the_bytes_nor_the_fingerprint():
    args = dict(CASES["s3_storage"])
    args["storage_options"] = {k: v for k, v in args["storage_options"].items() if not k.startswith("aws_")}
    public = build_write_config(**args)
    assert (public.to_json(), public.fingerprint()) == PINNED["s3_storage"]
    assert "SECRET" not in PINNED["s3_storage"][0]


def test_storage_options_write_only_their_public_fields_that_are_set():
    options = StorageOptions.from_dict({"region_name": "eu-west-1", "aws_secret_access_key": "TOPSECRETKEY"})
    assert options.aws_secret_access_key == "TOPSECRETKEY"
    assert options.to_dict() == {"region_name": "eu-west-1", "max_attempts": 5}
    assert StorageOptions().to_dict() == {"max_attempts": 5}
