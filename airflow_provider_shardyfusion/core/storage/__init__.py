"""Object storage behind one interface: ``open_store(root, options)`` picks the back end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.storage.base import ObjectInfo, ObjectStore, StorageOptions, StoredObject

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.retry import RetryPolicy


def open_store(root: str, options: StorageOptions | dict[str, Any] | None = None, *,
               retry: RetryPolicy | None = None) -> ObjectStore:
    """The store of ``root``; ``retry``: how an S3 call is retried (default ``s3.DEFAULT_RETRY``)."""
    normalized = layout.normalize_root(root)
    if isinstance(options, dict) or options is None:
        options = StorageOptions.from_dict(options)
    if normalized.startswith("file://"):
        from airflow_provider_shardyfusion.core.storage.local import LocalStore

        return LocalStore(normalized)
    if normalized.startswith("s3://"):
        from airflow_provider_shardyfusion.core.storage.s3 import S3Store

        return S3Store(normalized, options, retry=retry)
    raise ConfigError(f"no storage back end for {root!r}")


__all__ = ["ObjectInfo", "ObjectStore", "StorageOptions", "StoredObject", "open_store"]
