"""Where a key is read: its shard id and the exact bytes stored for it (SPEC §4, §5).

A reader routes a key exactly as the writer did and encodes it exactly as it was stored. The
functions here are that pair in one call, built once per manifest: hash routing with fast paths
for the key's usual type, ``multi_get``'s integer-key grouping inlined, and CEL routing, which
may need other column values (``routing_context``).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError, ReaderError
from airflow_provider_shardyfusion.core.model.encoding import PACK_INT_KEY, encode_key, plain_key
from airflow_provider_shardyfusion.core.model.routing import CelRouter, hash64, pack_int_key, route_key

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding
    from airflow_provider_shardyfusion.core.model.manifest import Manifest

__all__ = ["GroupKeys", "Groups", "KeyLocator", "Locate", "cel_locator", "group_keys", "hash_locator", "int_key_grouper"]

# (key, routing_context) -> (db_id, stored key bytes)
Locate = Callable[[Any, "Mapping[str, Any] | None"], "tuple[int, bytes]"]
# {db_id: (positions in keys, stored key bytes)}
Groups = dict[int, tuple[list[int], list[bytes]]]
# keys -> Groups
GroupKeys = Callable[[list[Any]], Groups]


@dataclass(frozen=True)
class KeyLocator:
    """How the keys of one manifest are located.

    ``group``: ``multi_get``'s inlined loop for integer keys under hash routing (None otherwise).
    ``cel_router``: the rebuilt CEL routing (None under hash routing).
    """

    locate: Locate
    group: GroupKeys | None
    cel_router: CelRouter | None

    @classmethod
    def for_manifest(cls, manifest: Manifest) -> KeyLocator:
        run_id = manifest.run_id
        sharding = manifest.sharding
        if sharding.strategy == "hash":
            group = None
            if manifest.key_encoding in ("u64be", "u32be"):
                group = int_key_grouper(manifest.num_dbs, manifest.key_encoding, sharding.key_column)
            return cls(hash_locator(manifest.num_dbs, manifest.key_encoding, sharding.key_column), group, None)
        unresolved = sorted(c for c, t in (sharding.cel_columns or {}).items() if t is None)
        if unresolved:
            raise ManifestValidationError(
                f"manifest of run {run_id!r}: cel_columns {unresolved} have no CEL type; "
                "the writer must record resolved types"
            )
        try:
            router = CelRouter(sharding.cel_spec(manifest.num_dbs))
        except ConfigError as exc:
            raise ManifestValidationError(f"manifest of run {run_id!r}: CEL routing cannot be rebuilt: {exc}") from None
        locate = cel_locator(router, run_id, manifest.key_encoding, sharding.key_column, sharding.cel_expr or "")
        return cls(locate, None, router)


def hash_locator(num_dbs: int, key_encoding: KeyEncoding, key_column: str) -> Locate:  # noqa: C901 - one inlined closure per key encoding: the read hot path (bench_read)
    """Routing + key encoding for the hash strategy, with a fast path for the key's usual type.

    The fast paths compute exactly ``routing.route_key`` and ``encoding.encode_key`` (struct raises
    on the same out-of-range keys); anything unusual falls back to those functions, which also
    produce the clear error messages.
    """
    n = num_dbs
    xxh3 = hash64

    def generic(key: Any) -> tuple[int, bytes]:
        key = plain_key(key)
        stored = encode_key(key, key_encoding, column=key_column)
        return route_key(key, n), stored

    if key_encoding in ("u64be", "u32be"):
        pack = PACK_INT_KEY[key_encoding]

        def locate(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is int:
                try:
                    return xxh3(pack_int_key(key)) % n, pack(key)
                except struct.error:
                    pass
            return generic(key)

    elif key_encoding == "utf8":

        def locate(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is str:
                try:
                    data = key.encode("utf-8")
                except UnicodeEncodeError:
                    return generic(key)
                return xxh3(data) % n, data
            return generic(key)

    else:  # raw

        def locate(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
            if type(key) is bytes:
                return xxh3(key) % n, key
            return generic(key)

    return locate


def int_key_grouper(num_dbs: int, key_encoding: KeyEncoding, key_column: str) -> GroupKeys:
    """``multi_get``'s routing loop for integer keys, inlined: no call per key (SPEC §4/§5 as above)."""
    n = num_dbs
    xxh3 = hash64
    pack_le = pack_int_key
    pack = PACK_INT_KEY[key_encoding]
    slow = hash_locator(num_dbs, key_encoding, key_column)

    def group(keys: list[Any]) -> Groups:
        groups: Groups = {}
        for i, key in enumerate(keys):
            if type(key) is int:
                try:
                    db_id = xxh3(pack_le(key)) % n
                    stored = pack(key)
                except struct.error:
                    db_id, stored = slow(key, None)
            else:
                db_id, stored = slow(key, None)
            found = groups.get(db_id)
            if found is None:
                groups[db_id] = ([i], [stored])
            else:
                found[0].append(i)
                found[1].append(stored)
        return groups

    return group


def group_keys(
    locate: Locate, keys: list[Any], ctx: Mapping[str, Any] | None, contexts: Sequence[Mapping[str, Any]] | None
) -> Groups:
    """Keys grouped by shard through ``locate``: one ``ctx`` for all keys, or one of ``contexts`` per key."""
    groups: Groups = {}
    per_key = repeat(ctx) if contexts is None else contexts
    for i, (key, key_ctx) in enumerate(zip(keys, per_key, strict=False)):
        db_id, stored = locate(key, key_ctx)
        group = groups.get(db_id)
        if group is None:
            groups[db_id] = ([i], [stored])
        else:
            group[0].append(i)
            group[1].append(stored)
    return groups


def cel_locator(router: CelRouter, run_id: str, key_encoding: KeyEncoding, key_column: str, expr: str) -> Locate:
    columns = tuple(router.spec.columns)
    key_only = set(columns) == {key_column}
    key_in_columns = key_column in columns
    others = [c for c in columns if c != key_column]
    # cel-python walks a shared parse tree; serialize evaluations rather than trust it to be re-entrant.
    lock = threading.Lock()

    def locate(key: Any, ctx: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
        key = plain_key(key)
        stored = encode_key(key, key_encoding, column=key_column)
        if key_only:
            row: Mapping[str, Any] = {key_column: key}
        else:
            if ctx is None:
                raise ReaderError(
                    f"snapshot {run_id!r} routes with CEL expression {expr!r} over columns {list(columns)}, "
                    f"which the key alone does not give: pass routing_context={{...}} with values for {others}"
                )
            missing = [c for c in others if ctx.get(c) is None]
            if missing:
                raise ReaderError(
                    f"routing_context {dict(ctx)!r} lacks values for CEL columns {missing} "
                    f"(expression {expr!r} of snapshot {run_id!r})"
                )
            row = dict(ctx)
            if key_in_columns:
                row[key_column] = key
        with lock:
            return router.route(row), stored

    return locate
