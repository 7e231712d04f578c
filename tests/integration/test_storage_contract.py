"""One contract for every object store back end: local files and S3 (moto server on loopback)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import sys
import tempfile

import pytest

from airflow_provider_shardyfusion.core import layout, scratch
from airflow_provider_shardyfusion.core.errors import ObjectNotFoundError, StorageError
from airflow_provider_shardyfusion.core.storage import ObjectStore, open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore
from airflow_provider_shardyfusion.core.storage.s3 import S3Store


@pytest.fixture
def store(any_root) -> ObjectStore:
    root, options = any_root
    return open_store(root, options)


def keys_of(store, prefix=""):
    return [o.key for o in store.list(prefix)]


def test_backend_matches_scheme(store, any_root):
    root, _ = any_root
    assert store.root == layout.normalize_root(root)
    assert isinstance(store, S3Store if root.startswith("s3://") else LocalStore)


def test_put_get_etag(store):
    etag = store.put("a/obj.json", b'{"x":1}')
    got = store.get("a/obj.json")
    assert got.data == b'{"x":1}'
    assert got.etag == etag and etag
    etag2 = store.put("a/obj.json", b'{"x":2}')
    assert etag2 != etag
    assert store.get("a/obj.json") == type(got)(data=b'{"x":2}', etag=etag2)


def test_get_if_changed_answers_none_while_the_etag_holds(store):
    etag = store.put("_CURRENT", b'{"v":1}')
    assert store.get_if_changed("_CURRENT", None) == store.get("_CURRENT")
    assert store.get_if_changed("_CURRENT", etag) is None
    etag2 = store.put("_CURRENT", b'{"v":2}')
    assert store.get_if_changed("_CURRENT", etag) == type(store.get("_CURRENT"))(data=b'{"v":2}', etag=etag2)
    assert store.get_if_changed("_CURRENT", etag2) is None
    store.delete_many(["_CURRENT"])
    with pytest.raises(ObjectNotFoundError):
        store.get_if_changed("_CURRENT", etag2)


def test_put_binary_and_empty(store):
    payload = bytes(range(256)) * 3
    store.put("bin", payload, content_type="application/octet-stream")
    store.put("empty", b"")
    assert store.get("bin").data == payload
    assert store.get("empty").data == b""
    assert store.head("empty").size == 0


def test_put_if_absent(store):
    assert store.put_if_absent("once.json", b"first") is True
    assert store.put_if_absent("once.json", b"second") is False
    assert store.get("once.json").data == b"first"


def test_put_if_match(store):
    etag = store.put("cas.json", b"v1")
    assert store.put_if_match("cas.json", b"v2", "0" * 32) is None  # wrong etag: nothing written
    assert store.get("cas.json").data == b"v1"
    new = store.put_if_match("cas.json", b"v2", etag)
    assert new and new != etag
    got = store.get("cas.json")
    assert got.data == b"v2" and got.etag == new
    assert store.put_if_match("cas.json", b"v3", etag) is None  # stale etag
    assert store.get("cas.json").data == b"v2"
    assert store.put_if_match("cas.json", b"v3", None) is None  # None means "only if absent"
    assert store.put_if_match("fresh.json", b"f1", None) is not None
    assert store.get("fresh.json").data == b"f1"


def test_put_if_match_on_absent_with_etag(store):
    assert store.put_if_match("nothing-here.json", b"x", "0" * 32) is None
    assert not store.exists("nothing-here.json")
    etag = store.put("deleted.json", b"v1")
    assert store.delete_many(["deleted.json"]) == []
    assert store.put_if_match("deleted.json", b"v2", etag) is None  # deleted in between: changed, not an error
    assert not store.exists("deleted.json")


def test_head_size_and_exists(store):
    store.put("dir/file.bin", b"x" * 1234)
    info = store.head("dir/file.bin")
    assert info is not None and info.key == "dir/file.bin" and info.size == 1234
    assert info.last_modified is not None
    assert store.exists("dir/file.bin")
    assert store.head("dir/missing.bin") is None and not store.exists("dir/missing.bin")
    assert store.head("dir") is None  # a "folder" is not an object


def test_get_missing(store):
    with pytest.raises(ObjectNotFoundError, match=r"missing\.json") as info:
        store.get("nowhere/missing.json")
    assert isinstance(info.value, StorageError)
    assert store.uri("nowhere/missing.json") in str(info.value)


def test_list_sorted_and_scoped(store):
    keys = ["runs/run_id=b/run.json", "runs/run_id=a/run.json", "runs/run_id=a/x/y/z.json", "runsx/other.json",
            "manifests/m.json", "_CURRENT", "runs/run_id=ab/run.json"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * (i + 1))
    assert keys_of(store) == sorted(keys)
    assert keys_of(store, "runs/") == ["runs/run_id=a/run.json", "runs/run_id=a/x/y/z.json",
                                       "runs/run_id=ab/run.json", "runs/run_id=b/run.json"]
    assert keys_of(store, "runs/run_id=a/") == ["runs/run_id=a/run.json", "runs/run_id=a/x/y/z.json"]
    assert keys_of(store, "runs/run_id=a") == ["runs/run_id=a/run.json", "runs/run_id=a/x/y/z.json",
                                               "runs/run_id=ab/run.json"]
    assert keys_of(store, "runs") == sorted(k for k in keys if k.startswith("runs"))
    assert keys_of(store, "nothing/") == []
    sizes = {o.key: o.size for o in store.list()}
    assert sizes == {k: i + 1 for i, k in enumerate(keys)}


def test_list_many_objects(store):
    keys = [f"shards/run_id=r/db={i:05d}/attempt=00/f.sst" for i in range(30)]
    for k in reversed(keys):
        store.put(k, b"d")
    assert keys_of(store, "shards/run_id=r/") == keys


def test_delete_many(store):
    for key in ("d/1", "d/2", "d/sub/3", "keep/4"):
        store.put(key, key.encode())
    failures = store.delete_many(["d/1", "d/sub/3", "d/absent", "never/there/at/all"])
    assert failures == []
    assert keys_of(store) == ["d/2", "keep/4"]
    assert store.get("d/2").data == b"d/2"
    assert store.delete_many([]) == []
    assert store.delete_many(["d/2", "keep/4"]) == []
    assert keys_of(store) == []


BAD_KEYS = ("../outside.json", "..", "a/../../b", "/abs/path", "a/./b", ".", "", "nul\x00byte")


def test_bad_keys_are_refused_by_every_operation(store, any_root, tmp_path_factory):
    root, options = any_root
    parent = open_store(root.rsplit("/", 1)[0], options)  # the folder (or bucket) holding the store's root
    tmp_path = tmp_path_factory.mktemp("local-files")  # outside ``parent``, which must stay empty
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    operations = {
        "put": lambda k: store.put(k, b"x"),
        "put_if_match": lambda k: store.put_if_match(k, b"x", None),
        "get": store.get,
        "head": store.head,
        "exists": store.exists,
        "upload_file": lambda k: store.upload_file(str(src), k),
        "download_file": lambda k: store.download_file(k, str(tmp_path / "out")),
    }
    for key in BAD_KEYS:
        for name, call in operations.items():
            with pytest.raises(StorageError, match=re.escape(repr(key))) as info:
                call(key)
            assert not isinstance(info.value, ObjectNotFoundError), (name, key)
    assert keys_of(parent) == []  # nothing written, inside the root or beside it
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("prefix", ["../", "..", "a/../", "a/..", "../snap/", "/", "/abs", "./", "a/./b", "x\x00"])
def test_list_refuses_prefixes_escaping_the_root(store, any_root, prefix):
    root, options = any_root
    open_store(root.rsplit("/", 1)[0], options).put("outside.json", b"beside the root")
    store.put("inside.json", b"in")
    with pytest.raises(StorageError, match=re.escape(repr(prefix))):
        store.list(prefix)  # at the call, before any iteration
    assert keys_of(store) == ["inside.json"]
    assert keys_of(store, "inside") == ["inside.json"]


def test_delete_many_reports_bad_keys_and_deletes_the_rest(store):
    for key in ("d/1", "d/2", "keep/3"):
        store.put(key, key.encode())
    failures = store.delete_many(["d/1", *BAD_KEYS, "keep", "d/absent", "d/2"])
    assert [key for key, _ in failures] == list(BAD_KEYS)  # reported, in order, instead of raised
    for key, error in failures:
        assert repr(key) in error
    assert keys_of(store) == ["keep/3"]  # "keep" names a folder, not an object: absent, nothing deleted
    [(key, error)] = store.delete_many([123])  # type: ignore[list-item]
    assert key == 123 and "must be a string" in error


def test_upload_download_round_trip(store, tmp_path):
    data = os.urandom(5 * 1024 * 1024 + 123)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store.upload_file(str(src), "shards/run_id=r/db=00001/attempt=00/000001.sst")
    assert store.head("shards/run_id=r/db=00001/attempt=00/000001.sst").size == len(data)
    dest = tmp_path / "out" / "nested" / "dest.bin"
    store.download_file("shards/run_id=r/db=00001/attempt=00/000001.sst", str(dest))
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert store.get("shards/run_id=r/db=00001/attempt=00/000001.sst").data == data


def test_download_missing(store, tmp_path):
    with pytest.raises(ObjectNotFoundError, match=re.escape(store.uri("no/such/file"))):
        store.download_file("no/such/file", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_download_into_a_folder_is_a_storage_error(store, tmp_path):
    store.put("obj.bin", b"data")
    with pytest.raises(StorageError, match=re.escape(store.uri("obj.bin"))) as info:
        store.download_file("obj.bin", str(tmp_path))  # the local path is a folder: not writable as a file
    assert not isinstance(info.value, ObjectNotFoundError)  # the object is there; the local side failed
    assert "download" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


def test_upload_of_a_missing_local_file(store, tmp_path):
    missing = tmp_path / "never-written.bin"
    with pytest.raises(StorageError, match=re.escape(store.uri("up/obj.bin"))) as info:
        store.upload_file(str(missing), "up/obj.bin")
    assert not isinstance(info.value, ObjectNotFoundError)  # the local source is missing, not an object
    assert "upload" in str(info.value) and str(missing) in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert not store.exists("up/obj.bin")
    assert keys_of(store) == []


def test_a_folder_is_not_an_object(store, tmp_path):
    store.put("dir/file.json", b"x")
    with pytest.raises(ObjectNotFoundError, match=re.escape(store.uri("dir"))):
        store.get("dir")
    with pytest.raises(ObjectNotFoundError, match=re.escape(store.uri("dir"))):
        store.download_file("dir", str(tmp_path / "dir-copy"))
    assert not (tmp_path / "dir-copy").exists()
    assert store.head("dir") is None and not store.exists("dir")
    with pytest.raises(ObjectNotFoundError):
        store.get("dir/file.json/below")  # a path through an object
    assert store.head("dir/file.json/below") is None


def test_head_etag_is_the_get_etag(store, tmp_path):
    etag = store.put("e/obj.json", b'{"v":1}')
    info = store.head("e/obj.json")
    assert info.etag == store.get("e/obj.json").etag == etag
    # A conditional put may take its etag from head instead of reading the whole object.
    new = store.put_if_match("e/obj.json", b'{"v":2}', info.etag)
    assert new is not None and store.head("e/obj.json").etag == store.get("e/obj.json").etag == new
    assert store.put_if_match("e/obj.json", b'{"v":3}', info.etag) is None  # stale head etag
    store.put("e/empty", b"")
    assert store.head("e/empty").etag == store.get("e/empty").etag
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(300_000))
    store.upload_file(str(src), "e/up.bin")
    assert store.head("e/up.bin").etag == store.get("e/up.bin").etag


def test_deeply_nested_keys(store):
    key = "a/b/c/d/e/f/g/h/i/j/leaf.json"
    store.put(key, b"deep")
    assert store.get(key).data == b"deep"
    assert keys_of(store, "a/b/c/") == [key]
    assert store.head(key).size == 4
    assert store.delete_many([key]) == []
    assert keys_of(store, "a/") == []


def test_uri_and_key_of(store):
    uri = store.uri("manifests/x/manifest.json")
    assert uri == store.root + "/manifests/x/manifest.json"
    assert store.key_of(uri) == "manifests/x/manifest.json"


def test_stores_on_same_root_see_each_other(any_root):
    root, options = any_root
    first, second = open_store(root, options), open_store(root, options)
    first.put("shared.json", b"1")
    assert second.get("shared.json").data == b"1"
    sub = open_store(root + "/sub", options)
    sub.put("inner.json", b"2")
    assert keys_of(first, "sub/") == ["sub/inner.json"]
    assert keys_of(sub) == ["inner.json"]
    with pytest.raises(ObjectNotFoundError):
        sub.get("shared.json")  # a store sees only its own root


# ---- local store specifics ------------------------------------------------------------------


def test_local_writes_are_atomic_and_leave_no_temp_files(file_root, tmp_path):
    store = open_store(file_root)
    base = layout.local_path_of(store.root)
    src = tmp_path / "blob"
    src.write_bytes(b"b" * 1000)
    for i in range(5):
        store.put("x/obj.json", f"{i}".encode() * 100)
        store.put_if_match("x/cas.json", b"c", None if i == 0 else store.get("x/cas.json").etag)
    store.upload_file(str(src), "x/up.bin")
    leftovers = [name for _, _, files in os.walk(base) for name in files if name.startswith(".tmp-")]
    assert leftovers == []
    assert sorted(os.listdir(os.path.join(base, "x"))) == ["cas.json", "obj.json", "up.bin"]
    assert store.get("x/obj.json").data == b"4" * 100


def test_local_list_ignores_temp_files(file_root):
    store = open_store(file_root)
    store.put("d/real.json", b"r")
    base = layout.local_path_of(store.root)
    with open(os.path.join(base, "d", ".tmp-abc123"), "wb") as fh:  # a writer that died mid-write
        fh.write(b"partial")
    assert keys_of(store) == ["d/real.json"]
    assert keys_of(store, "d/") == ["d/real.json"]


def test_local_failed_write_keeps_old_object(file_root):
    store = open_store(file_root)
    store.put("k.json", b"old")

    with pytest.raises(TypeError):
        store.put("k.json", object())  # type: ignore[arg-type]  # fails inside the write
    assert store.get("k.json").data == b"old"
    base = layout.local_path_of(store.root)
    assert [n for n in os.listdir(base) if n.startswith(".tmp-")] == []


def test_local_os_failures_are_storage_errors(file_root, tmp_path):
    store = open_store(file_root)
    store.put("f", b"a file")
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    # "f/g" needs a folder where a file is: S3 would accept it, a filesystem cannot.
    for what, call in {
        "put": lambda: store.put("f/g", b"x"),
        "conditional put": lambda: store.put_if_match("f/g", b"x", None),
        "upload": lambda: store.upload_file(str(src), "f/g"),
    }.items():
        with pytest.raises(StorageError, match=re.escape(f"local {what} of {store.uri('f/g')} failed")) as info:
            call()
        assert not isinstance(info.value, ObjectNotFoundError)
        assert isinstance(info.value.__cause__, OSError)
    assert keys_of(store) == ["f"]

    base = layout.local_path_of(store.root)
    os.symlink("loop", os.path.join(base, "loop"))  # unreadable for root too: ELOOP
    for what, call in {
        "get": lambda: store.get("loop"),
        "head": lambda: store.head("loop"),
        "exists": lambda: store.exists("loop"),
        "download": lambda: store.download_file("loop", str(tmp_path / "out")),
        "list": lambda: store.list(),
    }.items():
        with pytest.raises(StorageError) as info:
            call()
        assert f"local {what} of " in str(info.value)
        assert not isinstance(info.value, ObjectNotFoundError)
        assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ELOOP
    assert store.delete_many(["loop"]) == []  # unlinks the link itself
    assert keys_of(store) == ["f"]


def test_local_list_reports_unreadable_folders(file_root, monkeypatch):
    store = open_store(file_root)
    store.put("a/1", b"1")
    store.put("b/2", b"2")
    unreadable = os.path.join(layout.local_path_of(store.root), "b")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == unreadable:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)  # chmod cannot stop root, which runs these tests in CI
    with pytest.raises(StorageError, match="local list of ") as info:
        store.list("")  # silently leaving out b/2 would let a clean-up believe it deleted everything
    assert isinstance(info.value.__cause__, PermissionError)
    assert keys_of(store, "a/") == ["a/1"]


def test_local_delete_prunes_empty_folders(file_root):
    store = open_store(file_root)
    store.put("shards/run_id=r/db=00000/attempt=00/f1", b"1")
    store.put("shards/run_id=r/db=00001/attempt=00/f2", b"2")
    assert store.delete_many(["shards/run_id=r/db=00000/attempt=00/f1"]) == []
    base = layout.local_path_of(store.root)
    assert not os.path.exists(os.path.join(base, "shards/run_id=r/db=00000"))
    assert os.path.exists(os.path.join(base, "shards/run_id=r/db=00001/attempt=00/f2"))
    assert os.path.isdir(base)


def test_uploaded_object_outlives_and_ignores_its_source(store, tmp_path):
    """The local store may hard-link an upload: the object must not change or vanish with its source."""
    src = tmp_path / "src.bin"
    src.write_bytes(b"first version")
    store.upload_file(str(src), "up/obj.bin")
    src.unlink()
    src.write_bytes(b"a different file at the same path")
    assert store.get("up/obj.bin").data == b"first version"


# ---- conditional writes whose response was lost -------------------------------------------------


def test_conditional_put_that_finds_its_own_bytes_is_a_success(store):
    """A repeated conditional put (first response lost) meets its own write: success, same etag."""
    assert store.put_if_absent("runs/run_id=r/run.json", b'{"status":"running"}') is True
    # The repeat of that very request: the object is there with exactly our bytes.
    assert store.put_if_absent("runs/run_id=r/run.json", b'{"status":"running"}') is True
    assert store.put_if_absent("runs/run_id=r/run.json", b'{"status":"other writer"}') is False
    first = store.get("runs/run_id=r/run.json")
    assert first.data == b'{"status":"running"}'

    new = store.put_if_match("runs/run_id=r/run.json", b'{"status":"succeeded"}', first.etag)
    assert new is not None
    # Repeating the update with the etag it was based on: the object already holds our bytes.
    assert store.put_if_match("runs/run_id=r/run.json", b'{"status":"succeeded"}', first.etag) == new
    assert store.put_if_match("runs/run_id=r/run.json", b'{"status":"failed"}', first.etag) is None
    assert store.get("runs/run_id=r/run.json") == type(first)(data=b'{"status":"succeeded"}', etag=new)
    # If-Match against an object deleted since: a conflict, never a write.
    assert store.delete_many(["runs/run_id=r/run.json"]) == []
    assert store.put_if_match("runs/run_id=r/run.json", b'{"status":"succeeded"}', new) is None
    assert not store.exists("runs/run_id=r/run.json")


# ---- an unreachable endpoint ----------------------------------------------------------------------


def test_unreachable_s3_endpoint_is_a_storage_error_for_every_operation(tmp_path):
    """Nothing listens on the port: each operation ends in one StorageError naming the endpoint."""
    from airflow_provider_shardyfusion.core.retry import RetryPolicy
    from airflow_provider_shardyfusion.core.storage import StorageOptions
    from tests.processes import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # bound then released: connections are refused
    options = StorageOptions(endpoint_url=endpoint, region_name="us-east-1", addressing_style="path", max_attempts=1)
    store = S3Store("s3://nobody/snap", options, retry=RetryPolicy(attempts=2, base_delay_s=0.01, max_delay_s=0.02))
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    operations = {
        "put": lambda: store.put("k.json", b"x"),
        "conditional put": lambda: store.put_if_match("k.json", b"x", None),
        "get": lambda: store.get("k.json"),
        "head": lambda: store.head("k.json"),
        "list": lambda: list(store.list("")),
        "upload": lambda: store.upload_file(str(src), "k.bin"),
        "download": lambda: store.download_file("k.bin", str(tmp_path / "out.bin")),
    }
    for what, call in operations.items():
        with pytest.raises(StorageError) as info:
            call()
        message = str(info.value)
        assert not isinstance(info.value, ObjectNotFoundError), what
        assert f"S3 {what} of s3://nobody/snap/" in message, message
        assert "after 2 attempt(s)" in message and endpoint in message and "unreachable or failing" in message, message
    [(key, error)] = store.delete_many(["k.json"])
    assert key == "k.json" and "S3 delete of" in error and endpoint in error
    assert not (tmp_path / "out.bin").exists()


# ---- async reads (what the deferrable sensors' triggers use) ----------------------------------


def _aread(root: str, options: dict | None, *keys: str) -> list[bytes | None]:
    import asyncio

    from airflow_provider_shardyfusion.core.storage import StorageOptions
    from airflow_provider_shardyfusion.core.storage.async_reader import open_async_reader

    async def reads() -> list[bytes | None]:
        reader = await open_async_reader(root, StorageOptions.from_dict(options))
        try:
            return [await reader.read(k) for k in keys]
        finally:
            await reader.aclose()

    return asyncio.run(reads())


def test_async_reader_reads_what_the_store_wrote(store, any_root):
    root, options = any_root
    payload = bytes(range(256)) * 3
    store.put("a/obj.json", b'{"x":1}')
    store.put("bin", payload, content_type="application/octet-stream")
    # A missing key and a "folder" are both absent, as for the sync store's get.
    assert _aread(root, options, "a/obj.json", "bin", "missing.json", "a") == [b'{"x":1}', payload, None, None]


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/./b", ""])
def test_async_reader_refuses_keys_outside_the_root(any_root, key):
    root, options = any_root
    with pytest.raises(StorageError, match="invalid object key"):
        _aread(root, options, key)


def test_async_reader_on_an_unreachable_endpoint_raises_storage_error():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1", "addressing_style": "path",
               "aws_access_key_id": "x", "aws_secret_access_key": "y"}
    with pytest.raises(StorageError, match=re.escape("S3 get of s3://bucket/snap/_CURRENT failed: ")) as info:
        _aread("s3://bucket/snap", options, "_CURRENT")
    assert "Connect" in type(info.value.__cause__).__name__


def test_a_second_s3_client_reads_no_service_model_files(s3_options, monkeypatch):
    """Stores are opened per operation (readers, checks, publishes): after the first, a client must
    not re-read botocore's JSON service models, which cost most of a new client. Each client still
    gets its own session (credentials are per store) and works."""
    from botocore.loaders import JSONFileLoader

    from airflow_provider_shardyfusion.core.storage.base import StorageOptions
    from airflow_provider_shardyfusion.core.storage.s3 import make_s3_client

    options = StorageOptions.from_dict(s3_options)
    make_s3_client(options)
    reads = []
    original = JSONFileLoader.load_file
    monkeypatch.setattr(JSONFileLoader, "load_file", lambda self, path: reads.append(path) or original(self, path))
    second = make_s3_client(options)
    assert reads == []
    assert "Buckets" in second.list_buckets()


_AUDITED: list[str] | None = None  # the file-system events raised while a test records them


def _audit(event: str, args: tuple) -> None:
    if _AUDITED is not None and event in ("open", "os.remove", "os.link", "os.rename", "os.scandir"):
        _AUDITED.append(event if event != "os.scandir" else f"scandir {args[0]}")


sys.addaudithook(_audit)  # an audit hook cannot be removed: it records only inside `recording`


@contextlib.contextmanager
def recording():
    global _AUDITED
    _AUDITED = []
    try:
        yield _AUDITED
    finally:
        _AUDITED = None


def test_a_local_upload_from_another_filesystem_is_one_exclusive_copy(file_root, tmp_path):
    """Layers are built in tmpfs and uploaded to a root on disk, where a hard link fails: the copy
    goes straight to the temporary name (1000s of small layer files a run paid a temp file made,
    removed and made again each). The bytes arrive whole and no temporary file stays."""
    # Not skipped without one: the writer builds its layers there, so CI machines have it.
    assert scratch.memory_dir() is not None, f"this test needs a writable tmpfs at {scratch.MEMORY_DIR}"
    store = open_store(file_root)
    data = os.urandom(70_000)
    src = tempfile.mkdtemp(dir=scratch.memory_dir())
    try:
        path = os.path.join(src, "layer-00000.sst")
        with open(path, "wb") as fh:
            fh.write(data)
        store.upload_file(path, "shards/run_id=r/db=00001/attempt=00/layer-00000.sst")
        with recording() as events:
            store.upload_file(path, "shards/run_id=r/db=00001/attempt=00/keys-00000.sst")
    finally:
        shutil.rmtree(src)
    assert events == ["os.link", "open", "open", "os.rename"]
    for name in ("layer-00000.sst", "keys-00000.sst"):
        assert store.get(f"shards/run_id=r/db=00001/attempt=00/{name}").data == data
    folder = os.path.join(layout.local_path_of(store.root), "shards/run_id=r/db=00001/attempt=00")
    assert sorted(os.listdir(folder)) == ["keys-00000.sst", "layer-00000.sst"]
    dest = tmp_path / "again" / "layer.sst"  # a download creates the missing folder and overwrites
    store.download_file("shards/run_id=r/db=00001/attempt=00/layer-00000.sst", str(dest))
    store.download_file("shards/run_id=r/db=00001/attempt=00/keys-00000.sst", str(dest))
    assert dest.read_bytes() == data


def test_a_local_listing_enters_only_folders_that_can_hold_the_prefix(file_root):
    """A listing is what it was (keys, sizes, in key order, temporary files left out), and skips
    folders outside the prefix: after each write the job lists its run's 1000s of shard folders."""
    store = open_store(file_root)
    for run in ("a", "ab", "b"):
        for db in range(2):
            store.put(f"shards/run_id={run}/db={db:05d}/attempt=00/layer-00000.sst", f"{run}{db}".encode())
    base = layout.local_path_of(store.root)
    open(os.path.join(base, "shards/run_id=a/db=00000/attempt=00/.tmp-partial"), "wb").close()
    with recording() as events:
        listed = [(o.key, o.size) for o in store.list("shards/run_id=a")]
    assert listed == [(f"shards/run_id={run}/db={db:05d}/attempt=00/layer-00000.sst", len(run) + 1)
                      for run in ("a", "ab") for db in range(2)]
    scanned = sorted(e.removeprefix("scandir ").removeprefix(base).lstrip("/") for e in events)
    assert not [folder for folder in scanned if "run_id=b" in folder], scanned
    assert [(o.key, o.size) for o in store.list("shards/run_id=b/")] == [
        (f"shards/run_id=b/db={db:05d}/attempt=00/layer-00000.sst", 2) for db in range(2)]
