"""One build of a cached shard at a time across every process sharing a ``cache_dir`` (SPEC §19).

Several worker processes of one service on one host share a cache: each shard (and each layer of a
chain shard) should be downloaded and built once, not once per process. A build holds an exclusive
``fcntl.flock`` on a lock file beside the folder it installs (``.db=00003.lock`` next to
``db=00003/``); a process that wants the same folder waits for the lock, then finds the folder
installed and reuses it after the usual verify-on-reuse. The folder itself still appears only by
an atomic rename of a verified staging folder, so nothing ever reads a half-built shard.

``flock`` rather than a pid file: the kernel releases the lock when its holder dies however it
dies (``kill -9`` included), so a crashed builder's lock needs no recovery protocol; what it left
behind (a staging folder, the lock file) is removed by the next builder, which holds the lock. A
holder unlinks the lock file before releasing it, so the cache keeps none once builds are done. The lock is
advisory and per open file description, so two threads of one process exclude each other too.
It needs a local file system (``flock`` on NFS is emulated, or refused, depending on the mount).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["build_lock", "lock_path", "staging_path"]

# Polling rather than a blocking flock: a waiter must notice when its snapshot is retired (the
# reader refreshed or closed) instead of waiting for a build nobody needs any more.
_FIRST_WAIT_S = 0.002
_MAX_WAIT_S = 0.05


def lock_path(folder: str) -> str:
    """The lock file guarding the build of ``folder`` (beside it, hidden from cache listings)."""
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.lock")


def staging_path(folder: str) -> str:
    """The one staging folder of a build of ``folder`` (beside it, hidden from cache listings).

    One name, not a fresh temporary one per build: only the holder of ``folder``'s build lock
    builds there, and a dead holder's leftover is found by that name, with no listing of the
    parent (a run's folder holds a folder per shard: listing it per shard made opening a run of
    1000 shards quadratic).
    """
    return os.path.join(os.path.dirname(folder), f".tmp-{os.path.basename(folder)}")


@contextlib.contextmanager
def build_lock(folder: str, *, give_up: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the cross-process lock of the build of ``folder`` (its parent is created if need be).

    ``give_up``: called between polls while another holder has the lock; it raises to stop waiting.
    On entry, the staging folder (``staging_path``) a dead builder of ``folder`` left is removed.
    """
    path = lock_path(folder)
    fd = _acquire(path, give_up)
    try:
        _remove_leftovers(folder)
        yield
    finally:
        # Unlinked while still held, so the cache keeps no lock file per shard: a waiter holding
        # the old inode sees that the path is gone (see ``_acquire``) and locks a new file.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)  # releases the lock


def _acquire(path: str, give_up: Callable[[], None] | None) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    wait = _FIRST_WAIT_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            while not _try_lock(fd):
                if give_up is not None:
                    give_up()
                time.sleep(wait)
                wait = min(wait * 2, _MAX_WAIT_S)
            # A lock file unlinked by its last holder (or with its run folder) is no lock any more:
            # holding the old inode would exclude nobody that opens the path now.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _remove_leftovers(folder: str) -> None:
    """The staging folder of ``folder`` of a builder that died holding the lock: every live builder
    of it holds the lock, so it is not in use."""
    shutil.rmtree(staging_path(folder), ignore_errors=True)
