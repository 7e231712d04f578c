"""Reading small objects (pointer, run record, manifest) from async code without blocking its loop.

The deferrable sensors' triggers run on the triggerer's event loop and read one object per poll.
``open_async_reader(root, options)`` picks the back end as ``open_store`` does; both follow the
sync stores' rules (key checks, key layout, "absent" versus "failed"), and every failure other
than an absent object is a ``StorageError``. A reader makes one request per ``read``: the caller
owns the retry policy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, ObjectNotFoundError
from airflow_provider_shardyfusion.core.storage.base import AsyncObjectReader, StorageOptions
from airflow_provider_shardyfusion.core.storage.local import LocalStore

__all__ = ["AsyncLocalReader", "AsyncObjectReader", "open_async_reader"]


class AsyncLocalReader(AsyncObjectReader):
    """The ``file://`` reader: the local store's reads, run in a worker thread."""

    def __init__(self, root: str):
        self._store = LocalStore(root)
        self.root = self._store.root

    def _read(self, key: str) -> bytes | None:
        try:
            return self._store.get(key).data
        except ObjectNotFoundError:
            return None

    async def read(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._read, key)


async def open_async_reader(
    root: str, options: StorageOptions | None = None, *, session: Any = None
) -> AsyncObjectReader:
    """A reader for ``root``. For ``s3://``: ``options`` (endpoint, region, addressing style and any
    in-process credentials) and optionally an aiobotocore ``session`` that supplies the
    credentials instead (e.g. the amazon provider's, which refreshes an assumed role's)."""
    normalized = layout.normalize_root(root)
    if normalized.startswith("file://"):
        return AsyncLocalReader(normalized)
    if normalized.startswith("s3://"):
        from airflow_provider_shardyfusion.core.storage.async_s3 import open_async_s3_reader

        return await open_async_s3_reader(normalized, options or StorageOptions(), session=session)
    raise ConfigError(f"no storage back end for {root!r}")
