"""Vectorized xxh3_64 for 8-byte inputs: the routing hash of int64 keys on whole Arrow columns.

This is the 4-to-8-byte path of XXH3 (seed 0) written with numpy uint64 arithmetic, which
wraps modulo 2**64 like the C code. It must agree bit for bit with ``xxhash.xxh3_64_intdigest``
of ``routing.canonical_bytes(k)`` (property-tested); routing of other key types stays per row.
"""

from __future__ import annotations

import numpy as np

# Bytes 8..24 of XXH3's default secret, read little-endian and xored (seed 0 ⇒ nothing subtracted).
_BITFLIP = np.uint64(0x1CAD21F72C81017C ^ 0xDB979083E96DD4DE)
_PRIME_MX2 = np.uint64(0x9FB21C651E98DF25)
_LEN = np.uint64(8)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def xxh3_64_int64(keys: np.ndarray) -> np.ndarray:
    """xxh3_64 of each key's 8-byte signed little-endian form, as uint64."""
    v = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64)
    # input64 = readLE32(hi half) + (readLE32(lo half) << 32): the value rotated by 32 bits.
    h = _rotl(v, 32) ^ _BITFLIP
    h = h ^ (_rotl(h, 49) ^ _rotl(h, 24))
    h = h * _PRIME_MX2
    h = h ^ ((h >> np.uint64(35)) + _LEN)
    h = h * _PRIME_MX2
    return h ^ (h >> np.uint64(28))


def route_int64(keys: np.ndarray, num_dbs: int) -> np.ndarray:
    """``route_key`` for a whole int64 column, as int32 shard ids."""
    return (xxh3_64_int64(keys) % np.uint64(num_dbs)).astype(np.int32)
