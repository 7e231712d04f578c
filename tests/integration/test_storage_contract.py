"""One contract for every object store back end: local files and S3 (moto server on loopback)."""

from __future__ import annotations

import hashlib
import os

import pytest

from airflow_provider_shardyfusion.core import layout
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
    with pytest.raises(ObjectNotFoundError, match="missing.json") as info:
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
    with pytest.raises(ObjectNotFoundError):
        store.download_file("no/such/file", str(tmp_path / "x"))


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


def test_local_refuses_escaping_keys(file_root):
    store = open_store(file_root)
    for key in ("../outside.json", "a/../../b", "/abs/path", "a/./b"):
        with pytest.raises(StorageError):
            store.put(key, b"x")


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
