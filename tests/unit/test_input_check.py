"""The pre-flight input check (core.write.input_check): known mistakes refused before Spark starts.

Real parquet, ORC and CSV files in tmp_path; the operator tests run the real operator with
spark-submit stubbed (no cluster here) and show nothing was submitted or written.
"""

from __future__ import annotations

import gzip
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import orc

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.write.input_check import check_write_input, input_columns, require_scheme
from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator
from tests.operator_helpers import connections, make_context, make_op, stub_submit

TABLE = pa.table({"id": [1, 2], "payload": ["a", "b"], "region": ["eu", "us"]})


def _config(path: str, fmt: str = "parquet", **kw):
    args = dict(output_uri="file:///data/out", input_path=path, input_format=fmt, key_column="id",
                value_column="payload", num_dbs=2)
    args.update(kw)
    return build_write_config(**args)


def _check(path: str, fmt: str = "parquet", **kw) -> None:
    check_write_input(_config(path, fmt, **kw), output_uri="file:///data/out")


@pytest.fixture
def parquet_dir(tmp_path):
    folder = tmp_path / "pq"
    (folder / "day=1").mkdir(parents=True)
    pq.write_table(TABLE, folder / "day=1" / "part-0.parquet")
    (folder / "_SUCCESS").write_text("")
    return folder


def test_parquet_folder_columns_with_partitions_and_a_typo(parquet_dir):
    assert input_columns(str(parquet_dir), "parquet") == ["id", "payload", "region", "day"]
    _check(f"file://{parquet_dir}")
    _check(f"file://{parquet_dir}", key_column="ID")  # Spark resolves names case-insensitively by default
    _check(f"file://{parquet_dir}", cel_expr="region == 'eu' ? 0 : 1", cel_columns=["region", "day"])
    with pytest.raises(ConfigError, match=r"value_column 'paylod' is not a column of input_path .*"
                                          r"\(parquet: id, payload, region, day\)"):
        _check(f"file://{parquet_dir}", value_column="paylod")
    with pytest.raises(ConfigError, match="cel_columns 'regoin'"):
        _check(f"file://{parquet_dir}", cel_expr="regoin == 'eu' ? 0 : 1", cel_columns=["regoin"])


def test_orc_file_and_glob(tmp_path):
    orc.write_table(TABLE, str(tmp_path / "t.orc"))
    _check(f"file://{tmp_path}/t.orc", "orc", value_column=None, value_columns=["payload", "region"],
           value_format="json")
    with pytest.raises(ConfigError, match=r"value_columns 'regin' is not a column .*\(orc: id, payload, region\)"):
        _check(f"file://{tmp_path}/*.orc", "orc", value_column=None, value_columns=["payload", "regin"],
               value_format="json")
    with pytest.raises(ConfigError, match="matches no file"):
        _check(f"file://{tmp_path}/*.parquet")


def test_csv_header_separator_and_gzip(tmp_path):
    (tmp_path / "h.csv").write_text("id;payload;deleted\n1;a;false\n")
    _check(f"file://{tmp_path}/h.csv", "csv", input_options={"Header": "true", "sep": ";"})
    with pytest.raises(ConfigError, match="delete_column 'delted'"):
        _check(f"file://{tmp_path}/h.csv", "csv", input_options={"header": "true", "sep": ";"},
               write_mode="delta", delete_column="delted")
    # Without header=true Spark names the columns _c0, _c1, ...: "id" is then no column at all.
    with pytest.raises(ConfigError, match=r"key_column 'id' .*\(csv: _c0, _c1, _c2\)"):
        _check(f"file://{tmp_path}/h.csv", "csv", input_options={"sep": ";"})
    with gzip.open(tmp_path / "z.csv.gz", "wt") as f:
        f.write("id,payload\n1,a\n")
    assert input_columns(str(tmp_path / "z.csv.gz"), "csv", {"header": "true"}) == ["id", "payload"]


def test_what_cannot_be_known_here_is_left_to_spark(tmp_path, parquet_dir):
    (tmp_path / "empty").mkdir()
    _check(f"file://{tmp_path}/empty")  # no file to read a schema from
    (tmp_path / "not.parquet").write_text("not parquet")
    _check(f"file://{tmp_path}/not.parquet")  # unreadable here: Spark names the problem
    _check(f"file://{parquet_dir}", value_column="elsewhere", input_options={"mergeSchema": "true"})
    (tmp_path / "events.json").write_text('{"id": 1}\n')
    _check(f"file://{tmp_path}/events.json", "json", value_column="elsewhere")  # json columns: Spark infers them
    _check("s3://bucket/in", value_column="anything")
    check_write_input(_config(None, input_table="db.t"), output_uri="s3://b/out")


def test_missing_local_path_and_missing_scheme(tmp_path):
    with pytest.raises(ConfigError, match=r"input_path 'file://.*/nope' does not exist on this machine"):
        _check(f"file://{tmp_path}/nope")
    with pytest.raises(ConfigError, match=r"input_path '/data/in' has no scheme: write 'file:///data/in'"):
        _check("/data/in")
    with pytest.raises(ConfigError, match=r"output_uri '/data/out' has no scheme: write 'file:///data/out'"):
        check_write_input(_config("s3://b/in"), output_uri="/data/out")
    for fine in ("file:/data/in", "s3a://b/in", "hdfs://nn/x", None):
        require_scheme("input_path", fine)


def test_a_home_path_and_a_windows_path_get_a_hint_that_works(monkeypatch, tmp_path):
    # Issue 42 item 3: the hint was file://<cwd>/~/x and file://<cwd>/C:\\data\\x.
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=rf"input_path '~/x' has no scheme: write 'file://{tmp_path}/x'") as err:
        require_scheme("input_path", "~/x")
    assert "~" not in str(err.value).split("write", 1)[1]
    for windows in ("C:\\data\\x", "c:/data/x", "D:"):
        with pytest.raises(ConfigError, match=r"is a Windows path: Windows paths are not supported here") as err:
            require_scheme("input_path", windows)
        assert os.getcwd() not in str(err.value)  # no file://<cwd>/C:... hint


def test_a_home_path_of_another_user_is_expanded_or_said_not_to_exist():
    # Issue 42 item 3: "~nouser/x" got the hint file://<cwd>/~nouser/x.
    import pwd

    root_home = pwd.getpwnam("root").pw_dir
    with pytest.raises(ConfigError, match=rf"input_path '~root/x' has no scheme: write 'file://{root_home}/x'"):
        require_scheme("input_path", "~root/x")
    with pytest.raises(ConfigError, match=r"^input_path '~nouser-sf42/x' has no scheme and names the home folder of "
                                          r"user 'nouser-sf42', who does not exist on this machine: give a "
                                          r"'file:///abs/dir' path") as err:
        require_scheme("input_path", "~nouser-sf42/x")
    assert os.getcwd() not in str(err.value)


def test_a_csv_check_of_a_folder_of_parquet_names_the_file_and_says_it_is_not_csv(tmp_path, parquet_dir):
    # Issue 42 item 4: the parquet bytes were printed as column names ("csv: PAR1 ...").
    with pytest.raises(ConfigError, match=r"input_path 'file://.*/pq' is not CSV: its first data file "
                                          r".*/day=1/part-0\.parquet is a parquet file") as err:
        _check(f"file://{parquet_dir}", "csv", input_options={"header": "true"})
    assert "PAR1" not in str(err.value)
    (tmp_path / "blob.csv").write_bytes(b"id,\x00\x01\x02payload\n")
    with pytest.raises(ConfigError, match=r"is not CSV: its first data file .*blob\.csv is binary"):
        _check(f"file://{tmp_path}/blob.csv", "csv", input_options={"header": "true"})


def test_operator_refuses_a_typo_in_a_second_and_writes_nothing(monkeypatch, tmp_path, parquet_dir):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, lambda config: pytest.fail("nothing may be submitted"))
    root = tmp_path / "snap"
    op = make_op(f"file://{root}", input_path=f"file://{parquet_dir}", value_column="paylaod", run_id="fixed")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="value_column 'paylaod' is not a column"):
        op.execute(make_context())
    assert time.monotonic() - started < 1.0
    assert seen.calls == [] and not root.exists()  # no run record, no lock, nothing under the root


def test_streaming_operator_checks_its_source_folder(monkeypatch, tmp_path):
    connections(monkeypatch)
    seen = stub_submit(monkeypatch, lambda config: pytest.fail("nothing may be submitted"))
    root = tmp_path / "snap"

    def ingest(source: str) -> StreamingSnapshotOperator:
        return StreamingSnapshotOperator(task_id="ingest", output_uri=f"file://{root}", source_path=source,
                                         checkpoint_location=f"file://{tmp_path}/cp", source_schema="id LONG, v STRING",
                                         value_column="v", spark_conn_id="sf_spark")

    with pytest.raises(ConfigError, match=r"source_path '/incoming' has no scheme: write 'file:///incoming'"):
        ingest("/incoming").execute(make_context())
    with pytest.raises(ConfigError, match=r"source_path 'file://.*/incoming' does not exist"):
        ingest(f"file://{tmp_path}/incoming").execute(make_context())
    assert seen.calls == [] and not root.exists()
