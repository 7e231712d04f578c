"""Write configuration: build, validate, serialize, fingerprint (SPEC §3-§6, §8.1)."""

from __future__ import annotations

import json
import re

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.config import (
    ShardRetry,
    WriteConfig,
    build_write_config,
)
from airflow_provider_shardyfusion.core.storage import StorageOptions

BASE = dict(output_uri="file:///data/out", key_column="id", input_path="/data/in", value_column="payload", num_dbs=4)


def build(**over):
    return build_write_config(**{**BASE, **over})


# ---- happy path -----------------------------------------------------------------------------


def test_build_happy_path_defaults():
    cfg = build(run_id="run-1")
    assert cfg.run_id == "run-1"
    assert cfg.output_uri == "file:///data/out"
    assert cfg.input.path == "/data/in" and cfg.input.format == "parquet" and cfg.input.table is None
    assert cfg.key_column == "id" and cfg.key_encoding is None
    assert cfg.value.format == "binary" and cfg.value.column == "payload"
    assert cfg.sharding.strategy == "hash" and cfg.sharding.num_dbs == 4 and cfg.sharding.cel_mode is None
    assert cfg.options.batch_size == 50_000 and cfg.options.verify_routing is True and cfg.options.sample_size == 20
    assert cfg.options.lease_seconds == 600 and cfg.options.heartbeat_seconds == 60
    assert cfg.storage_options == StorageOptions()


def test_build_generates_run_id():
    first, second = build(), build()
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", first.run_id)
    assert first.run_id != second.run_id


def test_build_normalizes_output_uri():
    assert build(output_uri="s3a://my-bucket/snap/").output_uri == "s3://my-bucket/snap"
    assert build(output_uri="/data/out/").output_uri == "file:///data/out"


def test_cel_modes():
    direct = build(cel_expr="shard_hash(id) % 4u")
    assert direct.sharding.strategy == "cel" and direct.sharding.cel_mode == "direct"
    cat = build(num_dbs=None, cel_expr="region", cel_columns={"region": "string"}, routing_values=["eu", "us"])
    assert cat.sharding.cel_mode == "categorical" and cat.sharding.routing_values == ("eu", "us")
    inferred = build(num_dbs=None, cel_expr="region", cel_columns=["region"], infer_routing_values=True)
    assert inferred.sharding.cel_mode == "categorical" and inferred.sharding.cel_columns == {"region": None}


def full_config(**over):
    args = dict(
        output_uri="s3://my-bucket/snap", key_column="user_id", input_path="s3://in/data", input_format="csv",
        input_options={"header": "true", "sep": ";"}, value_columns=["name", "age"], value_format="json",
        num_dbs=None, cel_expr="region", cel_columns={"region": "string"}, routing_values=["eu", "us", "ap"],
        key_encoding="utf8", run_id="run-7", batch_size=1000, verify_routing=False, sample_size=5,
        cache_input=True, sort_within_partitions=False, max_writes_per_second=100.0,
        max_write_bytes_per_second=1e6, shard_retry={"max_retries": 3, "initial_backoff_s": 0.5},
        sort_run_rows=10, allow_duplicate_keys=True, lease_seconds=30.0, heartbeat_seconds=5.0,
        spark_conf_overrides={"spark.sql.shuffle.partitions": 8},
        storage_options={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                         "addressing_style": "path", "max_attempts": 2},
        airflow_context={"dag_id": "d", "task_id": "t", "run_id": "manual__1", "try_number": 2},
    )
    args.update(over)
    return build_write_config(**args)


@pytest.mark.parametrize("make", [lambda: build(run_id="r1"), full_config], ids=["minimal", "full"])
def test_dict_and_json_round_trip(make):
    cfg = make()
    assert WriteConfig.from_dict(cfg.to_dict()) == cfg
    text = cfg.to_json()
    back = WriteConfig.from_json(text)
    assert back == cfg
    assert back.validate() == cfg
    assert back.to_json() == text  # deterministic
    assert json.loads(text) == cfg.to_dict()


def test_full_config_values_survive_json():
    back = WriteConfig.from_json(full_config().to_json())
    assert back.input.options == {"header": "true", "sep": ";"}
    assert back.value.columns == ("name", "age")
    assert back.options.shard_retry == ShardRetry(max_retries=3, initial_backoff_s=0.5)
    assert back.spark_conf_overrides == {"spark.sql.shuffle.partitions": "8"}
    assert back.storage_options.endpoint_url == "http://127.0.0.1:9000"
    assert back.airflow_context == {"dag_id": "d", "task_id": "t", "run_id": "manual__1", "try_number": 2}


def test_secrets_never_serialized():
    cfg = build(storage_options={"aws_access_key_id": "AKIDSECRETID", "aws_secret_access_key": "TOPSECRETKEY",
                                 "aws_session_token": "SESSIONTOKENX"})
    assert cfg.storage_options.aws_secret_access_key == "TOPSECRETKEY"  # usable in-process
    for text in (cfg.to_json(), repr(cfg), cfg.fingerprint()):
        for secret in ("AKIDSECRETID", "TOPSECRETKEY", "SESSIONTOKENX"):
            assert secret not in text


def test_fingerprint_stable_across_run_ids_and_airflow_context():
    a = full_config(run_id="run-a", airflow_context={"dag_id": "x"})
    b = full_config(run_id="run-b", airflow_context=None)
    assert a.fingerprint() == b.fingerprint()
    assert a.with_run_id("run-c").fingerprint() == a.fingerprint()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a.fingerprint())
    assert WriteConfig.from_json(a.to_json()).fingerprint() == a.fingerprint()


@pytest.mark.parametrize(
    "change",
    [dict(key_column="other"), dict(batch_size=999), dict(routing_values=["eu", "us", "af"]),
     dict(output_uri="s3://my-bucket/snap2"), dict(value_columns=["age", "name"]), dict(key_encoding=None)],
)
def test_fingerprint_changes_with_config(change):
    assert full_config(**change).fingerprint() != full_config().fingerprint()


def test_with_run_id():
    cfg = build(run_id="r1")
    assert cfg.with_run_id("r2").run_id == "r2" and cfg.run_id == "r1"


# ---- one test per rule ----------------------------------------------------------------------


def assert_config_error(names, **over):
    with pytest.raises(ConfigError) as info:
        build(**over)
    message = str(info.value)
    for name in names if isinstance(names, tuple) else (names,):
        assert name in message, f"{name!r} not named in: {message}"
    return message


def test_bad_run_id():
    assert_config_error(("run_id", "'a/b'"), run_id="a/b")


def test_bad_run_id_too_long():
    assert_config_error("run_id", run_id="r" * 129)


def test_bad_output_uri():
    assert_config_error(("output_uri", "'relative/out'"), output_uri="relative/out")


def test_bad_output_uri_dotdot():
    assert_config_error("output_uri", output_uri="s3://bucket/a/../b")


def test_num_dbs_and_max_keys_both():
    assert_config_error(("num_dbs", "max_keys_per_shard"), max_keys_per_shard=1000)


def test_num_dbs_and_max_keys_neither():
    assert_config_error(("num_dbs", "max_keys_per_shard"), num_dbs=None)


def test_max_keys_per_shard_alone_is_fine_and_positive():
    assert build(num_dbs=None, max_keys_per_shard=1000).sharding.max_keys_per_shard == 1000
    assert_config_error("max_keys_per_shard", num_dbs=None, max_keys_per_shard=0)


@pytest.mark.parametrize("bad", [0, -3, True, 2.5])
def test_num_dbs_invalid(bad):
    assert_config_error("num_dbs", num_dbs=bad)


def test_num_dbs_above_five_digit_layout_limit():
    assert build(num_dbs=99_999).sharding.num_dbs == 99_999
    assert_config_error(("num_dbs", "100000", "99999", "five digits"), num_dbs=100_000)


def test_routing_values_more_than_five_digit_layout_limit():
    assert_config_error(("routing_values", "100000", "five digits"), num_dbs=None, cel_expr="id",
                        routing_values=list(range(100_000)))


def test_cel_columns_bare_string_refused():
    assert_config_error(("cel_columns", "'region'", "list"), num_dbs=None, cel_expr="region", cel_columns="region",
                        routing_values=["eu"])
    assert_config_error(("cel_columns", "5"), num_dbs=None, cel_expr="id", cel_columns=5, routing_values=["eu"])


def test_infer_routing_values_must_be_bool():
    assert_config_error(("infer_routing_values", "'yes'"), num_dbs=None, cel_expr="id", infer_routing_values="yes")


def test_cel_compile_error():
    assert_config_error(("cel_expr", "'id +'"), cel_expr="id +")


def test_cel_undeclared_column():
    assert_config_error(("cel_expr", "region"), cel_expr="region", num_dbs=None, routing_values=["a"])


def test_cel_direct_without_num_dbs():
    assert_config_error(("num_dbs", "CEL"), num_dbs=None, cel_expr="shard_hash(id) % 4u")


def test_cel_options_without_cel_expr():
    assert_config_error(("cel_columns", "cel_expr"), cel_columns=["x"])


def test_routing_values_duplicates():
    assert_config_error(("routing_values", "unique", "'eu'"), num_dbs=None, cel_expr="id", routing_values=["eu", "us", "eu"])


def test_routing_values_mixed_types():
    assert_config_error(("routing_values", "all strings or all integers"), num_dbs=None, cel_expr="id",
                        routing_values=["eu", 1])


def test_routing_values_null():
    assert_config_error(("routing_values", "null"), num_dbs=None, cel_expr="id", routing_values=["eu", None])


def test_routing_values_length_vs_num_dbs():
    assert_config_error(("num_dbs", "routing_values"), num_dbs=3, cel_expr="id", routing_values=["eu", "us"])


def test_routing_values_and_infer_both():
    assert_config_error(("routing_values", "infer_routing_values"), num_dbs=None, cel_expr="id",
                        routing_values=["eu"], infer_routing_values=True)


@pytest.mark.parametrize("name", ["max_writes_per_second", "max_write_bytes_per_second"])
@pytest.mark.parametrize("bad", [0, -1, 0.0])
def test_rate_limits_must_be_positive(name, bad):
    assert_config_error(name, **{name: bad})


def test_batch_size_zero():
    assert_config_error("batch_size", batch_size=0)


def test_sample_size_zero():
    assert_config_error("sample_size", sample_size=0)


def test_no_input():
    assert_config_error(("input_path", "input_table", "input_sql", "none"), input_path=None)


def test_two_inputs():
    message = assert_config_error(("input_path", "input_table"), input_table="db.tbl")
    assert "got input_path, input_table" in message


def test_bad_input_format():
    assert_config_error(("input_format", "'xls'"), input_format="xls")


def test_binary_without_value_column():
    assert_config_error(("value_column", "binary"), value_column=None)


def test_binary_with_value_columns():
    assert_config_error("value_columns", value_columns=["a", "b"])


def test_json_without_value_columns():
    assert_config_error(("value_columns", "json"), value_column=None, value_format="json")


def test_json_repeated_value_columns():
    assert_config_error("value_columns", value_column=None, value_format="json", value_columns=["a", "a"])


def test_bad_value_format():
    assert_config_error(("value_format", "'xml'"), value_format="xml")


def test_bad_key_encoding():
    assert_config_error(("key_encoding", "'zigzag'"), key_encoding="zigzag")


@pytest.mark.parametrize("name", ["lease_seconds", "heartbeat_seconds", "max_writes_per_second"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_seconds_and_rates_must_be_finite(name, bad):
    assert_config_error((name, "finite"), **{name: bad})


def test_lease_seconds_capped():
    assert build(lease_seconds=7 * 24 * 3600).options.lease_seconds == 7 * 24 * 3600
    assert_config_error(("lease_seconds", "7 days"), lease_seconds=1e12)


def test_heartbeat_not_shorter_than_lease():
    assert_config_error(("heartbeat_seconds", "lease_seconds"), heartbeat_seconds=600, lease_seconds=600)
    assert_config_error(("heartbeat_seconds", "lease_seconds"), heartbeat_seconds=700, lease_seconds=600)


def test_unknown_storage_option_key():
    assert_config_error(("storage_options", "'bogus'"), storage_options={"bogus": 1})


def test_bad_storage_option_values():
    assert_config_error("storage_options.addressing_style", storage_options={"addressing_style": "sideways"})
    assert_config_error("storage_options.endpoint_url", storage_options={"endpoint_url": "ftp://x"})
    assert_config_error("storage_options.max_attempts", storage_options={"max_attempts": 0})


def test_empty_key_column():
    assert_config_error("key_column", key_column="")


def test_bad_shard_retry():
    assert_config_error(("shard_retry", "'x'"), shard_retry={"x": 1})
    assert_config_error("shard_retry.max_retries", shard_retry=-1)
    assert_config_error("shard_retry", shard_retry=True)
    assert_config_error(("shard_retry", "'max_retries'", "(got True)"), shard_retry={"max_retries": True})
    assert_config_error("shard_retry.initial_backoff_s", shard_retry={"initial_backoff_s": float("inf")})
    assert_config_error(("shard_retry.initial_backoff_s 60", "shard_retry.max_backoff_s 30"),
                        shard_retry={"initial_backoff_s": 60, "max_backoff_s": 30})


def test_shard_retry_backoff():
    retry = ShardRetry(max_retries=5, initial_backoff_s=1.0, max_backoff_s=5.0)
    assert [retry.policy().delay(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert retry.policy().attempts == 6 and not retry.policy().jitter


# ---- deserialization errors -----------------------------------------------------------------


def test_from_json_not_json():
    with pytest.raises(ConfigError, match="not valid JSON"):
        WriteConfig.from_json("{nope")


def test_from_dict_future_version():
    data = build(run_id="r1").to_dict()
    data["format_version"] = 99
    with pytest.raises(ConfigError, match="format_version 99"):
        WriteConfig.from_dict(data)


def test_from_dict_missing_field():
    data = build(run_id="r1").to_dict()
    del data["key_column"]
    with pytest.raises(ConfigError, match="'key_column'"):
        WriteConfig.from_dict(data)


def test_from_dict_unknown_option():
    data = build(run_id="r1").to_dict()
    data["options"]["turbo"] = True
    with pytest.raises(ConfigError, match="'turbo'"):
        WriteConfig.from_dict(data)


@pytest.mark.parametrize("bad", [[1, 2], "config", 5, None])
def test_from_dict_not_an_object(bad):
    with pytest.raises(ConfigError, match="write config must be a JSON object"):
        WriteConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="write config must be a JSON object"):
        WriteConfig.from_json(json.dumps(bad))


@pytest.mark.parametrize("section", ["input", "value", "sharding", "options", "storage_options", "airflow_context"])
@pytest.mark.parametrize("bad", [["a"], "text", 5])
def test_from_dict_section_not_an_object(section, bad):
    data = build(run_id="r1").to_dict()
    data[section] = bad
    with pytest.raises(ConfigError, match=rf"^write config: field '{section}' is missing or not dict") as info:
        WriteConfig.from_dict(data)
    assert str(info.value).endswith(f"(got {bad!r}) at $.{section}")


@pytest.mark.parametrize(
    ("section", "name", "bad", "match"),
    [("value", "columns", 5, "field 'columns' is missing or not list (got 5) at $.value.columns"),
     ("sharding", "routing_values", 7, "field 'routing_values' is missing or not list (got 7) at $.sharding.routing_values"),
     ("input", "options", "x=1", "field 'options' is missing or not dict (got 'x=1') at $.input.options")],
)
def test_from_dict_nested_field_of_wrong_shape(section, name, bad, match):
    data = build(run_id="r1").to_dict()
    data[section][name] = bad
    with pytest.raises(ConfigError, match=re.escape(match)):
        WriteConfig.from_dict(data)


@pytest.mark.parametrize(("section", "allowed"), [("delta", "'write_mode'"), ("storage_options", "'aws_session_token'"),
                                                  ("options", "'publish'")])
def test_unknown_keys_of_a_strict_section_are_refused_all_named_with_their_path(section, allowed):
    data = build(run_id="r1").to_dict()
    data[section] |= {"zeta": 1, "alpha": 2}
    with pytest.raises(ConfigError, match=rf"^write config: unknown keys \['alpha', 'zeta'\] at \$\.{section} ") as info:
        WriteConfig.from_json(json.dumps(data))
    assert allowed in str(info.value)
    data[section] = {}
    data["options"] = {"shard_retry": {"max_retries": 1, "tries": 3}}
    with pytest.raises(ConfigError, match=r"unknown keys \['tries'\] at \$\.options\.shard_retry "):
        WriteConfig.from_dict(data)


def test_unknown_keys_elsewhere_are_ignored_and_absent_ones_take_their_defaults():
    config = build(run_id="r1")
    data = config.to_dict() | {"added_later": 1}
    data["input"]["added_later"] = True
    del data["format_version"], data["delta"], data["options"]["lease_seconds"], data["storage_options"]
    assert WriteConfig.from_dict(data) == config
    assert WriteConfig.from_json(json.dumps(data)).to_json() == config.to_json()


def test_a_field_of_the_wrong_type_is_named_with_its_path():
    data = build(run_id="r1").to_dict()
    data["options"]["batch_size"] = "100"
    with pytest.raises(ConfigError, match=re.escape("write config: field 'batch_size' is missing or not int (got '100') "
                                                    "at $.options.batch_size")):
        WriteConfig.from_json(json.dumps(data))
    data["options"]["batch_size"] = 100
    del data["input"]
    with pytest.raises(ConfigError, match=re.escape("field 'input' is missing or not dict (got None) at $.input")):
        WriteConfig.from_dict(data)


def test_validate_refuses_non_canonical_output_uri():
    data = build(run_id="r1").to_dict()
    data["output_uri"] = "file:///data/out/"
    with pytest.raises(ConfigError, match="output_uri"):
        WriteConfig.from_dict(data).validate()


def test_input_options_that_look_like_credentials_are_refused():
    from airflow_provider_shardyfusion.core.errors import ConfigError
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    with pytest.raises(ConfigError, match=r"input_options keys \['password'\] look like credentials") as info:
        build_write_config(output_uri="file:///tmp/x", key_column="id", input_path="/tmp/in", input_format="csv",
                           input_options={"header": "true", "password": "hunter2"}, value_column="v", num_dbs=2)
    # spark_conf lands in the spark-submit argv: never advise it for secrets.
    message = str(info.value)
    assert "aws_conn_id" in message and "role" in message
    assert "spark_conf" not in message and "spark_env_vars" not in message



@pytest.mark.parametrize(("options", "named"), [
    ({"fs.azure.account.key.acct.dfs.core.windows.net": "k"}, "input_options keys"),
    ({"fs.azure.sas.container.acct.blob.core.windows.net": "k"}, "input_options keys"),
    ({"google.cloud.auth.service.account.json.keyfile": "/k.json"}, "input_options keys"),
    ({"fs.s3a.encryption.key": "k"}, "input_options keys"),
    ({"path": "s3a://AKIAEXAMPLE:topsecret@bucket/in/"}, "input_options['path']"),
])
def test_input_options_with_other_clouds_keys_or_credentials_in_a_uri_are_refused(options, named):
    from airflow_provider_shardyfusion.core.errors import ConfigError
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    with pytest.raises(ConfigError) as refused:
        build_write_config(output_uri="file:///tmp/x", key_column="id", input_path="/tmp/in", input_format="csv",
                           input_options={"header": "true", **options}, value_column="v", num_dbs=2)
    assert str(refused.value).startswith(named) and "topsecret" not in str(refused.value)


def test_input_options_rendered_as_text_are_read():
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    config = build_write_config(output_uri="file:///tmp/x", key_column="id", input_path="/tmp/in", input_format="csv",
                                input_options="{'header': True, 'sep': ';'}", value_column="v", num_dbs=2)
    assert config.input.options == {"header": "True", "sep": ";"}


def test_ordinary_settings_are_not_taken_for_credentials():
    from airflow_provider_shardyfusion.core.secrets import refuse_secret_options

    refuse_secret_options({"spark.sql.shuffle.partitions": "8", "header": "true", "basePath": "s3a://bucket/in/",
                           "spark.authenticate.enableSaslEncryption": "true", "mergeSchema": "false"}, "input_options")


# ---- publish (SPEC §8: staged writes) ---------------------------------------------------------


def test_publish_defaults_to_true_and_survives_json():
    assert build().options.publish is True
    staged = build(publish=False)
    assert staged.options.publish is False
    assert WriteConfig.from_json(staged.to_json()).options.publish is False


def test_publish_must_be_a_bool_or_its_rendering():
    assert build(publish="False").options.publish is False  # what a template renders a boolean to
    with pytest.raises(ConfigError, match=r"^publish 'no' must be True or False; .*render_template_as_native_obj=True"):
        build(publish="no")
    with pytest.raises(ConfigError, match=r"^publish 1 must be True or False$"):
        build(publish=1)


def test_a_config_written_before_publish_existed_still_publishes():
    data = build().to_dict()
    del data["options"]["publish"]
    assert WriteConfig.from_dict(data).options.publish is True


@pytest.mark.parametrize(("name", "value", "read"), [("num_dbs", "4", 4), ("batch_size", "100", 100),
                                                     ("max_writes_per_second", "5.0", 5.0)])
def test_a_number_rendered_as_text_is_read_and_other_text_names_the_template_setting(name, value, read):
    args = {"output_uri": "file:///tmp/x", "input_path": "/in", "key_column": "id", "value_column": "v", "num_dbs": 4}
    config = build_write_config(**(args | {name: value}))
    assert (config.to_dict() | {}) and config == build_write_config(**(args | {name: read, "run_id": config.run_id}))
    with pytest.raises(ConfigError, match=rf"{name} 'four' must be .*render_template_as_native_obj=True"):
        build_write_config(**(args | {name: "four"}))


def test_shard_retry_and_cel_columns_rendered_as_text_are_read_as_their_literal():
    assert build(shard_retry="3").options.shard_retry == build(shard_retry=3).options.shard_retry
    assert build(shard_retry="{'max_retries': 2, 'max_backoff_s': 9}").options.shard_retry.max_backoff_s == 9
    cel = {"num_dbs": None, "cel_expr": "region", "routing_values": ["eu", "us"]}
    assert build(**cel, cel_columns="['region']").sharding == build(**cel, cel_columns=["region"]).sharding
    assert build(**cel, cel_columns="{'region': 'string'}").sharding.cel_columns == {"region": "string"}
    with pytest.raises(ConfigError, match=r"^shard_retry 'three' must be an integer \(max retries\) or a mapping; "
                                          r".*render_template_as_native_obj=True"):
        build(shard_retry="three")
    with pytest.raises(ConfigError, match=r"^cel_columns 'region' must be a list of column names or a mapping"):
        build(**cel, cel_columns="region")


# ---- no credentials in URIs or Spark settings (issue 22) -------------------------------------------

CANARY = "CANARY-s3cr3t-9f2"


@pytest.mark.parametrize(("where", "kwargs"), [
    ("input_path", {"input_path": f"s3a://AKIAX:{CANARY}@lake/x/"}),
    ("output_uri", {"output_uri": f"s3://AKIAX:{CANARY}@bucket/out"}),
    ("input_path", {"input_path": f"s3a://AKIAX:{CANARY}/with+slash@lake/x/"}),  # AWS secrets hold "/"
])
def test_credentials_in_a_uri_are_refused_without_repeating_them(where, kwargs):
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    args = {"output_uri": "file:///tmp/out", "input_path": "/in", "value_column": "v", "num_dbs": 2, **kwargs}
    with pytest.raises(ConfigError, match=rf"{where} .*carries credentials.*aws_conn_id") as err:
        build_write_config(**args)
    assert CANARY not in str(err.value) and "***@" in str(err.value)


@pytest.mark.parametrize("uri", ["s3://bucket/team@example.com/x", "hdfs://nn:8020/users/a@b/x", "s3a://bucket/k:v@w",
                                 "file:///data/a:b@c", "s3://bucket:9000/x@y"])
def test_an_at_sign_in_a_path_is_not_mistaken_for_credentials(uri):
    from airflow_provider_shardyfusion.core.secrets import redact_uri, refuse_userinfo

    refuse_userinfo(uri, "input_path")
    assert redact_uri(uri) == uri


def test_credentials_in_an_endpoint_url_and_a_broken_one_name_the_setting():
    from airflow_provider_shardyfusion.core.storage import StorageOptions

    with pytest.raises(ConfigError, match=r"storage_options.endpoint_url .*carries credentials") as err:
        StorageOptions(endpoint_url=f"http://user:{CANARY}@127.0.0.1:9000").validate()
    assert CANARY not in str(err.value)
    with pytest.raises(ConfigError, match=r"storage_options.endpoint_url 'http://\[::1' is not a valid URL"):
        StorageOptions(endpoint_url="http://[::1").validate()


def test_spark_conf_keys_named_like_credentials_are_refused_without_their_values():
    from airflow_provider_shardyfusion.submission.plan import SparkSettings

    conf = {"spark.hadoop.fs.s3a.secret.key": CANARY, "spark.hadoop.fs.s3a.access.key": "AKIAX",
            "spark.executor.memory": "2g"}
    with pytest.raises(ConfigError, match=r"spark_conf keys \['spark.hadoop.fs.s3a.access.key', "
                                          r"'spark.hadoop.fs.s3a.secret.key'\] look like credentials") as err:
        SparkSettings(conf=conf).validate()
    assert CANARY not in str(err.value)
    SparkSettings(conf={"spark.executor.memory": "2g"}).validate()  # ordinary settings pass


@pytest.mark.parametrize(("uri", "named"), [
    (f"https://lake.s3.amazonaws.com/in/part-0.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F"
     f"20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature={CANARY}", "X-Amz-Credential, X-Amz-Signature"),
    (f"s3a://lake/in/?x-amz-security-token={CANARY}", "x-amz-security-token"),
    (f"https://acct.blob.core.windows.net/c/in.parquet?sv=2022-11-02&sp=r&sig={CANARY}", "sig"),
    (f"https://storage.googleapis.com/lake/in.parquet?X-Goog-Signature={CANARY}#frag", "X-Goog-Signature"),
    (f"https://lake.s3.amazonaws.com/in.parquet?AWSAccessKeyId=AKIAX&Signature={CANARY}&Expires=1",
     "AWSAccessKeyId, Signature"),
])
def test_a_signed_query_string_in_input_path_is_refused_without_repeating_it(uri, named):
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match=r"^input_path '.*' carries credentials in its query string "
                                          rf"\({named}\).*aws_conn_id") as err:
        build_write_config(input_path=uri, **args)
    assert CANARY not in str(err.value) and "=***" in str(err.value)


@pytest.mark.parametrize(("uri", "named"), [
    (f"https://lake.s3.amazonaws.com/in/x.parquet#X-Amz-Signature={CANARY}", "X-Amz-Signature"),
    (f"s3a://lake/in/x.parquet?versionId=3#sig={CANARY}&sv=1", "sig"),
])
def test_a_signature_in_a_uri_fragment_is_refused_without_repeating_it(uri, named):
    # Issue 42 item 5: a fragment was not screened; the signature reached the write config.
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.secrets import redact_uri

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match=rf"^input_path '.*' carries credentials in its .*fragment \({named}\)") as err:
        build_write_config(input_path=uri, **args)
    assert CANARY not in str(err.value) and "=***" in str(err.value)
    assert CANARY not in redact_uri(uri)


@pytest.mark.parametrize("uri", [
    f"https://lake.s3.amazonaws.com/in.parquet?X-Amz-Signature%3D{CANARY}",
    f"https://lake.s3.amazonaws.com/in.parquet?X-Amz-Signature%253D{CANARY}",  # encoded twice
    f"https://lake.s3.amazonaws.com/in.parquet?a=1%26X-Amz-Signature%3D{CANARY}",  # inside another's value
    f"https://lake.s3.amazonaws.com/in.parquet?%58-Amz-Signature={CANARY}",
    f"https://lake.s3.amazonaws.com/in.parquet?X-Amz-Signature:{CANARY}",  # no "=": the name holds the secret
])
def test_a_percent_encoded_signature_is_refused_without_repeating_it(uri):
    # Issue 42 item 6: "X-Amz-Signature%3D<secret>" was refused, and the message repeated the secret.
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.secrets import redact_uri

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match=r"^input_path '.*' carries credentials in its query string") as err:
        build_write_config(input_path=uri, **args)
    assert CANARY not in str(err.value) and "***" in str(err.value)
    assert CANARY not in redact_uri(uri)


@pytest.mark.parametrize("uri", [
    f"https://lake.s3.amazonaws.com/in.parquet?Signature{CANARY}",  # glued to the name, no separator
    f"https://lake.s3.amazonaws.com/in.parquet?X-Amz-Signature{CANARY}=1",
    f"https://lake.s3.amazonaws.com/in.parquet?{CANARY}%3DX-Amz-Signature",  # the wrong way round
    f"https://lake.s3.amazonaws.com/in.parquet?{CANARY}=sig&v=1",
])
def test_a_secret_glued_to_a_parameter_name_is_never_shown(uri):
    # Issue 42 item 6: a credential-looking name of 40 plain characters or fewer was shown as it was
    # (with the secret glued to it), and "<secret>%3DX-Amz-Signature" was accepted.
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.secrets import redact_uri

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match=r"^input_path '.*\?\*\*\*=\*\*\*.*' carries credentials in its query "
                                          r"string \(\*\*\*\)") as err:
        build_write_config(input_path=uri, **args)
    assert CANARY not in str(err.value) and "CANARY" not in redact_uri(uri)


def test_well_known_credential_parameters_are_still_named():
    from airflow_provider_shardyfusion.core.secrets import redact_uri

    uri = f"https://lake.s3.amazonaws.com/in.parquet?X-Amz-Credential=AKIAX&a=1%26sig%3D{CANARY}&Token={CANARY}"
    assert redact_uri(uri) == "https://lake.s3.amazonaws.com/in.parquet?X-Amz-Credential=***&a=***&Token=***"


@pytest.mark.parametrize("sql", [
    f"SELECT id, v FROM parquet.`s3a://AKIAX:{CANARY}@lake/in/`",
    f"select * from read_files('s3a://AKIAX:{CANARY}/with+slash@lake/in/')",
    f"SELECT * FROM csv.`https://lake.s3.amazonaws.com/in.csv?X-Amz-Signature={CANARY}` WHERE a = 1",
])
def test_credentials_in_a_uri_inside_input_sql_are_refused_without_repeating_them(sql):
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match=r"^input_sql: the URI '.*' carries credentials") as err:
        build_write_config(input_sql=sql, **args)
    assert CANARY not in str(err.value)


def test_ordinary_query_strings_and_sql_are_not_taken_for_credentials():
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.secrets import redact_uri

    args = {"output_uri": "file:///tmp/out", "value_column": "v", "num_dbs": 2}
    for uri in ("s3a://lake/in/?versionId=3&partNumber=1", "https://h/x?keyword=a&page=3", "s3a://lake/a@b?c"):
        assert build_write_config(input_path=uri, **args).input.path == uri
        assert redact_uri(uri) == uri
    sql = ("SELECT id, v FROM parquet.`s3a://lake/in/` WHERE mail = 'team@example.com' "
           "AND url = 'https://example.com/x?page=2'")
    assert build_write_config(input_sql=sql, **args).input.sql == sql


def test_credential_provider_settings_name_a_class_and_are_allowed():
    from airflow_provider_shardyfusion.submission.plan import SparkSettings

    providers = {
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider",
        "spark.hadoop.fs.s3a.bucket.lake.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.InstanceProfileCredentialsProvider",
        "spark.hadoop.fs.s3a.assumed.role.credentials.provider":
            "software.amazon.awssdk.auth.credentials.ContainerCredentialsProvider",
        "spark.hadoop.fs.s3a.aws.credentials.provider.mapping": "com.amazonaws.auth.X=software.amazon.Y",
        "spark.hadoop.fs.azure.sas.token.provider.type": "org.example.SasTokenProvider",
        "spark.hadoop.fs.s3a.delegation.token.binding": "org.apache.hadoop.fs.s3a.auth.delegation.SessionTokenBinding",
    }
    assert SparkSettings(conf=providers).validate().conf == providers
    for secret in ("fs.s3a.secret.key", "fs.s3a.access.key", "fs.s3a.session.token",
                   "fs.s3a.bucket.lake.secret.key", "fs.s3a.assumed.role.session.token"):
        with pytest.raises(ConfigError, match=rf"spark_conf keys \['spark.hadoop.{secret}'\] look like credentials"):
            SparkSettings(conf={**providers, f"spark.hadoop.{secret}": CANARY}).validate()


def test_lineage_namespaces_never_carry_user_info():
    from airflow_provider_shardyfusion.openlineage import location_dataset

    assert location_dataset(f"s3a://AKIAX:{CANARY}@lake/x/") == ("s3://lake", "x")
    assert location_dataset(f"hdfs://u:{CANARY}@nn:8020/data") == ("hdfs://nn:8020", "/data")


def test_an_unset_value_format_is_binary_in_a_full_write_and_the_bases_in_a_chain():
    from airflow_provider_shardyfusion.streaming import batch_config

    assert build_write_config(**BASE).value.format == "binary"
    delta = build_write_config(**BASE, write_mode="delta")
    assert delta.value.format is None  # resolved from the base's manifest in the job
    # A stream's config is a delta's; its first batch is a full write, binary like any full write.
    assert batch_config(delta, "stream-b000000000000", "full").value.format == "binary"
    assert batch_config(delta, "stream-b000000000001", "delta").value.format is None
    with pytest.raises(ConfigError, match="value_format is needed for write_mode 'full'"):
        WriteConfig.from_dict({**delta.to_dict(), "delta": {"write_mode": "full"}}).validate()
