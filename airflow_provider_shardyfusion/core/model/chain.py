"""A delta's chain document joined to its base: the whole snapshot, in memory (SPEC §17).

A format-3 manifest stores only what its run changed and names its base's manifest by reference
and checksum. Readers, validation, cleanup, the history pages and the writer of the next delta
all want the whole snapshot; ``resolve`` builds it from the document and the base's (already
resolved) manifest without restating anything on storage. Fetching the documents is the caller's
(``SnapshotRoot`` synchronously; the triggers asynchronously): this module does no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry

__all__ = ["check_base_bytes", "missing_base", "resolve"]


def check_base_bytes(doc: Manifest, data: bytes) -> None:
    """The base manifest's bytes must be exactly the ones the document was written on."""
    found = bytes_checksum(data)
    if found != doc.base_manifest_checksum:
        raise ManifestValidationError(
            f"base manifest {doc.base_manifest_ref} of run {doc.base_run_id!r} (the base of run {doc.run_id!r}) was "
            f"altered after run {doc.run_id!r} was written on it: checksum {found}, recorded "
            f"{doc.base_manifest_checksum}; refusing to read a snapshot built on it"
        )


def missing_base(doc: Manifest, reason: str) -> ManifestValidationError:
    return ManifestValidationError(
        f"base manifest {doc.base_manifest_ref} of run {doc.base_run_id!r} (the base of run {doc.run_id!r}) "
        f"cannot be read: {reason}; the snapshot of run {doc.run_id!r} cannot be rebuilt without it"
    )


def resolve(doc: Manifest, base: Manifest) -> Manifest:
    """The whole snapshot of chain document ``doc`` on ``base`` (a resolved manifest of its base run).

    Unchanged shards are the base's (their layers listed, as a format-2 manifest did); a changed
    shard's layers are the base's followed by the document's own.
    """
    _check_link(doc, base)
    changed = {s.db_id: s for s in doc.shards}
    shards: list[ShardEntry] = []
    # Once per shard of every level of a chain on a fresh open: only what a shard needs is done.
    for before in base.shards:
        new = changed.pop(before.db_id, None) if changed else None
        if new is None:
            shards.append(before if before.layers else replace(before, layers=before.all_layers()))
        else:
            shards.append(replace(new, layers=(*before.all_layers(), *new.layers)))
    # Shards the base had empty that the delta filled.
    shards.extend(changed.values())
    shards.sort(key=attrgetter("db_id"))
    return replace(doc, shards=tuple(shards))


def _check_link(doc: Manifest, base: Manifest) -> None:
    """The base is the run the document says, and the chain keeps its routing and encodings."""
    where = f"manifest of run {doc.run_id!r} on base run {doc.base_run_id!r}"
    if base.run_id != doc.base_run_id:
        raise ManifestValidationError(f"{where}: base_manifest_ref {doc.base_manifest_ref} is the manifest of run "
                                      f"{base.run_id!r}")
    differs = [name for name, a, b in (
        ("num_dbs", doc.num_dbs, base.num_dbs), ("sharding", doc.sharding, base.sharding),
        ("key_encoding", doc.key_encoding, base.key_encoding), ("value_format", doc.value_format, base.value_format),
        ("chain_depth", doc.chain_depth, base.chain_depth + 1),
    ) if a != b]
    if differs:
        raise ManifestValidationError(f"{where}: {', '.join(differs)} do not follow from the base (a chain keeps "
                                      "the base's routing and encodings and is one deeper)")
