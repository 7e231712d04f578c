"""The shards one host serves: ``ShardedReader(…, shard_ids=…)`` (SPEC §19).

A fleet splits a snapshot's shards between hosts: each reader loads only its subset, and a client
routes a key to the host serving its shard (``reader.route(key)``, the writer's own routing, §4).
A key routed to a shard outside the subset is refused with ``ShardNotServedError`` before anything
is read or downloaded, so a misrouted request never costs a download of a shard the host was not
sized for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.errors import ConfigError, ShardNotServedError, show_value

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.read.key_locator import Groups

__all__ = ["ShardSubset", "compact_ids"]


class ShardSubset:
    """The shard ids a reader serves, checked against each manifest it loads.

    ``ids``: an iterable of ints or a ``range``; at least one, none negative (duplicates are fine).
    """

    __slots__ = ("ids", "text")

    def __init__(self, ids: Iterable[int]):
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ConfigError(f"shard_ids must be an iterable of shard ids (ints) or a range, got {show_value(ids)}")
        chosen = set()
        for db_id in ids:
            if isinstance(db_id, bool) or not isinstance(db_id, int) or db_id < 0:
                raise ConfigError(f"shard_ids: {show_value(db_id)} is not a shard id (a non-negative int)")
            chosen.add(db_id)
        if not chosen:
            raise ConfigError("shard_ids is empty: a reader must serve at least one shard (or pass None for all)")
        self.ids = frozenset(chosen)
        self.text = compact_ids(self.ids)

    def check_manifest(self, manifest: Manifest) -> None:
        """Refuse a manifest whose shard count leaves some served id without a shard."""
        outside = sorted(i for i in self.ids if i >= manifest.num_dbs)
        if outside:
            raise ConfigError(
                f"shard_ids {self.text} name shard(s) {compact_ids(outside)} outside [0, {manifest.num_dbs}): "
                f"run {manifest.run_id!r} has {manifest.num_dbs} shards"
            )

    def check(self, key: Any, db_id: int) -> None:
        """Raise ``ShardNotServedError`` unless ``db_id`` (the shard ``key`` routes to) is served."""
        if db_id not in self.ids:
            raise ShardNotServedError(
                f"key {show_value(key)} routes to shard {db_id}, which this reader does not serve "
                f"(shard_ids {self.text}); ask the host serving shard {db_id}",
                key=key, db_id=db_id, served=self.text,
            )

    def check_shard(self, db_id: int) -> None:
        """Raise ``ShardNotServedError`` unless shard ``db_id`` is served (``open_shard``)."""
        if db_id not in self.ids:
            raise ShardNotServedError(f"shard {db_id} is not served by this reader (shard_ids {self.text})",
                                      db_id=db_id, served=self.text)

    def check_groups(self, groups: Groups, keys: Sequence[Any]) -> None:
        """``multi_get``: refuse the batch, naming its first key (in input order) outside the subset."""
        outside = [(positions[0], db_id) for db_id, (positions, _) in groups.items() if db_id not in self.ids]
        if outside:
            position, db_id = min(outside)
            self.check(keys[position], db_id)


def compact_ids(ids: Iterable[int]) -> str:
    """Shard ids as sorted runs, e.g. ``0-15,32,40-47``."""
    runs: list[list[int]] = []
    for db_id in sorted(set(ids)):
        if runs and db_id == runs[-1][1] + 1:
            runs[-1][1] = db_id
        else:
            runs.append([db_id, db_id])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)
