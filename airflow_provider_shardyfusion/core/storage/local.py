"""``file://`` object store: a folder, with atomic single-object writes (temp file + rename)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from datetime import UTC, datetime
from typing import TYPE_CHECKING, BinaryIO

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ObjectNotFoundError, StorageError
from airflow_provider_shardyfusion.core.storage.base import ObjectInfo, ObjectStore, StoredObject

if TYPE_CHECKING:
    import builtins
    from collections.abc import Iterable, Iterator

__all__ = ["LocalStore"]


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _file_etag(fh: BinaryIO) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    while chunk := fh.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _copy_file(src: str, dest: str, create: int) -> None:
    """Copy ``src`` to ``dest`` in the kernel; ``create``: ``os.O_EXCL`` (a new file) or ``os.O_TRUNC``.

    ``shutil.copyfile``'s checks (same file, special files, four stats) and buffered opens cost a
    dozen system calls more a file, which 1000s of small layer files a run paid twice each.
    """
    fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd_in).st_size
        fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | create, 0o666)
        try:
            offset = 0
            try:
                while offset < size and (sent := os.sendfile(fd_out, fd_in, offset, size - offset)):
                    offset += sent
            except OSError as exc:
                if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                with open(fd_in, "rb", closefd=False) as fin, open(fd_out, "wb", closefd=False) as fout:
                    shutil.copyfileobj(fin, fout)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


# Errors meaning "no object at this key": absent, a folder, or a path through a file.
_ABSENT = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


class LocalStore(ObjectStore):
    """The ``file://`` store: objects are files, single-object writes atomic (temp file + rename)."""

    def __init__(self, root: str):
        self.root = layout.normalize_root(root)
        self.base = layout.local_path_of(self.root)

    def _path(self, key: str, *, prefix: bool = False) -> str:
        return os.path.join(self.base, self._check_key(key, prefix=prefix))

    def _wrap(self, exc: OSError, what: str, key: str) -> StorageError:
        return StorageError(f"local {what} of {self.uri(key)} failed: {exc}")

    def _stat_object(self, path: str, key: str, what: str) -> os.stat_result | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._wrap(exc, what, key) from exc
        return st if stat.S_ISREG(st.st_mode) else None

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
        path = self._path(key)
        try:
            self._write_atomic(path, data)
        except OSError as exc:
            raise self._wrap(exc, "put", key) from exc
        return _etag(data)

    def put_if_match(
        self, key: str, data: bytes, etag: str | None, *, content_type: str = "application/json"
    ) -> str | None:
        path = self._path(key)
        try:
            return self._put_if_match(path, data, etag)
        except OSError as exc:
            raise self._wrap(exc, "conditional put", key) from exc

    def _put_if_match(self, path: str, data: bytes, etag: str | None) -> str | None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        # flock on the directory serializes conditional writers without leaving lock files behind.
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            try:
                with open(path, "rb") as fh:
                    current_data: bytes | None = fh.read()
            except FileNotFoundError:
                current_data = None
            current = None if current_data is None else _etag(current_data)
            if current != etag:
                # Same rule as S3, where a repeated request whose first response was lost finds its
                # own write: an object already holding exactly these bytes is a success.
                return current if current_data == data else None
            self._write_atomic(path, data)
            return _etag(data)
        finally:
            os.close(dir_fd)

    def get(self, key: str) -> StoredObject:
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except _ABSENT:
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
        except OSError as exc:
            raise self._wrap(exc, "get", key) from exc
        return StoredObject(data=data, etag=_etag(data))

    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        # A local read of a small object costs what a stat would; the etag is its content hash.
        obj = self.get(key)
        return None if etag is not None and obj.etag == etag else obj

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if self._stat_object(path, key, "head") is None:
            return None
        try:
            with open(path, "rb") as fh:
                # Size, time and etag all from one open file: a concurrent replace cannot mix versions.
                st = os.fstat(fh.fileno())
                etag = _file_etag(fh)
        except _ABSENT:
            return None
        except OSError as exc:
            raise self._wrap(exc, "head", key) from exc
        return ObjectInfo(
            key=key, size=st.st_size, last_modified=datetime.fromtimestamp(st.st_mtime, UTC), etag=etag
        )

    def exists(self, key: str) -> bool:
        # Not via head: that hashes the whole file for its etag.
        return self._stat_object(self._path(key), key, "exists") is not None

    def _entries(self, folder: str, prefix: str) -> builtins.list[os.DirEntry[str]]:
        try:
            with os.scandir(folder) as it:
                return [*it]
        except (FileNotFoundError, NotADirectoryError):
            # A folder that does not exist (or is a file) holds no objects; anything else would
            # silently drop objects from the listing.
            return []
        except OSError as exc:
            raise self._wrap(exc, "list", prefix) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._check_key(prefix, prefix=True)
        # Walk only the deepest directory the prefix fully names, then filter by prefix.
        start_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(start_rel, prefix=True)

        # Keys are built by joining names (not os.path.relpath per file), and folders that cannot
        # hold the prefix are not entered: with a run's 1000s of shard folders, relpath per file was
        # the listing's main cost, paid after every write (losing attempts) and by cleanup.
        found: builtins.list[ObjectInfo] = []
        pending = [(start, f"{start_rel}/" if start_rel else "")]
        while pending:
            folder, rel = pending.pop()
            for entry in self._entries(folder, prefix):
                key = rel + entry.name
                if _is_folder(entry):
                    # As os.walk without followlinks: a link to a folder is neither entered nor listed.
                    if not entry.is_symlink() and (key.startswith(prefix) or prefix.startswith(f"{key}/")):
                        pending.append((entry.path, f"{key}/"))
                elif not entry.name.startswith(".tmp-") and key.startswith(prefix):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    except OSError as exc:
                        raise self._wrap(exc, "list", prefix) from exc
                    found.append(ObjectInfo(key=key, size=st.st_size,
                                            last_modified=datetime.fromtimestamp(st.st_mtime, UTC)))
        found.sort(key=lambda o: o.key)
        return iter(found)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[tuple[str, str]]:
        failures: builtins.list[tuple[str, str]] = []
        touched_dirs: set[str] = set()
        for key in keys:
            try:
                path = self._path(key)
            except StorageError as exc:
                failures.append((key, str(exc)))
                continue
            try:
                os.unlink(path)
                touched_dirs.add(os.path.dirname(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if os.path.isdir(path):
                    continue  # a folder is not an object: absent, as on S3
                failures.append((key, f"local delete failed: {exc}"))
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
        try:
            self._upload(local_path, dest)
        except OSError as exc:
            raise self._wrap(exc, "upload", key) from exc

    def _upload(self, local_path: str, dest: str) -> None:
        directory = os.path.dirname(dest)
        os.makedirs(directory, exist_ok=True)
        # A random name that link and copy create exclusively: mkstemp's file, removed again to
        # link in its place, cost three system calls an object.
        tmp = os.path.join(directory, f".tmp-{secrets.token_hex(8)}")
        try:
            try:
                # Same filesystem: a hard link publishes the file without copying its bytes. Callers
                # hand over finished files (closed RocksDB files, deleted right after), never
                # files they go on writing in place.
                os.link(local_path, tmp)
            except OSError:
                _copy_file(local_path, tmp, os.O_EXCL)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def download_file(self, key: str, local_path: str) -> None:
        src = self._path(key)
        if self._stat_object(src, key, "download") is None:
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        try:
            try:
                _copy_file(src, local_path, os.O_TRUNC)
            except FileNotFoundError as exc:
                if exc.filename == src:
                    raise
                os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
                _copy_file(src, local_path, os.O_TRUNC)
        except OSError as exc:
            if isinstance(exc, _ABSENT) and exc.filename == src:  # deleted since the stat
                raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
            raise self._wrap(exc, "download", key) from exc
