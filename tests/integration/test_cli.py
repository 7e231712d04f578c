"""The ``shardyfusion`` command line: JSON when piped (a table on a terminal), one line on stderr and
status 1 on errors."""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import subprocess
import sys
import typing
from datetime import timedelta
from pathlib import Path

from airflow_provider_shardyfusion.cli import main
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.history import RunState
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_delta, build_snapshot

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
    assert out["live"] is True
    assert results[0] == {"key": 3, "found": True, "db_id": results[0]["db_id"], "value": "v3", "value_encoding": "utf8"}
    assert results[1]["value_encoding"] == "base64" and base64.b64decode(results[1]["value"]) == b"\xff\x00bin"
    assert results[2] == {"key": 77, "found": False, "db_id": results[2]["db_id"], "value": None, "value_encoding": None}
    assert "not an integer" in _fails(capsys, "get", root, "x", "--key-type", "int", *_flags(opts))
    assert "KeyEncodingError" in _fails(capsys, "get", root, "x", *_flags(opts))  # auto: not an int → str
    err = _fails(capsys, "get", root, "9" * 5000, *_flags(opts))  # longer than int() reads: refused first
    assert "key '99999" in err and "(5000 digits) is out of range (rule: u64be takes 0..18446744073709551615)" in err


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
    assert json.loads(proc.stdout) == {"run_id": built.run_id, "live": True, "results": [
        {"key": 1, "found": True, "db_id": 0, "value": "one", "value_encoding": "utf8"}]}
    proc = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", "current", file_root + "-none"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1


def test_get_reads_a_key_as_of_any_kept_run(any_root, capsys):
    root, opts = any_root
    flags = _flags(opts)
    old = build_snapshot(root, [(i, f"old-{i}".encode()) for i in range(20)], num_dbs=3, storage_options=opts)
    new = build_snapshot(root, [(i, f"new-{i}".encode()) for i in range(10, 30)], num_dbs=2, storage_options=opts,
                         published_at=old.published_at + timedelta(seconds=1))

    def values(*extra):
        out = _ok(capsys, "get", root, "5", "15", "25", *extra, *flags)
        return out["run_id"], out["live"], [r["value"] for r in out["results"]]

    assert values() == (new.run_id, True, [None, "new-15", "new-25"])
    assert values("--run-id", old.run_id) == (old.run_id, False, ["old-5", "old-15", None])
    assert values("--manifest-ref", old.manifest_ref) == (old.run_id, False, ["old-5", "old-15", None])
    assert values("--run-id", new.run_id) == (new.run_id, False, [None, "new-15", "new-25"])
    assert "run 'nope' has no manifest" in _fails(capsys, "get", root, "5", "--run-id", "nope", *flags)
    assert "not allowed with argument" in _fails(capsys, "get", root, "5", "--run-id", old.run_id,
                                                 "--manifest-ref", old.manifest_ref, *flags)


def _base_and_delta(root, opts=None):
    """Run t0: keys 0..99; run t1, a delta on it: 5 updated, 3 deleted and 5 inserted at the end of the key space."""
    build_snapshot(root, [(k, f"v0-{k}".encode()) for k in range(100)], num_dbs=4, storage_options=opts,
                   shard_layout="sst", run_id="t0", key_column="id")
    build_delta(root, {**{k: f"v1-{k}".encode() for k in range(10, 15)},
                       **{k: f"new-{k}".encode() for k in range(1000, 1005)}},
                deletes=[20, 21, 22], storage_options=opts, run_id="t1")
    expected = {**{k: ("updated", f"v0-{k}", f"v1-{k}") for k in range(10, 15)},
                **{k: ("deleted", f"v0-{k}", None) for k in (20, 21, 22)},
                **{k: ("inserted", None, f"new-{k}") for k in range(1000, 1005)}}
    return expected


def test_diff_keys_lists_every_changed_key_with_its_values(any_root, capsys, tmp_path):
    root, opts = any_root
    flags = _flags(opts)
    expected = _base_and_delta(root, opts)
    out = _ok(capsys, "diff", root, "t0", "t1", "--keys", "--cache-dir", str(tmp_path / "cache"), *flags)
    assert {c["key"]: (c["kind"], c["before"], c["after"]) for c in out["changes"]} == expected
    assert len(out["changes"]) == len(expected) and out["complete"] is True
    assert [c["db_id"] for c in out["changes"]] == sorted(c["db_id"] for c in out["changes"])  # shard by shard
    with ShardedReader(root, storage_options=opts, cache_dir=str(tmp_path / "cache")) as reader:
        assert reader.run_id == "t1"  # each key is listed in the shard that holds it
        assert all(reader.shard_for_key(c["key"]) == c["db_id"] for c in out["changes"])

    # One kind, every one of it: the inserts at the end of the key space are all there.
    inserted = _ok(capsys, "diff", root, "t0", "t1", "--keys", "--kind", "inserted", *flags)
    assert {c["key"]: c["after"] for c in inserted["changes"]} == {k: f"new-{k}" for k in range(1000, 1005)}
    assert inserted["kinds"] == ["inserted"] and inserted["complete"] is True
    two = _ok(capsys, "diff", root, "t0", "t1", "--keys", "--kind", "deleted", "--kind", "updated", *flags)
    assert {c["key"] for c in two["changes"]} == {*range(10, 15), 20, 21, 22}

    limited = _ok(capsys, "diff", root, "t0", "t1", "--keys", "--limit", "3", *flags)
    assert len(limited["changes"]) == 3 and limited["complete"] is False
    assert limited["changes"] == out["changes"][:3]
    # Backwards, RUN_B = t0: what t0 has against t1 (inserts become deletes).
    back = _ok(capsys, "diff", root, "t1", "t0", "--keys", "--kind", "deleted", *flags)
    assert {c["key"]: c["before"] for c in back["changes"]} == {k: f"new-{k}" for k in range(1000, 1005)}

    assert "--kind and --limit go with --keys" in _fails(capsys, "diff", root, "t0", "t1", "--kind", "inserted", *flags)
    assert "--limit must be at least 1" in _fails(capsys, "diff", root, "t0", "t1", "--keys", "--limit", "0", *flags)
    assert "invalid choice" in _fails(capsys, "diff", root, "t0", "t1", "--keys", "--kind", "renamed", *flags)


def test_diff_keys_refuses_runs_sharded_differently(file_root, capsys):
    a = build_snapshot(file_root, [(i, b"a") for i in range(10)], num_dbs=2)
    b = build_snapshot(file_root, [(i, b"b") for i in range(10)], num_dbs=3,
                       published_at=a.published_at + timedelta(seconds=1))
    assert "sharded differently" in _fails(capsys, "diff", file_root, a.run_id, b.run_id, "--keys")
    # The shard-by-shard diff of the two still works.
    assert _ok(capsys, "diff", file_root, a.run_id, b.run_id)["same_routing"] is False


def _on_a_terminal(*argv: str) -> str:
    """Run the CLI with its stdout on a real pseudo-terminal (as a person's shell gives it); its output."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", *argv], stdout=follower,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_terminal_gets_tables_and_json_on_request(file_root):
    _base_and_delta(file_root)  # t1 is live, a delta: the history names t0 its base
    history = _on_a_terminal("history", file_root)
    lines = history.splitlines()
    heading = next(line for line in lines if line.startswith("RUN_ID"))
    assert heading.split()[:4] == ["RUN_ID", "STATE", "WRITE_MODE", "CHANGE_LABEL"]
    rows = {line.split()[0]: line.split()[1] for line in lines[lines.index(heading) + 1:]}
    assert rows == {"t1": "live", "t0": "base_of_live"}
    assert "+5 ~5 \u22123 (net +2)" in history
    assert json.loads(_on_a_terminal("history", file_root, "--json"))["live_run_id"] == "t1"

    keys = _on_a_terminal("diff", file_root, "t0", "t1", "--keys", "--kind", "inserted").splitlines()
    heading = keys.index(next(line for line in keys if line.startswith("DB_ID")))
    # Columns empty in every row (before, fields) are left out.
    assert keys[heading].split() == ["DB_ID", "KIND", "KEY", "AFTER"]
    assert sorted(line.split()[1:] for line in keys[heading + 1:]) == [
        ["inserted", str(k), f"new-{k}"] for k in range(1000, 1005)]

    got = _on_a_terminal("get", file_root, "10", "1003", "--run-id", "t0").splitlines()
    assert "run_id  t0" in got and "live    no" in got
    assert [line.split() for line in got[got.index("results:") + 1:]] == [
        ["KEY", "FOUND", "DB_ID", "VALUE", "VALUE_ENCODING"], ["10", "yes", got[-2].split()[2], "v0-10", "utf8"],
        ["1003", "no", got[-1].split()[2], "-", "-"]]


def test_a_terminal_gets_the_cleanup_plan_and_whole_shard_folders_as_tables(file_root):
    from tests.cleanup_runs import objects, succeeded_run

    store = open_store(file_root, None)
    t = layout.utc_now()
    # Generated run ids are long: the shard folders of the live one do not fit a cell.
    live = f"{layout.new_run_id(t)}-scheduled-long-name"
    for n, run_id in enumerate(("c-old", "c-mid", live)):
        succeeded_run(store, run_id, t - timedelta(days=3 - n), losing=run_id == "c-mid")
    before = objects(store)

    args = ("cleanup", file_root, "--dry-run", "--keep-runs", "2", "--grace-period-seconds", "0")
    plan = json.loads(_on_a_terminal(*args, "--json"))["plan"]
    text = _on_a_terminal(*args)
    assert objects(store) == before  # a dry run deletes nothing
    lines = text.splitlines()
    assert "dry_run       yes" in lines and f"live_run_id   {live}" in lines
    heading = lines.index("would_delete:") + 1
    assert lines[heading].split() == ["RUN_ID", "WHAT", "WHY", "OBJECTS", "BYTES", "RECORD"]
    rows = {line.split()[0]: line for line in lines[heading + 1:lines.index("", heading)]}
    assert set(rows) == {item["run_id"] for item in plan["items"]} == {"c-old", "c-mid"}
    for item in plan["items"]:  # what, why, objects and bytes as the JSON plan has them
        assert re.search(rf"\s{item['objects']}\s+{item['bytes']:,}\s", rows[item["run_id"]]), rows
    assert "losing attempts: db=00000/attempt=00-task=3" in rows["c-mid"]
    assert "attempts the manifest does not name" in rows["c-mid"]
    assert "beyond the newest keep_runs succeeded runs" in rows["c-old"]
    assert lines[lines.index("left_alone:") + 2].split()[:2] == [live, "live"]

    shards = _on_a_terminal("manifest", file_root).splitlines()
    heading = shards.index("shards:") + 1
    urls = [line.split()[1] for line in shards[heading + 1:]]
    # Relative to the root, and cut from the left when too long: the db and attempt stay readable.
    assert [u[-len("db=00000/attempt=01-task=10"):] for u in urls] == [
        "db=00000/attempt=01-task=10", "db=00001/attempt=01-task=11"]
    assert all(u.startswith("…") and len(u) == 48 for u in urls), urls


def test_history_help_names_every_state_the_ui_shows():
    proc = subprocess.run([sys.executable, "-m", "airflow_provider_shardyfusion", "history", "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert set(typing.get_args(RunState)) <= set(listed), listed
    assert "base_of_live" in listed
