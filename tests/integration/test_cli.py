"""The ``shardyfusion`` command line: JSON out, one line on stderr and status 1 on errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from airflow_provider_shardyfusion.cli import main
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot

ROOT = Path(__file__).resolve().parents[2]


def _flags(opts):
    if not opts:
        return []
    return ["--endpoint-url", opts["endpoint_url"], "--region", opts["region_name"], "--path-style"]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _ok(capsys, *argv):
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def _fails(capsys, *argv):
    code, out, err = _run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("shardyfusion: "), err
    return err


def test_current_manifest_runs(any_root, capsys):
    root, opts = any_root
    first = build_snapshot(root, [(i, b"a") for i in range(10)], num_dbs=2, storage_options=opts)
    second = build_snapshot(root, [(i, b"b") for i in range(30)], num_dbs=3, storage_options=opts,
                            published_at=first.published_at + timedelta(seconds=1))
    flags = _flags(opts)

    current = _ok(capsys, "current", root, *flags)
    assert current["run_id"] == second.run_id and current["manifest_ref"] == second.manifest_ref

    assert _ok(capsys, "manifest", root, *flags) == second.manifest.to_dict()
    assert _ok(capsys, "manifest", root, "--run-id", first.run_id, *flags) == first.manifest.to_dict()
    assert "no manifest of run 'nope'" in _fails(capsys, "manifest", root, "--run-id", "nope", *flags)

    runs = _ok(capsys, "runs", root, *flags)
    assert [r["run_id"] for r in runs] == sorted([first.run_id, second.run_id])
    assert {r["status"] for r in runs} == {"succeeded"}
    assert runs[0]["ref"].endswith(f"runs/run_id={runs[0]['run_id']}/run.json")

    # a broken run record is reported in place, not fatal for the listing
    open_store(root, opts).put(layout.run_record_key("zz-broken"), b"{oops")
    runs = _ok(capsys, "runs", root, *flags)
    assert runs[-1]["run_id"] == "zz-broken" and "not valid JSON" in runs[-1]["invalid"]


def test_get_int_keys(any_root, capsys):
    root, opts = any_root
    build_snapshot(root, [(i, f"v{i}".encode()) for i in range(50)] + [(99, b"\xff\x00bin")],
                   num_dbs=4, storage_options=opts, key_column="id")
    out = _ok(capsys, "get", root, "3", "99", "77", "3", *_flags(opts))
    results = out["results"]
    assert [r["key"] for r in results] == [3, 99, 77, 3]
    assert results[0] == {"key": 3, "found": True, "db_id": results[0]["db_id"], "value": "v3", "value_encoding": "utf8"}
    assert results[1]["value_encoding"] == "base64" and base64.b64decode(results[1]["value"]) == b"\xff\x00bin"
    assert results[2] == {"key": 77, "found": False, "db_id": results[2]["db_id"], "value": None, "value_encoding": None}
    assert "not an integer" in _fails(capsys, "get", root, "x", "--key-type", "int", *_flags(opts))
    assert "KeyEncodingError" in _fails(capsys, "get", root, "x", *_flags(opts))  # auto: not an int → str


def test_get_str_json_and_bytes_keys(file_root, tmp_path, capsys):
    build_snapshot(file_root, [("12", {"a": 1}), ("k", {"b": [1, 2]})], num_dbs=2, value_format="json")
    out = _ok(capsys, "get", file_root, "12", "k", "zz")
    assert [(r["key"], r["value"], r["value_encoding"]) for r in out["results"]] == [
        ("12", {"a": 1}, "json"), ("k", {"b": [1, 2]}, "json"), ("zz", None, None)]

    raw_root = f"file://{tmp_path}/raw"
    build_snapshot(raw_root, [(b"abc", b"1"), (b"\x00\x01", b"2")], num_dbs=2)
    out = _ok(capsys, "get", raw_root, "abc", "--cache-dir", str(tmp_path / "cache"))
    assert out["results"][0]["key"] == {"hex": "616263"} and out["results"][0]["value"] == "1"
    out = _ok(capsys, "get", raw_root, "0001", "--key-type", "hex")
    assert out["results"][0]["value"] == "2"
    assert os.listdir(tmp_path / "cache")


def test_get_with_routing_context(file_root, capsys):
    build_snapshot(file_root, [(1, b"eu-one"), (2, b"us-two")], num_dbs=2, key_column="id",
                   cel_expr='region == "eu" ? 0 : 1', cel_columns={"id": "int", "region": "string"},
                   routing_context=lambda k: {"region": "eu" if k == 1 else "us"})
    assert "routing_context" in _fails(capsys, "get", file_root, "1")
    out = _ok(capsys, "get", file_root, "1", "--routing-context", '{"region": "eu"}')
    assert out["results"][0]["value"] == "eu-one" and out["results"][0]["db_id"] == 0
    assert "not valid JSON" in _fails(capsys, "get", file_root, "1", "--routing-context", "{")


def test_errors_are_one_line(tmp_path, capsys):
    missing = f"file://{tmp_path}/nothing"
    assert "_CURRENT does not exist" in _fails(capsys, "current", missing)
    assert "ReaderError" in _fails(capsys, "get", missing, "1")
    assert "is invalid" in _fails(capsys, "current", "ftp://x")
    assert "required" in _fails(capsys)
    assert "invalid choice" in _fails(capsys, "bogus")
    assert "--run-id" in _fails(capsys, "manifest", missing, "--run-id", "a/b")


def test_module_entry_point(file_root):
    built = build_snapshot(file_root, [(1, b"one")], num_dbs=1)
    proc = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", "get", file_root, "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"run_id": built.run_id, "results": [
        {"key": 1, "found": True, "db_id": 0, "value": "one", "value_encoding": "utf8"}]}
    proc = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", "current", file_root + "-none"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
