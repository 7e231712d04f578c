"""Seams through which tests watch a reader's real RocksDB work, without reading its private state.

A reader opens databases in three modules: read-only shards (``shard_cache``), the databases it
builds (``local_copy``) and its live shards' (``live_shards``). RocksDB runs for real; the wrapper
only sees each opening.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.read import live_shards, local_copy, shard_cache

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

__all__ = ["record_databases"]


def record_databases(monkeypatch: pytest.MonkeyPatch, opening: Callable[..., Any]) -> None:
    """Open every database a reader opens through ``opening(path, *args, **kwargs)``, which must open it."""
    for module in (shard_cache, local_copy, live_shards):
        monkeypatch.setattr(module, "Rdict", opening)
