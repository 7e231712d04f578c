"""Memory-backed scratch folders (tmpfs) for building small RocksDB databases.

Creating a RocksDB database costs about a dozen fsyncs (CURRENT, MANIFEST, OPTIONS, the folder):
~30 ms each database on a disk here, ~3 ms on tmpfs. Small databases are built in memory and
their files copied out; large ones, or where there is no tmpfs, stay on disk.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["MEMORY_DIR", "memory_dir", "memory_workdir"]

MEMORY_DIR = "/dev/shm"
# Room kept free beyond what is built: the SSTs, their copies during ingestion, and headroom.
_HEADROOM = 4


def memory_dir() -> str | None:
    """A memory-backed (tmpfs) folder on this machine, if it has one."""
    return MEMORY_DIR if os.path.isdir(MEMORY_DIR) and os.access(MEMORY_DIR, os.W_OK | os.X_OK) else None


def memory_workdir(size: int, max_bytes: int, *, base: str | None = None, prefix: str = "shardyfusion-") -> str | None:
    """A fresh folder in ``base`` (default: ``memory_dir()``) for ``size`` bytes of work, or None.

    None when there is no such folder, ``size`` exceeds ``max_bytes`` or the folder lacks room.
    """
    base = base if base is not None else memory_dir()
    if base is None or max_bytes <= 0 or size > max_bytes:
        return None
    try:
        st = os.statvfs(base)
        if st.f_bavail * st.f_frsize < _HEADROOM * size:
            return None
        return tempfile.mkdtemp(prefix=prefix, dir=base)
    except OSError:
        return None
