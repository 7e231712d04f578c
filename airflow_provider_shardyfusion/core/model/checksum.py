"""Per-file checksums recorded in manifests and checked by readers."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import xxhash

from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.storage.base import ObjectStore

__all__ = ["ALGORITHM", "bytes_checksum", "download_verified", "file_checksum", "verify_bytes", "verify_file"]

ALGORITHM = "xxh3_128"
_CHUNK = 4 << 20


def file_checksum(path: str) -> str:
    """``xxh3_128:<hex>``: fast enough to run on every shard file at write and read time."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return f"{ALGORITHM}:{h.hexdigest()}"


def bytes_checksum(data: bytes, expected: str | None = None) -> str:
    """Checksum of an in-memory object (a manifest), in the algorithm ``expected`` names if given."""
    algorithm = expected.split(":", 1)[0] if expected else ALGORITHM
    if algorithm != ALGORITHM:
        raise ChecksumMismatchError(f"checksum algorithm {algorithm!r} is not supported (expected {ALGORITHM})")
    return f"{ALGORITHM}:{xxhash.xxh3_128(data).hexdigest()}"


def verify_file(path: str, size: int, checksum: str | None, *, source: str) -> None:
    _verify(os.path.getsize(path), size, checksum, lambda: file_checksum(path), source=source)


def verify_bytes(data: bytes, size: int, checksum: str | None, *, source: str) -> None:
    """``verify_file`` for a file's bytes held in memory."""
    _verify(len(data), size, checksum, lambda: f"{ALGORITHM}:{xxhash.xxh3_128(data).hexdigest()}", source=source)


def download_verified(store: ObjectStore, key: str, local: str, size: int, checksum: str | None, *, source: str,
                      in_memory_max: int | None = None) -> None:
    """Fetch ``key`` to ``local`` and check it against the manifest's size and checksum.

    A file that fails the check is removed: nothing may open a bad copy by its name. A file of at
    most ``in_memory_max`` bytes is fetched with one GET and checked before it is written, which on
    S3 saves the HEAD and the second read a download costs (the writer's small key indexes).
    """
    if in_memory_max is not None and size <= in_memory_max:
        data = store.get(key).data
        verify_bytes(data, size, checksum, source=source)
        with open(local, "wb") as fh:
            fh.write(data)
        return
    store.download_file(key, local)
    try:
        verify_file(local, size, checksum, source=source)
    except ChecksumMismatchError:
        os.unlink(local)
        raise


def _verify(actual_size: int, size: int, checksum: str | None, actual_checksum: Callable[[], str], *,
            source: str) -> None:
    if actual_size != size:
        raise ChecksumMismatchError(f"{source}: size {actual_size} does not match the manifest's {size}")
    if checksum is None:
        return
    algorithm = checksum.split(":", 1)[0]
    if algorithm != ALGORITHM:
        raise ChecksumMismatchError(f"{source}: checksum algorithm {algorithm!r} is not supported (expected {ALGORITHM})")
    actual = actual_checksum()
    if actual != checksum:
        raise ChecksumMismatchError(f"{source}: checksum {actual} does not match the manifest's {checksum}")
