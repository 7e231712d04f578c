"""ShardedReader against snapshots laid out by hand through core, on the file store and on S3 (moto)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    ChecksumMismatchError,
    KeyEncodingError,
    ManifestValidationError,
    ReaderError,
    ShardAssignmentError,
    ShardyfusionError,
)
from airflow_provider_shardyfusion.core.model import checksum as checksum_module
from airflow_provider_shardyfusion.core.model.encoding import encode_key
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.routing import route_key
from airflow_provider_shardyfusion.core.read import local_copy
from airflow_provider_shardyfusion.core.read.key_locator import KeyLocator, hash_locator, int_key_grouper
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.core.storage.s3 import S3Store
from tests.snapshot_factory import build_snapshot, publish_current
from tests.typed_values import ROW, SCHEMA, assert_same, encode_v3, expected_rows

ROOT = Path(__file__).resolve().parents[2]


def _value(i: int) -> bytes:
    return f"value-{i}-".encode() * 3


def _on_download(monkeypatch, before) -> None:
    """Call ``before(key)`` before every object any store (the file store, S3) downloads from now on."""
    for store_class in (LocalStore, S3Store):
        def download(self, key: str, local_path: str, original=store_class.download_file) -> None:
            before(key)
            original(self, key, local_path)

        monkeypatch.setattr(store_class, "download_file", download)


def _count_downloads(monkeypatch) -> collections.Counter:
    """Every object downloaded from now on, by key (the test's one reader is the only one downloading)."""
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def count(key: str) -> None:
        with lock:
            counts[key] += 1

    _on_download(monkeypatch, count)
    return counts


def _cached_shards(reader: ShardedReader) -> set[int]:
    run_dir = os.path.join(reader.cache_dir, f"run_id={reader.run_id}")
    if not os.path.isdir(run_dir):
        return set()
    return {int(name[3:]) for name in os.listdir(run_dir) if name.startswith("db=")}


def _open_files_under(path: str) -> list[str]:
    """Files this process holds open below ``path`` (Linux; elsewhere nothing is checked)."""
    if not os.path.isdir("/proc/self/fd"):
        return []
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path + os.sep):
            found.append(target)
    return found


def _files_under(path: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]


def _stall_first_fetch(monkeypatch, where: str) -> tuple[threading.Event, threading.Event]:
    """Hold the first shard file the reader fetches inside ``where`` ("download" or "verify").

    Returns (entered, release): ``entered`` is set once a thread is held, which then waits for
    ``release``. Later fetches pass straight through.
    """
    entered, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    first = [True]

    def hold() -> None:
        with lock:
            mine, first[0] = first[0], False
        if mine:
            entered.set()
            assert release.wait(30), "the test never released the held fetch"

    if where == "download":
        _on_download(monkeypatch, lambda key: hold())  # before the copy: the staging folder exists, the file does not yet
    else:
        original_verify = local_copy.verify_file

        def verify(path, size, checksum, *, source):
            hold()  # the file is downloaded into staging, not yet checked or renamed
            original_verify(path, size, checksum, source=source)

        _patch_verify(monkeypatch, verify)
    return entered, release


def _patch_verify(monkeypatch, fn) -> None:
    """Replace the reader's file check: on a cached copy's reuse (local_copy) and as files arrive
    (checksum.download_verified, which local_copy fetches through)."""
    monkeypatch.setattr(local_copy, "verify_file", fn)
    monkeypatch.setattr(checksum_module, "verify_file", fn)


def _in_thread(fn) -> tuple[threading.Thread, list, list]:
    results: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results, errors


# ---- look-ups ---------------------------------------------------------------------------------


def test_int_keys_binary_values(any_root):
    root, opts = any_root
    rows = [(i * 7, _value(i)) for i in range(400)]
    built = build_snapshot(root, rows, num_dbs=8, storage_options=opts, key_column="id")
    assert built.manifest.key_encoding == "u64be"
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.run_id == built.run_id
        assert reader.manifest == built.manifest
        for key, value in rows:
            assert reader.get(key) == value
        for absent in (1, 2, 10**12, 2**63 - 1):
            assert reader.get(absent) is None
        with pytest.raises(ShardyfusionError, match="signed 64-bit"):  # encodable as u64be, but not routable
            reader.get(2**63)
        keys = [*[k for k, _ in rows][::-1], 3, 0, 0]
        assert reader.multi_get(keys) == [*[v for _, v in rows][::-1], None, _value(0), _value(0)]
        assert reader.multi_get([]) == []
        assert reader.multi_get(iter([7, 8])) == [_value(1), None]
        for key, _ in rows[:50]:
            assert reader.shard_for_key(key) == route_key(key, 8)
        with pytest.raises(KeyEncodingError, match="u64be"):
            reader.get(-1)
        with pytest.raises(KeyEncodingError, match="not an integer"):
            reader.get("7")


def test_string_keys_json_values(any_root):
    root, opts = any_root
    rows = [(f"user-{i}", {"name": f"n{i}", "score": i, "tags": ["a", i]}) for i in range(200)]
    rows.append(("ünïcødé ✓", {"name": "x", "score": -1, "tags": []}))
    build_snapshot(root, rows, num_dbs=5, storage_options=opts, value_format="json")
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.manifest.key_encoding == "utf8"
        assert reader.manifest.value_format == "json"
        for key, value in rows:
            assert reader.get(key) == value
        assert reader.get("user-200") is None
        assert reader.multi_get(["user-3", "nope", "ünïcødé ✓"]) == [rows[3][1], None, rows[-1][1]]


def test_bytes_keys(any_root):
    root, opts = any_root
    rows = [(bytes([i, 255 - i, 0]) * (1 + i % 3), bytes([i]) * 5) for i in range(100)]
    rows.append((b"", b"empty key"))
    build_snapshot(root, rows, num_dbs=3, storage_options=opts)
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.manifest.key_encoding == "raw"
        for key, value in rows:
            assert reader.get(key) == value
        # bytes and str route alike (SPEC §4); raw keys still need bytes to be looked up
        assert reader.shard_for_key(bytearray(b"hello")) == route_key("hello", 3)
        assert reader.get(bytearray(rows[5][0])) == rows[5][1]
        with pytest.raises(KeyEncodingError, match="raw"):
            reader.get("text")


def test_empty_shards_answer_none_without_io(any_root, monkeypatch):
    root, opts = any_root
    num_dbs = 16
    present = [1, 2, 3]
    build_snapshot(root, [(k, _value(k)) for k in present], num_dbs=num_dbs, storage_options=opts)
    used = {route_key(k, num_dbs) for k in present}
    empty_keys = [k for k in range(100, 2000) if route_key(k, num_dbs) not in used][:40]
    assert len({route_key(k, num_dbs) for k in empty_keys}) > 5
    with ShardedReader(root, storage_options=opts) as reader:
        assert {s.db_id for s in reader.manifest.shards} == used  # sparse manifest
        downloads = _count_downloads(monkeypatch)
        assert [reader.get(k) for k in empty_keys] == [None] * len(empty_keys)
        assert reader.multi_get(empty_keys) == [None] * len(empty_keys)
        assert not downloads and _cached_shards(reader) == set()
        assert reader.multi_get(empty_keys[:3] + present) == [None] * 3 + [_value(k) for k in present]
        assert _cached_shards(reader) == used


def test_multi_get_if_open_reads_only_shards_already_open(file_root, monkeypatch):
    """What ``serve`` calls on its event loop: never a download or an open, None instead."""
    num_dbs = 8
    present = [1, 2, 3, 4]
    build_snapshot(file_root, [(k, _value(k)) for k in present], num_dbs=num_dbs, run_id="r1")
    used = {route_key(k, num_dbs) for k in present}
    empty_keys = [k for k in range(100, 400) if route_key(k, num_dbs) not in used][:5]
    first, *others = present
    others = [k for k in others if route_key(k, num_dbs) != route_key(first, num_dbs)]
    assert others
    with ShardedReader(file_root) as reader:
        downloads = _count_downloads(monkeypatch)
        assert reader.multi_get_if_open([first]) is None
        assert not downloads and _cached_shards(reader) == set()
        assert reader.multi_get_if_open(empty_keys) == ("r1", [None] * len(empty_keys))  # empty shards: no I/O
        assert reader.multi_get([first]) == [_value(first)]  # opens its shard
        assert reader.multi_get_if_open([first, *empty_keys]) == ("r1", [_value(first), *[None] * len(empty_keys)])
        assert reader.multi_get_if_open([first, others[0]]) is None  # one shard of two still cold
        assert _cached_shards(reader) == {route_key(first, num_dbs)}
        reader.multi_get(present)
        assert reader.multi_get_if_open(present[::-1]) == reader.multi_get_with_run_id(present[::-1]) \
            == ("r1", [_value(k) for k in present[::-1]])


# ---- refresh ----------------------------------------------------------------------------------


def test_refresh_swaps_to_a_new_run(any_root):
    root, opts = any_root
    first = build_snapshot(root, [(i, b"old-%d" % i) for i in range(50)], num_dbs=4, storage_options=opts)
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.get(1) == b"old-1"
        assert reader.refresh() is False  # nothing new
        old_cache = os.path.join(reader.cache_dir, f"run_id={first.run_id}")
        assert os.path.isdir(old_cache)
        second = build_snapshot(
            root, [(i, b"new-%d" % i) for i in range(25, 100)], num_dbs=6, storage_options=opts,
            published_at=first.published_at + timedelta(seconds=1),
        )
        assert reader.run_id == first.run_id and reader.get(2) == b"old-2"
        assert reader.refresh() is True
        assert reader.run_id == second.run_id and reader.manifest.num_dbs == 6
        assert reader.get(2) is None and reader.get(30) == b"new-30" and reader.get(99) == b"new-99"
        assert reader.multi_get([1, 26, 80]) == [None, b"new-26", b"new-80"]
        assert not os.path.exists(old_cache)  # the private cache drops what no snapshot needs
        assert _open_files_under(old_cache) == []  # and the retired shard handles are closed
        assert reader.refresh() is False


def _publish_manifest_bytes(root, opts, run_id, data: bytes, published_at):
    store = open_store(root, opts)
    key = layout.manifest_key(run_id, published_at)
    store.put(key, data)
    publish_current(store, key, run_id, published_at)
    return key


@pytest.mark.parametrize("damage", ["not-json", "truncated", "bad-shard-entry", "foreign-db-url", "bad-version"])
def test_refresh_past_a_malformed_manifest_keeps_the_old_snapshot(any_root, damage):
    root, opts = any_root
    first = build_snapshot(root, [(i, b"old-%d" % i) for i in range(50)], num_dbs=4, storage_options=opts)
    later = first.published_at + timedelta(seconds=1)
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.get(3) == b"old-3"
        good = first.manifest.to_dict()
        bad_run = "run-bad"
        if damage == "not-json":
            data = b"{not json"
        elif damage == "truncated":
            data = Manifest.to_bytes(dataclasses.replace(first.manifest, run_id=bad_run))[:100]
        elif damage == "bad-shard-entry":
            good.update(run_id=bad_run, shards=[{"db_id": 0}])
            data = __import__("json").dumps(good).encode()
        elif damage == "foreign-db-url":  # valid JSON, but its shards belong to another run
            data = dataclasses.replace(first.manifest, run_id=bad_run).to_dict()
            data = __import__("json").dumps(data).encode()
        else:
            good.update(run_id=bad_run, format_version=99)
            data = __import__("json").dumps(good).encode()
        _publish_manifest_bytes(root, opts, bad_run, data, later)
        assert reader.refresh() is False
        assert reader.run_id == first.run_id and reader.get(3) == b"old-3"
        assert reader.multi_get([4, 5]) == [b"old-4", b"old-5"]
        third = build_snapshot(root, [(1, b"third")], num_dbs=2, storage_options=opts,
                               published_at=later + timedelta(seconds=1))
        assert reader.refresh() is True
        assert reader.run_id == third.run_id and reader.get(1) == b"third" and reader.get(3) is None


_POINTER_DAMAGE = [
    "not-json", "not-an-object", "no-format-version", "newer-format-version", "missing-run-id", "bad-timestamp",
    "manifest-outside-root", "run-id-mismatch", "manifest-missing",
]


# Parsing the pointer does not depend on the store: S3 runs the cases whose errors the store raises.
@pytest.mark.parametrize(
    ("where", "damage"), [("file", d) for d in _POINTER_DAMAGE] + [("s3", "not-json"), ("s3", "manifest-missing")]
)
def test_refresh_past_a_malformed_current_keeps_the_old_snapshot(request, where, damage, monkeypatch):
    if where == "file":
        root, opts = request.getfixturevalue("file_root"), None
    else:
        root, opts = request.getfixturevalue("s3_root"), request.getfixturevalue("s3_options")
    first = build_snapshot(root, [(i, b"old-%d" % i) for i in range(50)], num_dbs=4, storage_options=opts)
    store = open_store(root, opts)
    later = first.published_at + timedelta(seconds=1)
    # a good snapshot that a sound _CURRENT would name, so only the pointer itself is at fault
    second = build_snapshot(root, [(1, b"second")], num_dbs=2, storage_options=opts, published_at=later, publish=False)
    good = CurrentPointer(manifest_ref=second.manifest_ref, run_id=second.run_id, updated_at=later).to_dict()
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.get(3) == b"old-3"
        if damage == "not-json":
            data = b"{not json"
        elif damage == "not-an-object":
            data = json.dumps([good]).encode()
        else:
            pointer = dict(good)
            if damage == "no-format-version":
                del pointer["format_version"]
            elif damage == "newer-format-version":
                pointer["format_version"] = 99
            elif damage == "missing-run-id":
                del pointer["run_id"]
            elif damage == "bad-timestamp":
                pointer["updated_at"] = "yesterday"
            elif damage == "manifest-outside-root":
                pointer["manifest_ref"] = "file:///elsewhere/manifests/x/manifest.json"
            elif damage == "run-id-mismatch":  # names run A's manifest but claims run B
                pointer["run_id"] = first.run_id
            else:  # a well-formed pointer to a manifest that does not exist
                pointer["manifest_ref"] = store.uri(layout.manifest_key("run-gone", later))
                pointer["run_id"] = "run-gone"
            data = json.dumps(pointer).encode()
        store.put(layout.CURRENT_KEY, data)
        downloads = _count_downloads(monkeypatch)
        assert reader.refresh() is False
        assert reader.refresh() is False  # still kept, never raised; each a failed check, kept for health()
        assert reader.health().status == "degraded" and "UnusableSnapshotError" in reader.health().last_error
        assert reader.run_id == first.run_id and reader.manifest == first.manifest
        assert reader.get(3) == b"old-3" and reader.multi_get([4, 5, 77]) == [b"old-4", b"old-5", None]
        assert not any(second.run_id in key for key in downloads)
        publish_current(store, second.manifest_key, second.run_id, later)  # repaired
        assert reader.refresh() is True
        assert reader.run_id == second.run_id and reader.get(1) == b"second" and reader.get(3) is None


def test_pinned_manifest_ref(file_root):
    first = build_snapshot(file_root, [(1, b"first")], num_dbs=2)
    build_snapshot(file_root, [(1, b"second")], num_dbs=2, published_at=first.published_at + timedelta(seconds=1))
    with ShardedReader(file_root, manifest_ref=first.manifest_ref) as reader:
        assert reader.run_id == first.run_id and reader.get(1) == b"first"
        assert reader.refresh() is False and reader.get(1) == b"first"
    with ShardedReader(file_root) as reader:
        assert reader.get(1) == b"second"
    with pytest.raises(ManifestValidationError, match="not a manifest"):
        ShardedReader(file_root, manifest_ref=f"{file_root}/runs/run_id={first.run_id}/run.json")
    with pytest.raises(ManifestValidationError, match="outside the output root"):
        ShardedReader(file_root, manifest_ref="file:///elsewhere/manifests/x/manifest.json")


def test_refresh_when_current_disappears_keeps_serving(file_root):
    build_snapshot(file_root, [(1, b"one")], num_dbs=2)
    with ShardedReader(file_root) as reader:
        open_store(file_root).delete_many([layout.CURRENT_KEY])
        assert reader.refresh() is False
        assert reader.get(1) == b"one"


def test_reads_during_refresh_see_one_snapshot_or_the_other(file_root):
    first = build_snapshot(file_root, [(i, b"A") for i in range(200)], num_dbs=4)
    stop = threading.Event()
    seen: set[bytes] = set()
    errors: list[BaseException] = []

    def reader_loop(reader: ShardedReader) -> None:
        try:
            while not stop.is_set():
                values = set(reader.multi_get(list(range(200))))
                assert len(values) == 1, values  # never a mix of two runs
                seen.update(values)
                seen.add(reader.get(7))
        except BaseException as exc:
            errors.append(exc)

    with ShardedReader(file_root) as reader:
        threads = [threading.Thread(target=reader_loop, args=(reader,)) for _ in range(3)]
        for t in threads:
            t.start()
        when = first.published_at
        for n, tag in enumerate([b"B", b"C", b"D"], start=1):
            build_snapshot(file_root, [(i, tag) for i in range(200)], num_dbs=3 + n,
                           published_at=when + timedelta(seconds=n))
            assert reader.refresh() is True
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert reader.get(7) == b"D"
        assert b"D" in seen


@pytest.mark.parametrize("call", ["get", "multi_get"])
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_read_caught_by_refresh_retries_on_the_new_snapshot(file_root, monkeypatch, call, warm):
    first = build_snapshot(file_root, [(i, b"old") for i in range(20)], num_dbs=2)
    armed, swapped = [False], []
    for_manifest = KeyLocator.for_manifest

    def locator_that_refreshes(manifest: Manifest) -> KeyLocator:
        """The first run's look-ups, which land a refresh first once armed."""
        locator = for_manifest(manifest)
        if manifest.run_id != first.run_id:
            return locator

        def route_then_swap(key, ctx=None):
            # the read has taken its snapshot reference; a refresh lands before it touches the shard
            if armed[0] and not swapped:
                swapped.append(True)
                build_snapshot(file_root, [(i, b"new") for i in range(20)], num_dbs=3,
                               published_at=first.published_at + timedelta(seconds=1))
                assert reader.refresh() is True
            return locator.locate(key, ctx)

        # no inlined integer grouping: multi_get's would bypass the hook
        return KeyLocator(route_then_swap, None, locator.cel_router)

    monkeypatch.setattr(KeyLocator, "for_manifest", staticmethod(locator_that_refreshes))
    with ShardedReader(file_root) as reader:
        if warm:
            assert reader.multi_get(list(range(20))) == [b"old"] * 20
        armed[0] = True
        if call == "get":
            assert reader.get(5) == b"new"
        else:
            assert reader.multi_get([5, 6, 99]) == [b"new", b"new", None]
        assert swapped and reader.run_id != first.run_id


@pytest.mark.parametrize("call", ["get", "multi_get"])
@pytest.mark.parametrize("where", ["download", "verify", "download-of-deleted-objects"])
def test_a_cold_read_racing_refresh_retries_on_the_new_snapshot(file_root, monkeypatch, where, call):
    first = build_snapshot(file_root, [(i, b"old") for i in range(20)], num_dbs=2)
    with ShardedReader(file_root) as reader:
        old_cache = os.path.join(reader.cache_dir, f"run_id={first.run_id}")
        downloads = _count_downloads(monkeypatch)
        entered, release = _stall_first_fetch(monkeypatch, where.split("-")[0])
        try:
            read, results, errors = _in_thread(lambda: reader.get(5) if call == "get" else reader.multi_get([5, 6, 99]))
            assert entered.wait(30)  # the read is inside the old run's download of a cold shard
            build_snapshot(file_root, [(i, b"new") for i in range(20)], num_dbs=3,
                           published_at=first.published_at + timedelta(seconds=1))
            swap, swapped, swap_errors = _in_thread(reader.refresh)
            swap.join(timeout=30)
            assert swapped == [True] and not swap_errors  # refresh does not wait for the stalled download
            assert os.path.isdir(old_cache)  # nor does it delete files that download is writing
            if where == "download-of-deleted-objects":  # the old run is garbage-collected upstream meanwhile
                store = open_store(file_root)
                store.delete_many([f"{store.key_of(s.db_url)}/{f.name}" for s in first.manifest.shards for f in s.files])
        finally:
            release.set()
        read.join(timeout=30)
        assert not read.is_alive() and not errors, errors
        assert results == ([b"new"] if call == "get" else [[b"new", b"new", None]])
        assert sum(n for key, n in downloads.items() if first.run_id in key) == 1  # abandoned after the held file
        assert not os.path.exists(old_cache)  # dropped once the abandoned download let go of it
        assert _open_files_under(old_cache) == []
        assert reader.get(5) == b"new" and reader.multi_get(list(range(20))) == [b"new"] * 20


@pytest.mark.parametrize("where", ["download", "verify"])
def test_a_cold_read_racing_close_says_the_reader_is_closed(file_root, monkeypatch, where):
    build_snapshot(file_root, [(i, b"v") for i in range(20)], num_dbs=2)
    reader = ShardedReader(file_root)
    cache = reader.cache_dir
    entered, release = _stall_first_fetch(monkeypatch, where)
    try:
        read, results, errors = _in_thread(lambda: reader.get(5))
        assert entered.wait(30)
        closing, _, close_errors = _in_thread(reader.close)
        closing.join(timeout=30)
        assert not closing.is_alive() and not close_errors
    finally:
        release.set()
    read.join(timeout=30)
    assert not read.is_alive() and not results
    assert len(errors) == 1 and isinstance(errors[0], ReaderError) and "closed" in str(errors[0]), errors
    assert not os.path.exists(cache)  # removed once the abandoned download let go, not re-created by it
    assert _open_files_under(cache) == []


# ---- integrity --------------------------------------------------------------------------------


@pytest.mark.parametrize("shard_layout", ["db", "sst"])
@pytest.mark.parametrize("change", ["same-size", "truncated"])
def test_checksum_mismatch_raises_and_the_file_is_never_used(any_root, change, shard_layout):
    root, opts = any_root
    rows = [(i, _value(i)) for i in range(300)]
    built = build_snapshot(root, rows, num_dbs=3, storage_options=opts, shard_layout=shard_layout)
    store = open_store(root, opts)
    shard = built.manifest.shards[0]
    sst = next(f for f in shard.files if f.name.endswith(".sst"))
    key = f"{store.key_of(shard.db_url)}/{sst.name}"
    data = store.get(key).data
    tampered = data[:-1] + bytes([data[-1] ^ 0xFF]) if change == "same-size" else data[:-10]
    store.put(key, tampered, content_type="application/octet-stream")
    in_bad = [k for k, _ in rows if route_key(k, 3) == shard.db_id]
    elsewhere = [k for k, _ in rows if route_key(k, 3) != shard.db_id]
    with ShardedReader(root, storage_options=opts) as reader:
        with pytest.raises(ChecksumMismatchError, match=sst.name):
            reader.get(in_bad[0])
        leftovers = [p for p in _files_under(reader.cache_dir) if f"db={shard.db_id:05d}" in p]
        assert leftovers == []  # neither the bad file nor a half-built shard remains
        with pytest.raises(ChecksumMismatchError):
            reader.multi_get(in_bad[:3])
        assert reader.get(elsewhere[0]) == _value(elsewhere[0])
        store.put(key, data, content_type="application/octet-stream")  # repaired upstream
        assert reader.get(in_bad[0]) == _value(in_bad[0])


def test_tampered_db_url_is_refused(file_root, tmp_path):
    built = build_snapshot(file_root, [(i, b"x") for i in range(20)], num_dbs=2)
    other = build_snapshot(file_root, [(i, b"evil") for i in range(20)], num_dbs=2, publish=False)
    store = open_store(file_root)
    later = built.published_at + timedelta(seconds=5)

    # 1. db_url points at another run's shards under the same root
    pairs = zip(built.manifest.shards, other.manifest.shards, strict=False)
    shards = tuple(dataclasses.replace(s, db_url=o.db_url) for s, o in pairs)
    forged = dataclasses.replace(built.manifest, shards=shards)
    _publish_manifest_bytes(file_root, None, built.run_id, forged.to_bytes(), later)
    with pytest.raises(ManifestValidationError, match="db_url"):
        ShardedReader(file_root)

    # 2. output_uri and db_urls both moved elsewhere: consistent in itself, but not this root's
    elsewhere = f"file://{tmp_path}/elsewhere"
    moved = dataclasses.replace(
        built.manifest, output_uri=elsewhere,
        shards=tuple(dataclasses.replace(s, db_url=s.db_url.replace(store.root, elsewhere)) for s in built.manifest.shards),
    )
    moved.validate()  # the model alone accepts it
    _publish_manifest_bytes(file_root, None, built.run_id, moved.to_bytes(), later + timedelta(seconds=1))
    with pytest.raises(ManifestValidationError, match="not under this snapshot"):
        ShardedReader(file_root)

    # 3. a shard filed under another db id
    swapped = dataclasses.replace(built.manifest, shards=tuple(
        dataclasses.replace(s, db_url=t.db_url) for s, t in zip(built.manifest.shards, built.manifest.shards[::-1], strict=False)
    ))
    _publish_manifest_bytes(file_root, None, built.run_id, swapped.to_bytes(), later + timedelta(seconds=2))
    with pytest.raises(ManifestValidationError, match="db="):
        ShardedReader(file_root)


def test_current_naming_a_foreign_manifest_is_refused(file_root, tmp_path):
    build_snapshot(file_root, [(1, b"x")], num_dbs=1)
    elsewhere = build_snapshot(f"file://{tmp_path}/other", [(1, b"evil")], num_dbs=1)
    store = open_store(file_root)
    pointer = CurrentPointer(manifest_ref=elsewhere.manifest_ref, run_id=elsewhere.run_id, updated_at=layout.utc_now())
    store.put(layout.CURRENT_KEY, pointer.to_bytes())
    with pytest.raises(ManifestValidationError, match="outside the output root"):
        ShardedReader(file_root)


def test_no_snapshot_published(file_root):
    with pytest.raises(ReaderError, match="no snapshot is published"):
        ShardedReader(file_root)


# ---- concurrency and caching ------------------------------------------------------------------


@pytest.mark.parametrize("shard_layout", ["db", "sst"])
def test_concurrent_first_use_downloads_a_shard_once(any_root, shard_layout, monkeypatch):
    root, opts = any_root
    rows = [(i, _value(i)) for i in range(500)]
    built = build_snapshot(root, rows, num_dbs=4, storage_options=opts, shard_layout=shard_layout, ssts_per_shard=2)
    target = built.manifest.shards[1].db_id
    keys = [k for k, _ in rows if route_key(k, 4) == target]
    with ShardedReader(root, storage_options=opts) as reader:
        downloads = _count_downloads(monkeypatch)
        barrier = threading.Barrier(12)
        results: list[object] = []
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                barrier.wait()
                if n % 2:
                    results.append(reader.get(keys[n]) == _value(keys[n]))
                else:
                    results.append(reader.multi_get(keys[n:n + 5]) == [_value(k) for k in keys[n:n + 5]])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert results == [True] * 12
        files = built.manifest.shard(target).files
        assert len(downloads) == len(files) and set(downloads.values()) == {1}
        assert _cached_shards(reader) == {target}


def _warm_shared_cache(any_root, tmp_path, shard_layout="db"):
    """A 2-shard snapshot read once through a caller-owned ``cache_dir`` (every shard cached)."""
    root, opts = any_root
    rows = [(i, _value(i)) for i in range(100)]
    built = build_snapshot(root, rows, num_dbs=2, storage_options=opts, shard_layout=shard_layout)
    cache = tmp_path / "cache"
    with ShardedReader(root, storage_options=opts, cache_dir=cache) as first:
        assert first.multi_get([k for k, _ in rows]) == [v for _, v in rows]
    return root, opts, rows, built, cache


@pytest.mark.parametrize("shard_layout", ["db", "sst"])
def test_shared_cache_dir_is_reused_and_kept(any_root, tmp_path, shard_layout, monkeypatch):
    root, opts, rows, built, cache = _warm_shared_cache(any_root, tmp_path, shard_layout)
    assert _files_under(str(cache))  # a caller's cache_dir outlives the reader
    with ShardedReader(root, storage_options=opts, cache_dir=cache) as second:
        downloads = _count_downloads(monkeypatch)
        assert second.multi_get([k for k, _ in rows]) == [v for _, v in rows]
        assert not downloads
    # a copy that no longer matches the manifest (here: a file shrank) is downloaded again
    shard_dir = layout.local_cache_dir(str(cache), built.run_id, 0)
    victim = next(p for p in _files_under(shard_dir) if p.endswith(".sst"))
    with open(victim, "r+b") as fh:
        fh.truncate(10)
    with ShardedReader(root, storage_options=opts, cache_dir=cache) as third:
        downloads = _count_downloads(monkeypatch)
        assert third.multi_get([k for k, _ in rows]) == [v for _, v in rows]
        assert len(downloads) == len(third.manifest.shard(0).files)


@pytest.mark.parametrize("shard_layout", ["db", "sst"])
def test_a_corrupt_cached_copy_of_the_same_size_is_downloaded_again(any_root, tmp_path, shard_layout, monkeypatch):
    root, opts, rows, built, cache = _warm_shared_cache(any_root, tmp_path, shard_layout)
    shard_dir = layout.local_cache_dir(str(cache), built.run_id, 0)
    victim = next(p for p in _files_under(shard_dir) if p.endswith(".sst"))
    size = os.path.getsize(victim)
    with open(victim, "r+b") as fh:  # bit rot: same size, marker still matches
        fh.seek(size // 2)
        byte = fh.read(1)
        fh.seek(size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert os.path.getsize(victim) == size
    with ShardedReader(root, storage_options=opts, cache_dir=cache) as second:
        downloads = _count_downloads(monkeypatch)
        assert second.multi_get([k for k, _ in rows]) == [v for _, v in rows]
        shard0 = {f"{open_store(root, opts).key_of(second.manifest.shard(0).db_url)}/{f.name}"
                  for f in second.manifest.shard(0).files}
        assert set(downloads) == shard0 and set(downloads.values()) == {1}  # only the bad shard, once


def test_a_cached_copy_is_checksummed_on_every_reuse(file_root, tmp_path, monkeypatch):
    rows = [(i, _value(i)) for i in range(100)]
    built = build_snapshot(file_root, rows, num_dbs=2)
    cache = tmp_path / "cache"
    checked: list[str] = []
    original = local_copy.verify_file

    def counting(path, size, checksum, *, source):
        checked.append(path)
        original(path, size, checksum, source=source)

    _patch_verify(monkeypatch, counting)
    num_files = sum(len(s.files) for s in built.manifest.shards)
    keys = [k for k, _ in rows]
    with ShardedReader(file_root, cache_dir=cache) as first:  # downloads: each file checked as it arrives
        assert first.multi_get(keys) == [v for _, v in rows]
    assert len(checked) == num_files
    del checked[:]
    with ShardedReader(file_root, cache_dir=cache) as second:  # reuses the cache: checked again, no download
        downloads = _count_downloads(monkeypatch)
        assert second.multi_get(keys) == [v for _, v in rows]
        assert not downloads
    assert len(checked) == num_files and all(p.startswith(str(cache) + os.sep) for p in checked)


# ---- shards shipped as SST files only ("sst" layout) ---------------------------------------------


def test_sst_layout_shards_are_ingested_into_a_local_database(any_root, monkeypatch):
    root, opts = any_root
    rows = [(i * 3, _value(i)) for i in range(900)]
    # Three interleaved runs per shard: overlapping key ranges, ingested one after another.
    built = build_snapshot(root, rows, num_dbs=4, storage_options=opts, shard_layout="sst", ssts_per_shard=3)
    assert built.manifest.shard_layout == "sst"
    assert all([f.name for f in s.files] == ["run-00000.sst", "run-00001.sst", "run-00002.sst"]
               for s in built.manifest.shards)
    with ShardedReader(root, storage_options=opts) as reader:
        downloads = _count_downloads(monkeypatch)
        assert reader.multi_get([k for k, _ in rows]) == [v for _, v in rows]
        assert [reader.get(k) for k in (1, 2, 2700, 10**9)] == [None] * 4
        assert reader.get(rows[7][0]) == rows[7][1]
        assert sum(downloads.values()) == sum(len(s.files) for s in built.manifest.shards) == 12
        for shard in built.manifest.shards:
            folder = layout.local_cache_dir(reader.cache_dir, built.run_id, shard.db_id)
            names = os.listdir(folder)
            assert "CURRENT" in names and local_copy.INCOMING not in names
            assert not any(n.startswith("run-") for n in names)  # moved into the database, not copied
            marker = json.loads(Path(folder, local_copy.MARKER).read_text())
            recorded = {f["name"] for f in marker["local_files"]}
            assert "CURRENT" in recorded and sum(n.endswith(".sst") for n in recorded) == 3
            assert marker["files"] == [f.to_dict() for f in shard.files]


def test_sst_layout_cached_database_is_checksummed_on_every_reuse(file_root, tmp_path, monkeypatch):
    rows = [(i, _value(i)) for i in range(100)]
    built = build_snapshot(file_root, rows, num_dbs=2, shard_layout="sst")
    cache = tmp_path / "cache"
    keys = [k for k, _ in rows]
    with ShardedReader(file_root, cache_dir=cache) as first:
        assert first.multi_get(keys) == [v for _, v in rows]
    recorded: set[str] = set()
    for shard in built.manifest.shards:
        folder = layout.local_cache_dir(str(cache), built.run_id, shard.db_id)
        marker = json.loads(Path(folder, local_copy.MARKER).read_text())
        recorded.update({os.path.join(folder, f["name"]) for f in marker["local_files"]})
    checked: list[str] = []
    original = local_copy.verify_file

    def counting(path, size, checksum, *, source):
        checked.append(path)
        original(path, size, checksum, source=source)

    _patch_verify(monkeypatch, counting)
    with ShardedReader(file_root, cache_dir=cache) as second:  # every file the database reads, checked again
        downloads = _count_downloads(monkeypatch)
        assert second.multi_get(keys) == [v for _, v in rows]
        assert not downloads
    assert set(checked) == recorded and len(checked) == len(recorded)
    # RocksDB's own metadata is covered too: a changed CURRENT means a fresh download
    current = Path(layout.local_cache_dir(str(cache), built.run_id, 1), "CURRENT")
    current.write_text(current.read_text().replace("MANIFEST", "MANIFESX"))
    with ShardedReader(file_root, cache_dir=cache) as third:
        downloads = _count_downloads(monkeypatch)
        assert third.multi_get(keys) == [v for _, v in rows]
        shard1 = {f"{open_store(file_root).key_of(third.manifest.shard(1).db_url)}/{f.name}"
                  for f in third.manifest.shard(1).files}
        assert set(downloads) == shard1


def test_a_db_layout_cache_is_not_taken_for_an_sst_layout_shard(file_root, tmp_path, monkeypatch):
    """Same run id and db_url, different layout: the marker tells them apart and the shard is rebuilt."""
    rows = [(i, _value(i)) for i in range(60)]
    built = build_snapshot(file_root, rows, num_dbs=1, shard_layout="sst")
    cache = tmp_path / "cache"
    folder = Path(layout.local_cache_dir(str(cache), built.run_id, 0))
    folder.mkdir(parents=True)
    shard = built.manifest.shards[0]
    forged = json.dumps({"db_url": shard.db_url, "files": [f.to_dict() for f in shard.files]}, sort_keys=True)
    (folder / local_copy.MARKER).write_text(forged)  # what a "db" layout download would have left
    with ShardedReader(file_root, cache_dir=cache) as reader:
        downloads = _count_downloads(monkeypatch)
        assert reader.multi_get([k for k, _ in rows]) == [v for _, v in rows]
        assert len(downloads) == len(shard.files)


def test_an_unknown_shard_layout_is_refused(file_root):
    built = build_snapshot(file_root, [(1, b"x")], num_dbs=1, shard_layout="sst", publish=False)
    future = dataclasses.replace(built.manifest, storage_engine=dict(built.manifest.storage_engine, shard_layout="lsm2"))
    _publish_manifest_bytes(file_root, None, built.run_id, future.to_bytes(), built.published_at)
    with pytest.raises(ManifestValidationError, match="shard_layout 'lsm2' is unknown"):
        ShardedReader(file_root)


def test_close_releases_everything(file_root):
    build_snapshot(file_root, [(1, b"one")], num_dbs=1)
    reader = ShardedReader(file_root)
    assert reader.get(1) == b"one"
    cache = reader.cache_dir
    assert os.path.isdir(cache) and _open_files_under(cache)
    reader.close()
    assert _open_files_under(cache) == []
    reader.close()  # idempotent
    assert not os.path.exists(cache)
    for call in (lambda: reader.get(1), lambda: reader.multi_get([1]), lambda: reader.manifest, reader.refresh):
        with pytest.raises(ReaderError, match="closed"):
            call()



def test_max_open_shards_bounds_open_files_and_reopens_without_downloading(file_root, monkeypatch):
    rows = {i: _value(i) for i in range(80)}
    build_snapshot(file_root, rows.items(), num_dbs=8, shard_layout="sst")
    with ShardedReader(file_root, max_open_shards=3) as reader:
        downloads = _count_downloads(monkeypatch)
        assert {k: reader.get(k) for k in rows} == rows
        assert reader.multi_get(list(rows)) == list(rows.values())
        assert len(reader.describe().open_shards) == 3
        assert len(_open_files_under(reader.cache_dir)) == 3  # one SST per shard here
        assert max(downloads.values()) == 1 and len(downloads) == 8  # a reopen reads the cache
        checked: list[str] = []
        _patch_verify(monkeypatch, lambda path, *a, **kw: checked.append(path))
        assert [reader.get(k) for k in range(10)] == [rows[k] for k in range(10)]
        assert checked == []  # nor hashes the copy it verified itself again
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ReaderError, match="max_open_shards"):
            ShardedReader(file_root, max_open_shards=bad)  # type: ignore[arg-type]
        with pytest.raises(ReaderError, match="max_open_files"):
            ShardedReader(file_root, max_open_files=bad)  # type: ignore[arg-type]


# ---- CEL routing ------------------------------------------------------------------------------


def test_cel_categorical_routes_from_the_key(any_root):
    root, opts = any_root
    expr = 'user.startsWith("eu-") ? "eu" : (user.startsWith("us-") ? "us" : "apac")'
    rows = [(f"{region}-{i}", f"{region}:{i}".encode()) for region in ("eu", "us", "jp") for i in range(30)]
    build_snapshot(root, rows, num_dbs=3, storage_options=opts, key_column="user", cel_expr=expr,
                   cel_columns={"user": "string"}, routing_values=("apac", "eu", "us"))
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.manifest.sharding.cel_mode == "categorical"
        assert [reader.shard_for_token(t) for t in ("apac", "eu", "us")] == [0, 1, 2]
        with pytest.raises(ShardAssignmentError, match="'mars'"):
            reader.shard_for_token("mars")
        for key, value in rows:
            assert reader.get(key) == value
        assert reader.shard_for_key("eu-3") == 1 and reader.shard_for_key("jp-3") == 0
        assert reader.multi_get(["us-1", "eu-999", "jp-2"]) == [b"us:1", None, b"jp:2"]


def test_cel_over_several_columns_needs_routing_context(file_root):
    region_of = {i: ("eu" if i % 3 else "us") for i in range(60)}
    build_snapshot(file_root, [(i, b"v%d" % i) for i in region_of], num_dbs=2, key_column="id",
                   cel_expr='region == "eu" ? 0 : 1', cel_columns={"id": "int", "region": "string"},
                   routing_context=lambda k: {"region": region_of[k]})
    with ShardedReader(file_root) as reader:
        with pytest.raises(ShardyfusionError, match="routing_context"):
            reader.get(1)
        with pytest.raises(ReaderError, match=r"\['region'\]"):
            reader.get(1, routing_context={"other": 1})
        with pytest.raises(ReaderError, match="shard_for_token"):
            reader.shard_for_token("eu")
        for key, region in region_of.items():
            assert reader.get(key, routing_context={"region": region}) == b"v%d" % key
        eu = [k for k, r in region_of.items() if r == "eu"]
        assert reader.multi_get(eu, routing_context={"region": "eu"}) == [b"v%d" % k for k in eu]
        keys = list(region_of)
        assert reader.multi_get(keys, routing_context=[{"region": region_of[k]} for k in keys]) == [b"v%d" % k for k in keys]
        with pytest.raises(ReaderError, match="one per key"):
            reader.multi_get(keys, routing_context=[{"region": "eu"}])


def test_cel_direct_mode_from_the_key(file_root):
    build_snapshot(file_root, [(i, b"%d" % i) for i in range(40)], num_dbs=4, key_column="id",
                   cel_expr="id % 4", cel_columns={"id": "int"})
    with ShardedReader(file_root) as reader:
        assert reader.multi_get(list(range(45))) == [b"%d" % i for i in range(40)] + [None] * 5
        assert reader.shard_for_key(13) == 1


# ---- routing fast path agrees with the contract -----------------------------------------------


def _reference(key, num_dbs, enc):
    try:
        stored = encode_key(key, enc, column="k")
        return route_key(key, num_dbs), stored
    except ShardyfusionError as exc:
        return type(exc)


def _fast(key, num_dbs, enc):
    try:
        return hash_locator(num_dbs, enc, "k")(key, None)
    except ShardyfusionError as exc:
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(
    key=st.one_of(st.integers(min_value=-(2**65), max_value=2**65), st.text(), st.binary(), st.booleans()),
    num_dbs=st.integers(min_value=1, max_value=1000),
    enc=st.sampled_from(["u64be", "u32be", "utf8", "raw"]),
)
def test_reader_routing_fast_path_matches_core(key, num_dbs, enc):
    assert _fast(key, num_dbs, enc) == _reference(key, num_dbs, enc)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.one_of(st.integers(min_value=0, max_value=2**63 - 1), st.integers(min_value=0, max_value=2**32))),
    num_dbs=st.integers(min_value=1, max_value=64),
    enc=st.sampled_from(["u64be", "u32be"]),
)
def test_multi_get_integer_grouping_matches_core(keys, num_dbs, enc):
    try:
        expected: dict = {}
        for i, key in enumerate(keys):
            db_id, stored = _reference(key, num_dbs, enc)
            expected.setdefault(db_id, ([], []))
            expected[db_id][0].append(i)
            expected[db_id][1].append(stored)
    except TypeError:  # _reference returned an error type: the grouper must raise it too
        with pytest.raises(ShardyfusionError):
            int_key_grouper(num_dbs, enc, "k")(keys)
        return
    assert int_key_grouper(num_dbs, enc, "k")(keys) == expected


def test_reader_routing_matches_spec_vectors():
    expected = {0: (1, 1, 9), 1: (2, 6, 14), 2: (3, 3, 3), 7: (3, 7, 15), 42: (0, 0, 8), 2**63 - 1: (2, 6, 6)}
    for key, ids in expected.items():
        assert tuple(hash_locator(n, "u64be", "k")(key, None)[0] for n in (4, 8, 16)) == ids
    assert tuple(hash_locator(n, "utf8", "k")("hello", None)[0] for n in (4, 8, 16)) == (1, 5, 13)
    assert tuple(hash_locator(n, "raw", "k")(b"hello", None)[0] for n in (4, 8, 16)) == (1, 5, 13)
    assert [hash_locator(3, "u64be", "k")(k, None)[0] for k in range(10)] == [2, 2, 1, 1, 0, 2, 0, 2, 0, 0]


# ---- packaging --------------------------------------------------------------------------------


def test_public_import_is_lazy():
    code = (
        "import sys, airflow_provider_shardyfusion as p\n"
        "assert 'rocksdict' not in sys.modules, 'package import pulled rocksdict'\n"
        "assert 'airflow_provider_shardyfusion.core.read.reader' not in sys.modules\n"
        "from airflow_provider_shardyfusion import ShardedReader\n"
        "from airflow_provider_shardyfusion.core.read.reader import ShardedReader as R\n"
        "assert ShardedReader is R and 'rocksdict' in sys.modules\n"
        "assert not any(m == 'airflow' or m.startswith(('airflow.', 'pyspark')) for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_numpy_integer_keys_are_read_as_the_int_they_are(tmp_path):
    import numpy as np

    root = f"file://{tmp_path}/snap"
    build_snapshot(root, [(k, f"v{k}".encode()) for k in range(20)], num_dbs=4)
    with ShardedReader(root, cache_dir=tmp_path / "cache") as reader:
        assert reader.get(np.int64(7)) == b"v7" and reader.get(np.uint32(3)) == b"v3"
        assert reader.multi_get([np.int64(1), 2, np.int16(19)]) == [b"v1", b"v2", b"v19"]
    cel_root = f"file://{tmp_path}/cel"
    build_snapshot(cel_root, [(i, b"%d" % i) for i in range(40)], num_dbs=4, key_column="id",
                   cel_expr="id % 4", cel_columns={"id": "int"})
    with ShardedReader(cel_root, cache_dir=tmp_path / "cel-cache") as reader:
        assert reader.get(np.int64(13)) == b"13" and reader.shard_for_key(np.int32(13)) == 1
        assert reader.multi_get([np.int64(38), np.uint8(2), 41]) == [b"38", b"2", None]


def _typed_rows(n: int) -> list[dict]:
    """``n`` rows of every value kind (test_value_decoding's table), varied per row, some null."""
    rows = []
    for i in range(n):
        row = dict(ROW, i64=i, s=f"row {i}", at=ROW["at"] + timedelta(days=i), tags=[str(i)] * (i % 3),
                   scores=[(f"k{j}", j / 2) for j in range(i % 4)])
        if i % 5 == 0:
            row.update(amount=None, point=None, by_id=None)
        rows.append(row)
    return rows


def test_typed_values_of_both_encoders(any_root):
    """A snapshot whose keys hold bytes of both JSON encoders (as a delta chain may) and whose schema
    gained a nullable column later: typed reads are pyarrow's values, json and raw as stored."""
    import pyarrow as pa

    from airflow_provider_shardyfusion.core.model.encoding import encode_json_value
    from airflow_provider_shardyfusion.core.model.value_schema import VALUE_ENCODING_ENGINE, from_arrow

    root, opts = any_root
    full = SCHEMA.append(pa.field("added", pa.timestamp("us")))
    schema = from_arrow(full, full.names)
    rows = _typed_rows(60)
    table = pa.Table.from_pylist(rows, schema=full)
    stored = {}
    for key, row in enumerate(table.to_pylist()):
        if key % 2:  # a newer layer: the engine's encoder, the added column set on some keys
            row["added"] = datetime(2024, 5, 6, 7, 8, 9) if key % 3 == 0 else None
            stored[key] = encode_v3(row, schema)
        else:  # an older layer: the Python encoder, before the column existed
            del row["added"]
            stored[key] = encode_json_value(row)
    want = expected_rows(pa.Table.from_pylist(
        [{**r, "added": datetime(2024, 5, 6, 7, 8, 9) if k % 2 and k % 3 == 0 else None} for k, r in enumerate(rows)],
        schema=full), schema)
    build_snapshot(root, stored.items(), num_dbs=4, storage_options=opts, value_format="json",
                   value_schema=schema, value_encoding_version=VALUE_ENCODING_ENGINE, encode_value=bytes)
    keys = [*stored, 999]
    with ShardedReader(root, storage_options=opts) as reader:
        assert reader.manifest.value_schema == schema
        for key in stored:
            assert_same(reader.get(key), want[key])
        got = reader.multi_get(keys[::-1])
        assert got[0] is None
        assert_same(got[1:], want[::-1])
    with ShardedReader(root, storage_options=opts, value_decoding="json") as reader:
        assert reader.multi_get(keys) == [json.loads(v) for v in stored.values()] + [None]
    with ShardedReader(root, storage_options=opts, value_decoding="raw") as reader:
        assert reader.multi_get(keys) == [*stored.values(), None]
        assert reader.get(1) == stored[1]


def test_typed_values_of_an_older_manifest_read_as_json(file_root):
    rows = [(i, {"at": f"2024-01-0{1 + i % 9}T00:00:00+00:00", "n": i}) for i in range(20)]
    build_snapshot(file_root, rows, num_dbs=3, value_format="json")  # no value_schema: before SPEC §18
    with ShardedReader(file_root) as reader:
        assert reader.manifest.value_schema is None
        assert reader.multi_get([k for k, _ in rows]) == [v for _, v in rows]


def test_an_undecodable_value_names_key_shard_and_column(file_root):
    from airflow_provider_shardyfusion.core.errors import ConfigError
    from airflow_provider_shardyfusion.core.model.value_schema import ValueField, ValueSchema, ValueType

    schema = ValueSchema((ValueField("amount", ValueType("decimal", precision=10, scale=2)),
                          ValueField("n", ValueType("int64"))))
    stored = {1: b'{"amount":"1.50","n":1}', 2: b'{"amount":"lots","n":2}', 3: b'{"amount":null,"n":3}'}
    build_snapshot(file_root, stored.items(), num_dbs=2, value_format="json", value_schema=schema, encode_value=bytes)
    with ShardedReader(file_root) as reader:
        shard = reader.shard_for_key(2)
        message = rf"the value of key 2 in shard {shard} does not decode: column 'amount' \(decimal\(10,2\)\)"
        for read in (lambda: reader.get(2), lambda: reader.multi_get([1, 2, 3])):
            with pytest.raises(ReaderError, match=message):
                read()
        assert reader.get(1) == {"amount": Decimal("1.50"), "n": 1}
    with pytest.raises(ConfigError, match=r"value_decoding 'text'.*\['typed', 'json', 'raw'\]"):
        ShardedReader(file_root, value_decoding="text")  # type: ignore[arg-type]
