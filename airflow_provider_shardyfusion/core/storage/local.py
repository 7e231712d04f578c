"""``file://`` object store: a folder, with atomic single-object writes (temp file + rename)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone

from .. import layout
from ..errors import ObjectNotFoundError, StorageError
from .base import ObjectInfo, ObjectStore, StoredObject


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class LocalStore(ObjectStore):
    def __init__(self, root: str):
        self.root = layout.normalize_root(root)
        self.base = layout.local_path_of(self.root)

    def _path(self, key: str) -> str:
        if key.startswith("/") or any(p in (".", "..") for p in key.split("/")):
            raise StorageError(f"invalid object key {key!r}")
        return os.path.join(self.base, key)

    def _write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> str:
        self._write_atomic(self._path(key), data)
        return _etag(data)

    def put_if_match(
        self, key: str, data: bytes, etag: str | None, *, content_type: str = "application/json"
    ) -> str | None:
        path = self._path(key)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        # flock on the directory serializes conditional writers without leaving lock files behind.
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            try:
                with open(path, "rb") as fh:
                    current: str | None = _etag(fh.read())
            except FileNotFoundError:
                current = None
            if current != etag:
                return None
            self._write_atomic(path, data)
            return _etag(data)
        finally:
            os.close(dir_fd)

    def get(self, key: str) -> StoredObject:
        try:
            with open(self._path(key), "rb") as fh:
                data = fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
        return StoredObject(data=data, etag=_etag(data))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(self._path(key)):
            return None
        return ObjectInfo(key=key, size=st.st_size, last_modified=datetime.fromtimestamp(st.st_mtime, timezone.utc))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only the deepest directory the prefix fully names, then filter by prefix.
        start_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.base, start_rel) if start_rel else self.base
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.base).replace(os.sep, "/")
                if key.startswith(prefix):
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue
                    found.append(
                        ObjectInfo(key=key, size=st.st_size, last_modified=datetime.fromtimestamp(st.st_mtime, timezone.utc))
                    )
        found.sort(key=lambda o: o.key)
        return iter(found)

    def delete_many(self, keys: Iterable[str]) -> list[tuple[str, str]]:
        failures: list[tuple[str, str]] = []
        touched_dirs: set[str] = set()
        for key in keys:
            try:
                path = self._path(key)
                os.unlink(path)
                touched_dirs.add(os.path.dirname(path))
            except FileNotFoundError:
                continue
            except OSError as exc:
                failures.append((key, str(exc)))
        self._prune_empty_dirs(touched_dirs)
        return failures

    def _prune_empty_dirs(self, dirs: set[str]) -> None:
        # Empty directories are invisible to an object store; remove them so both back ends agree.
        for directory in sorted(dirs, key=len, reverse=True):
            current = directory
            while current.startswith(self.base) and current != self.base.rstrip("/"):
                try:
                    os.rmdir(current)
                except OSError:
                    break
                current = os.path.dirname(current)

    def upload_file(self, local_path: str, key: str) -> None:
        dest = self._path(key)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(dest))
        os.close(fd)
        try:
            try:
                # Same filesystem: a hard link publishes the file without copying its bytes. Callers
                # hand over finished files (closed RocksDB files, deleted right after), never
                # files they go on writing in place.
                os.unlink(tmp)
                os.link(local_path, tmp)
            except OSError:
                shutil.copyfile(local_path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def download_file(self, key: str, local_path: str) -> None:
        src = self._path(key)
        if not os.path.isfile(src):
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        shutil.copyfile(src, local_path)
