"""Storage layout (SPEC §3): every key built and parsed by core.layout."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError

TS = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
RUN_ID_CHARS = "ABCXYZabcxyz0123456789._-"
run_ids = st.text(alphabet=RUN_ID_CHARS, min_size=1, max_size=128).filter(lambda s: s not in (".", ".."))
BAD_RUN_IDS = ["", ".", "..", "a/b", "../x", "a b", "a\\b", "run*", "é", "a" * 129, "x\n", None, 12]


# ---- manifest / run record / attempt keys ---------------------------------------------------


def test_manifest_key_exact_form():
    assert layout.manifest_key("run-1", TS) == "manifests/2024-01-02T03:04:05.678901Z_run_id=run-1/manifest.json"


def test_manifest_key_uses_utc():
    plus_two = TS.astimezone(timezone(timedelta(hours=2)))
    assert layout.manifest_key("r", plus_two) == layout.manifest_key("r", TS)


@settings(max_examples=100, deadline=None)
@given(run_id=run_ids, ts=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1),
                                      timezones=st.just(UTC)))
def test_manifest_key_round_trip(run_id, ts):
    parsed = layout.parse_manifest_key(layout.manifest_key(run_id, ts))
    assert parsed == layout.ManifestKey(published_at=ts, run_id=run_id)


def test_manifest_keys_sort_by_publish_time():
    times = [TS + timedelta(seconds=s) for s in (0, 0.5, 1, 59, 3600, 86400 * 40)]
    keys = [layout.manifest_key("zzz" if i % 2 else "aaa", t) for i, t in enumerate(times)]
    assert sorted(keys) == keys


def test_run_record_key_exact_form():
    assert layout.run_record_key("run-1") == "runs/run_id=run-1/run.json"


@settings(max_examples=100, deadline=None)
@given(run_ids)
def test_run_record_key_round_trip(run_id):
    assert layout.parse_run_record_key(layout.run_record_key(run_id)) == run_id


def test_attempt_key_forms():
    assert layout.attempt_key("r", 3, 0) == "shards/run_id=r/db=00003/attempt=00"
    assert layout.attempt_key("r", 12345, 1, 987) == "shards/run_id=r/db=12345/attempt=01-task=987"
    assert layout.attempt_key("r", 0, 123) == "shards/run_id=r/db=00000/attempt=123"


def test_attempt_dirs_unique_across_stage_retries():
    # Stage retries restart attempt numbers at 0; the task attempt id keeps the directories apart.
    first, retried = layout.attempt_key("r", 5, 0, 17), layout.attempt_key("r", 5, 0, 42)
    assert first != retried and not first.startswith(retried) and not retried.startswith(first + "/")


@pytest.mark.parametrize(("attempt", "task"), [(-1, None), (0, -1)])
def test_attempt_negative_rejected(attempt, task):
    with pytest.raises(ConfigError, match="attempt"):
        layout.attempt_dir_name(attempt, task)


@settings(max_examples=150, deadline=None)
@given(run_id=run_ids, db_id=st.integers(0, 99999), attempt=st.integers(0, 500),
       task=st.one_of(st.none(), st.integers(0, 10**12)),
       rest=st.one_of(st.none(), st.sampled_from(["000001.sst", "CURRENT", "sub/dir/file.log"])))
def test_parse_shard_key_round_trip(run_id, db_id, attempt, task, rest):
    key = layout.attempt_key(run_id, db_id, attempt, task)
    full = key if rest is None else f"{key}/{rest}"
    parsed = layout.parse_shard_key(full)
    assert parsed == layout.ShardKey(run_id=run_id, db_id=db_id, attempt=attempt, task_attempt_id=task, rest=rest)
    assert parsed.attempt_key == key


def test_parse_shard_key_partial_levels():
    assert layout.parse_shard_key("shards/run_id=r1/") == layout.ShardKey("r1", None, None, None, None)
    db_only = layout.parse_shard_key("shards/run_id=r1/db=00003/")
    assert db_only == layout.ShardKey("r1", 3, None, None, None)
    assert db_only.attempt_key is None
    assert layout.shard_db_prefix("r1", 3) == "shards/run_id=r1/db=00003/"
    assert layout.shards_prefix("r1") == "shards/run_id=r1/"


@pytest.mark.parametrize(
    "key",
    [
        "shards/run_id=../db=00003/attempt=00/x",
        "shards/run_id=./db=00003/",
        "shards/run_id=a b/db=00003/",
        "shards/run_id=r1/db=3/attempt=00",  # db id must be 5 digits
        "shards/run_id=r1/db=00003/attempt=0",  # attempt at least 2 digits
        "shards/run_id=r1/db=00003/attempt=01-task=x",
        "shards/run_id=r1/db=00003/other=01",
        "runs/run_id=r1/run.json",
        "other/shards/run_id=r1/",
        "shards/run_id=" + "a" * 129 + "/",
        "shards/run_id=r1\n/db=00003/",
    ],
)
def test_parse_shard_key_rejects(key):
    assert layout.parse_shard_key(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "manifests/2024-01-02T03:04:05.678901Z_run_id=../manifest.json",
        "manifests/2024-01-02T03:04:05.678901Z_run_id=./manifest.json",
        "manifests/2024-01-02T03:04:05.678901Z_run_id=a/b/manifest.json",
        "manifests/2024-01-02T03:04:05Z_run_id=r/manifest.json",  # no microseconds
        "manifests/2024-13-02T03:04:05.678901Z_run_id=r/manifest.json",  # month 13
        "manifests/2024-01-02T03:04:05.678901Z_run_id=r/other.json",
        "manifests/2024-01-02T03:04:05.678901Z_run_id=" + "a" * 129 + "/manifest.json",
        "x/manifests/2024-01-02T03:04:05.678901Z_run_id=r/manifest.json",
        "manifests/2024-01-02T03:04:05.678901Z_run_id=r/manifest.json\n",
    ],
)
def test_parse_manifest_key_rejects(key):
    assert layout.parse_manifest_key(key) is None


@pytest.mark.parametrize(
    "key",
    ["runs/run_id=../run.json", "runs/run_id=./run.json", "runs/run_id=a/b/run.json", "runs/run_id=r/other.json",
     "runs/run_id=/run.json", "runs/run_id=" + "a" * 129 + "/run.json", "runs/run_id=r/run.json/x",
     "runs/run_id=r/run.json\n", "runs/run_id=r\n/run.json"],
)
def test_parse_run_record_key_rejects(key):
    assert layout.parse_run_record_key(key) is None


@pytest.mark.parametrize("bad", BAD_RUN_IDS)
def test_bad_run_ids_rejected_everywhere(bad):
    for build in (lambda r: layout.manifest_key(r, TS), layout.run_record_key, layout.shards_prefix,
                  lambda r: layout.attempt_key(r, 0, 0), layout.validate_run_id):
        with pytest.raises(ConfigError, match="run_id"):
            build(bad)


def test_run_id_of_128_chars_accepted():
    run_id = "a" * 128
    assert layout.validate_run_id(run_id) == run_id
    assert layout.parse_run_record_key(layout.run_record_key(run_id)) == run_id


# ---- run ids --------------------------------------------------------------------------------


def test_new_run_id_format():
    run_id = layout.new_run_id(TS)
    assert re.fullmatch(r"20240102T030405Z-[0-9a-f]{8}", run_id)
    assert layout.validate_run_id(run_id) == run_id
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", layout.new_run_id())


def test_new_run_id_is_utc():
    assert layout.new_run_id(TS.astimezone(timezone(timedelta(hours=-7)))).startswith("20240102T030405Z-")


def test_new_run_ids_unique():
    assert len({layout.new_run_id(TS) for _ in range(200)}) == 200


def test_new_run_id_lexical_order_is_time_order():
    times = sorted(TS + timedelta(seconds=s) for s in (0, 1, 59, 61, 3599, 86400, 86400 * 400, 86400 * 4000))
    ids = [layout.new_run_id(t) for t in times]
    for _ in range(20):  # the random suffix never reorders ids of different seconds
        assert sorted(ids) == ids
        ids = [layout.new_run_id(t) for t in times]


# ---- roots ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///data/out", "file:///data/out"),
        ("file:///data/out/", "file:///data/out"),
        ("file:///data//out", "file:///data/out"),
        ("/data/out", "file:///data/out"),
        ("  /data/out  ", "file:///data/out"),
        ("s3://my-bucket/prefix/sub/", "s3://my-bucket/prefix/sub"),
        ("s3://my-bucket", "s3://my-bucket"),
        ("s3://my-bucket/", "s3://my-bucket"),
        ("s3a://my-bucket/prefix", "s3://my-bucket/prefix"),
        ("s3://my.bucket-1/p", "s3://my.bucket-1/p"),
    ],
)
def test_normalize_root(uri, expected):
    assert layout.normalize_root(uri) == expected
    assert layout.normalize_root(expected) == expected  # idempotent


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("s3://My_Bucket/p", "bucket"),
        ("s3://ab/p", "bucket"),  # too short
        ("s3:///p", "bucket"),
        ("s3://-bucket/p", "bucket"),
        ("s3://bucket\n/p", "bucket"),
        ("file://relative/dir", "absolute path"),
        ("relative/dir", "expected"),
        ("./dir", "expected"),
        ("/data/../etc", r"'\.\.'"),
        ("file:///data/./x", r"'\.'"),
        ("s3://bucket/a/../b", r"'\.\.'"),
        ("gs://bucket/p", "expected"),
        ("http://host/p", "expected"),
        ("", "expected"),
        ("   ", "expected"),
        (None, "expected"),
        (42, "expected"),
    ],
)
def test_normalize_root_rejects(uri, match):
    with pytest.raises(ConfigError, match=match) as info:
        layout.normalize_root(uri)
    assert "output_uri" in str(info.value)


@pytest.mark.parametrize("root", ["s3://bkt/p", "s3://bkt", "file:///a/b", "file:///"])
def test_join_and_relative_key_round_trip(root):
    for key in ("_CURRENT", "runs/run_id=r/run.json", "shards/run_id=r/db=00001/attempt=00/000001.sst"):
        uri = layout.join(root, key)
        assert "//" not in uri.split("://", 1)[1].lstrip("/")
        assert layout.relative_key(root, uri) == key


def test_file_root_join_gives_real_path():
    assert layout.join("file:///", "x/y") == "file:///x/y"
    assert layout.join("file:///a", "x") == "file:///a/x"
    assert layout.local_path_of("file:///a/b") == "/a/b"
    assert layout.local_path_of("file:///") == "/"
    with pytest.raises(ConfigError):
        layout.local_path_of("s3://bkt/p")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bkt/prefix-other/x",  # shares the prefix string, not the folder
        "s3://bkt/pre",
        "s3://other/prefix/x",
        "file:///bkt/prefix/x",
        "s3://bkt/prefix/../x",
        "s3://bkt/prefix/a/../../x",
        "s3://bkt/prefix/./x",
        "s3://bkt/prefix/a//b",
        "s3://bkt/prefix/",
        "s3://bkt/prefix",
    ],
)
def test_relative_key_refuses_outside_root(uri):
    with pytest.raises(ManifestValidationError):
        layout.relative_key("s3://bkt/prefix", uri)


def test_a_reference_outside_the_root_is_refused_without_its_credentials():
    with pytest.raises(ManifestValidationError, match=r"^'s3://\*\*\*@bkt/prefix/m.json' lies outside") as refused:
        layout.relative_key("s3://bkt/prefix", "s3://AKIAEXAMPLE:topsecret@bkt/prefix/m.json")
    assert "topsecret" not in str(refused.value)


def test_scheme_and_timestamps():
    assert layout.scheme_of("s3://b/p") == "s3" and layout.scheme_of("file:///x") == "file"
    assert layout.format_ts(TS) == "2024-01-02T03:04:05.678901Z"
    assert layout.parse_ts(layout.format_ts(TS)) == TS


def test_local_cache_dir():
    assert layout.local_cache_dir("/tmp/c", "r1", 7) == "/tmp/c/run_id=r1/db=00007"
    with pytest.raises(ConfigError):
        layout.local_cache_dir("/tmp/c", "..", 7)
