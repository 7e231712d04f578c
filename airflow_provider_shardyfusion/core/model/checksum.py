"""Per-file checksums recorded in manifests and checked by readers."""

from __future__ import annotations

import os

import xxhash

from airflow_provider_shardyfusion.core.errors import ChecksumMismatchError

__all__ = ["ALGORITHM", "bytes_checksum", "file_checksum", "verify_file"]

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
    actual_size = os.path.getsize(path)
    if actual_size != size:
        raise ChecksumMismatchError(f"{source}: size {actual_size} does not match the manifest's {size}")
    if checksum is None:
        return
    algorithm = checksum.split(":", 1)[0]
    if algorithm != ALGORITHM:
        raise ChecksumMismatchError(f"{source}: checksum algorithm {algorithm!r} is not supported (expected {ALGORITHM})")
    actual = file_checksum(path)
    if actual != checksum:
        raise ChecksumMismatchError(f"{source}: checksum {actual} does not match the manifest's {checksum}")
