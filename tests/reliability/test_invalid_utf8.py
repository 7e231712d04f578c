"""Invalid UTF-8 in a string key column or a JSON value column: one InputDataError naming the
column, the value (truncated, hex) and the rule, on every path that reads such text, never a bare
UnicodeDecodeError from a worker.

Spark keeps a string's bytes as they are (casting binary data to string does not check them), and
so does Arrow; a Parquet string column written without validation carries them into the job the
same way, which is how the end-to-end test below feeds them in.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core.errors import InputDataError, KeyEncodingError
from airflow_provider_shardyfusion.core.model import encoding
from airflow_provider_shardyfusion.core.write import arrow_codec

BAD = b"caf\xe9-\xff\xfe"  # Latin-1 "é" and two bytes that start no UTF-8 sequence


def text_array(values: list[bytes | None], large: bool = False) -> pa.Array:
    """A string array holding exactly these bytes (Arrow's ``view`` does not validate them)."""
    binary, string = (pa.large_binary(), pa.large_string()) if large else (pa.binary(), pa.string())
    return pa.array(values, binary).view(string)


def assert_clear(exc: InputDataError, column: str, rule_words: str) -> None:
    message = str(exc)
    assert not isinstance(exc, UnicodeDecodeError)
    assert f"column {column!r}" in message, message
    assert BAD.hex() in message, message  # the offending value, in hex
    assert "not valid UTF-8" in message and rule_words in message, message
    assert "\n" not in message  # the Spark driver reads the error back from one line


@pytest.mark.parametrize("large", [False, True])
def test_check_utf8_names_column_value_and_rule(large, figure):
    good = text_array([b"plain", "zürich".encode(), None], large)
    arrow_codec.check_utf8(good, column="name", rule=arrow_codec.UTF8_RULE_KEY)  # valid text passes
    bad = text_array([b"plain", None, BAD, b"\xff"], large)
    with pytest.raises(InputDataError) as info:
        arrow_codec.check_utf8(bad, column="name", rule=arrow_codec.UTF8_RULE_KEY)
    assert_clear(info.value, "name", "key_encoding 'raw'")
    assert "invalid continuation byte at byte 3" in str(info.value)  # 0xe9 then '-'
    chunked = pa.chunked_array([good, bad])
    with pytest.raises(InputDataError, match="column 'name'"):
        arrow_codec.check_utf8(chunked, column="name", rule=arrow_codec.UTF8_RULE_KEY)
    figure(values_checked=len(good) + len(bad) + len(chunked), errors_named=2)


def test_long_values_are_truncated_in_the_message():
    long_bad = b"\xff" + b"x" * 5000
    with pytest.raises(InputDataError) as info:
        arrow_codec.check_utf8(text_array([long_bad]), column="k", rule="r")
    message = str(info.value)
    assert len(message) < 500 and "(5001 bytes)" in message and long_bad[:32].hex() in message


def test_json_values_name_the_column_also_inside_nested_types(figure):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1, 2, 3]), text_array([b"ok", BAD, b"fine"]), pa.array([b"\xff", b"", None], pa.binary())],
        names=["id", "city", "blob"],
    )
    with pytest.raises(InputDataError) as info:
        arrow_codec.encode_values(batch, "json", ("city", "id"))
    assert_clear(info.value, "city", "value_format 'json'")
    # Binary columns are not text: base64 in JSON, as they are in the 'binary' format.
    values = arrow_codec.encode_values(batch, "json", ("blob", "id")).to_pylist()
    assert values == [b'{"blob":"/w==","id":1}', b'{"blob":"","id":2}', b'{"blob":null,"id":3}']
    # value_format 'binary' stores a string column's bytes exactly, valid UTF-8 or not.
    assert arrow_codec.encode_values(batch, "binary", ("city",)).to_pylist() == [b"ok", BAD, b"fine"]

    nested = pa.StructArray.from_arrays([text_array([b"a", BAD])], names=["street"])
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), nested], names=["id", "address"])
    with pytest.raises(InputDataError) as info:
        arrow_codec.encode_values(batch, "json", ("address",))
    assert_clear(info.value, "address", "value_format 'json'")
    figure(values_checked=10, errors_named=2)


def test_stored_utf8_keys_that_are_not_text_are_a_key_encoding_error():
    with pytest.raises(KeyEncodingError, match=f"hex {BAD.hex()}.*not valid UTF-8"):
        encoding.decode_key(BAD, "utf8")
    assert encoding.decode_key("zürich".encode(), "utf8") == "zürich"


def test_routing_a_batch_names_the_key_column():
    from airflow_provider_shardyfusion.core.model.manifest import ShardingInfo
    from airflow_provider_shardyfusion.spark_jobs.routing_task import RoutingPlan, shard_ids_for_batch

    batch = pa.RecordBatch.from_arrays([text_array([b"alice", BAD, b"bob"])], names=["user"])
    with pytest.raises(InputDataError) as info:
        shard_ids_for_batch(RoutingPlan(ShardingInfo(strategy="hash", key_column="user"), 4, "string"), batch)
    assert_clear(info.value, "user", "key_encoding 'raw'")

    plan = RoutingPlan(ShardingInfo(strategy="cel", key_column="user", cel_expr="size(region) > 2 ? 1 : 0",
                                     cel_columns={"region": "string"}, cel_mode="direct"), 2, "string")
    batch = pa.RecordBatch.from_arrays([text_array([b"alice", b"bob"]), text_array([b"eu", BAD])],
                                       names=["user", "region"])
    with pytest.raises(InputDataError) as info:
        shard_ids_for_batch(plan, batch, plan.cel_router())
    assert_clear(info.value, "region", "CEL routing")


def test_the_single_shard_writer_names_the_key_column(tmp_path):
    """num_dbs == 1 skips the routing pass; the shard writer checks the keys itself."""
    from airflow_provider_shardyfusion.spark_jobs.shard_task import WritePlan, write_one_shard

    plan = WritePlan(
        output_uri=f"file://{tmp_path}/snap", storage_options={}, run_id="utf8-run", key_column="user",
        key_encoding="utf8", value_format="binary", value_columns=("v",), batch_size=100, sort_run_rows=100,
        allow_duplicate_keys=False, max_writes_per_second=None, max_write_bytes_per_second=None,
        sample_per_shard=5, sample_columns=("user",), presorted=True,
    )
    batch = pa.RecordBatch.from_arrays([text_array([b"alice", BAD]), pa.array([b"1", b"2"])], names=["user", "v"])
    with pytest.raises(InputDataError) as info:
        write_one_shard(plan, iter([batch]), db_id=0, attempt=0, task_attempt_id=None)
    assert_clear(info.value, "user", "key_encoding 'raw'")
    assert "[shard 0, attempt 0]" in str(info.value)


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]").appName("shardyfusion-utf8")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.spark
@pytest.mark.parametrize("case", ["key", "key_single_db", "json_value"])
def test_the_spark_job_fails_with_one_clear_error(spark, tmp_path, case, figure):
    from airflow_provider_shardyfusion.core.model.config import build_write_config
    from airflow_provider_shardyfusion.core.model.run_record import read_run_record
    from airflow_provider_shardyfusion.core.storage import open_store
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    n = 200
    names = [f"user-{i:04d}".encode() for i in range(n)]
    cities = [b"Zurich"] * n
    if case == "json_value":
        cities[150] = BAD
    else:
        names[150] = BAD
    table = pa.table({"name": text_array(names), "city": text_array(cities), "age": pa.array(range(n))})
    path = str(tmp_path / "input.parquet")
    pq.write_table(table, path)
    root = f"file://{tmp_path}/snap"
    kwargs = dict(value_format="json", value_columns=["age", "city"], num_dbs=1 if case == "key_single_db" else 3)
    config = build_write_config(output_uri=root, key_column="name", input_path=path, run_id=f"utf8-{case}".replace("_", "-"),
                                **kwargs)
    with pytest.raises(InputDataError) as info:
        run_write(spark, config)
    store = open_store(root)
    record = read_run_record(store, config.run_id)
    assert record is not None and record.status == "failed" and record.error.type == "InputDataError"
    if case == "json_value":
        # The engine encodes JSON values (SPEC §18): the error names the column, the key and the rule.
        message = str(info.value)
        assert "column 'city'" in message and "key 'user-0150'" in message and "must be UTF-8" in message, message
        assert "\n" not in message and message in record.error.message
    else:
        assert_clear(info.value, "name", "key_encoding 'raw'")
        assert BAD.hex() in record.error.message
    assert not store.exists("_CURRENT")
    figure(rows_in=n, bad_rows=1, errors_named=1)
