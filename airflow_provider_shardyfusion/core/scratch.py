"""Memory-backed scratch folders (tmpfs) for building small RocksDB databases.

Creating a RocksDB database costs about a dozen fsyncs (CURRENT, MANIFEST, OPTIONS, the folder),
which a disk pays and tmpfs does not (figures: docs/benchmarks.md). Small databases are built in memory and
their files copied out; large ones, or where there is no tmpfs, stay on disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["MEMORY_DIR", "TaskScratch", "free_bytes", "memory_dir", "memory_workdir"]

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
    if base is None or not _fits(base, size, max_bytes):
        return None
    try:
        return tempfile.mkdtemp(prefix=prefix, dir=base)
    except OSError:
        return None


def _fits(folder: str, size: int, max_bytes: int) -> bool:
    """Whether ``size`` bytes of work may go to the memory-backed ``folder`` now."""
    return max_bytes > 0 and size <= max_bytes and free_bytes(folder) >= _HEADROOM * size


def free_bytes(folder: str) -> int:
    """Bytes free for this process in ``folder``'s file system (0 if it cannot tell)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class TaskScratch:
    """Scratch folders for the builds of one task, one after another (e.g. a layer per shard).

    A task creates at most one memory-backed folder and one on disk, and empties the one it used
    after each build: a build goes to memory where ``memory_workdir``'s rule lets it, else to disk.
    Creating and removing a folder per build cost more than a small delta layer itself, at 1000s of
    shards per run.
    """

    def __init__(self, max_bytes: int, prefix: str):
        self.max_bytes, self.prefix = max_bytes, prefix
        self._memory: str | None = None
        self._disk: str | None = None

    @contextlib.contextmanager
    def folder(self, size: int) -> Iterator[str]:
        """An empty folder for ``size`` bytes of work, emptied when the block ends."""
        if self._memory is None:
            self._memory = memory_workdir(size, self.max_bytes, prefix=self.prefix)
            work = self._memory
        else:
            work = self._memory if _fits(self._memory, size, self.max_bytes) else None
        if work is None:
            if self._disk is None:
                self._disk = tempfile.mkdtemp(prefix=self.prefix)
            work = self._disk
        try:
            yield work
        finally:
            _empty(work)

    def close(self) -> None:
        for folder in (self._memory, self._disk):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._memory = self._disk = None


def _empty(folder: str) -> None:
    """Remove what ``folder`` holds, keeping the folder."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
