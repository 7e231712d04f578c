"""The chain protocol (SPEC §17) in one place, without I/O: reading a run's whole snapshot.

A format-3 manifest stores only what its run changed and names its base's manifest by reference
and checksum. Readers, validation, cleanup, the history pages and the writer of the next delta
all want the whole snapshot. This module holds every rule of getting it: the checks on the
manifest a path or ``_CURRENT`` names, the walk down ``base_manifest_ref`` to a self-contained
manifest (each base exactly the bytes its successor was written on, of the run it says, its shards
in their own folders), the errors naming a missing or altered manifest, and ``resolve``, which
joins a document to its base's resolved manifest.

The walk is a generator (``walk_ref``, ``walk_pointer``): it yields a ``ManifestFetch`` for each
manifest it needs and is sent back the stored bytes (``None``: no such object). It does no I/O,
so one walk serves two drivers: ``drive`` (``SnapshotRoot``, synchronous, with the process's cache
of decoded manifests) and ``adrive`` (the triggers, through the async store reader).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.manifest import Manifest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from airflow_provider_shardyfusion.core.model.manifest import ShardEntry
    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer

__all__ = [
    "ChainLink", "ManifestCache", "ManifestFetch", "ResolvedManifest", "Walk", "adrive", "base_document", "base_manifest_key",
    "check_base_bytes", "check_shard_urls", "drive", "manifest_document", "manifest_for_pointer", "missing_base",
    "parse_manifest_bytes", "resolve", "walk_pointer", "walk_ref",
]


@dataclass(frozen=True)
class ChainLink:
    """One base a resolved chain was rebuilt from: its manifest, its run, the checksum its successor
    recorded for its bytes, and that successor's run."""

    ref: str
    run_id: str
    checksum: str
    base_of: str

    def missing(self, reason: str) -> ManifestValidationError:
        """The error of this base's manifest that cannot be read any more."""
        return ManifestValidationError(
            f"base manifest {self.ref} of run {self.run_id!r} (the base of run {self.base_of!r}) cannot be read: "
            f"{reason}; the snapshot of run {self.base_of!r} cannot be rebuilt without it"
        )

    def altered(self, found: str) -> ManifestValidationError:
        """The error of this base's manifest whose bytes now have checksum ``found``."""
        return ManifestValidationError(
            f"base manifest {self.ref} of run {self.run_id!r} (the base of run {self.base_of!r}) was altered after "
            f"run {self.base_of!r} was written on it: checksum {found}, recorded {self.checksum}; refusing to read "
            "a snapshot built on it"
        )


@dataclass(frozen=True)
class ResolvedManifest:
    """A manifest as readers use it, the checksum of its stored bytes, and the manifests of its chain
    it was rebuilt from (nearest first): their URIs (``ancestors``) and what each must still be (``links``)."""

    manifest: Manifest
    checksum: str
    ancestors: tuple[str, ...] = ()
    links: tuple[ChainLink, ...] = ()


@dataclass(frozen=True)
class ManifestFetch:
    """What a walk asks its driver for: the stored bytes of the manifest at ``key`` (under the root).

    ``uri`` names it; ``checksum`` is the checksum its bytes must have, when one is recorded;
    ``base_of`` is the chain document whose base it is (``None``: the manifest the walk starts at).
    """

    key: str
    uri: str
    checksum: str | None = None
    base_of: Manifest | None = None

    def unreadable(self, reason: str) -> ManifestValidationError:
        """The error of a base manifest the driver could not read (the walk's start is the caller's own)."""
        assert self.base_of is not None
        return missing_base(self.base_of, reason)


class ManifestCache(Protocol):
    """Decoded manifests a walk may reuse, by the checksum of their bytes (``SnapshotRoot``'s, per process)."""

    def get(self, checksum: str, run_id: str | None) -> ResolvedManifest | None:
        """The resolved manifest of ``run_id`` whose bytes have ``checksum``, if decoded before."""

    def put(self, resolved: ResolvedManifest) -> None:
        """Keep ``resolved`` for later walks."""


# A walk yields the fetches it needs, is sent their bytes (None: absent) and returns the snapshot.
Walk = Generator[ManifestFetch, "bytes | None", ResolvedManifest]


class _NoCache:
    def get(self, checksum: str, run_id: str | None) -> ResolvedManifest | None:
        return None

    def put(self, resolved: ResolvedManifest) -> None:
        return None


def walk_ref(key: str, uri: str, run_id: str, root: str, cache: ManifestCache | None = None) -> Walk:
    """The whole snapshot of the manifest stored at ``key`` (``uri``), which its path says is ``run_id``'s."""
    cache = _NoCache() if cache is None else cache
    data = yield ManifestFetch(key, uri)
    if data is None:
        raise ManifestValidationError(f"manifest {uri} does not exist")
    checksum = bytes_checksum(data)
    found = cache.get(checksum, run_id)
    if found is not None:
        return found
    return (yield from _join_bases(manifest_document(uri, run_id, data, root), checksum, root, cache))


def walk_pointer(pointer: CurrentPointer, key: str, root: str, cache: ManifestCache | None = None) -> Walk:
    """The whole snapshot ``pointer`` names (stored at ``key``), refused unless its manifest is exactly
    the one the pointer was written for."""
    cache = _NoCache() if cache is None else cache
    data = yield ManifestFetch(key, pointer.manifest_ref, pointer.manifest_checksum)
    if data is None:
        raise ManifestValidationError(f"_CURRENT names manifest {pointer.manifest_ref}, which does not exist")
    checksum = bytes_checksum(data)
    pointer.check_manifest_bytes(data, checksum)
    found = cache.get(checksum, pointer.run_id)
    if found is not None:
        return found
    doc = manifest_for_pointer(pointer, data, root, checksum=checksum)
    return (yield from _join_bases(doc, checksum, root, cache))


def drive(walk: Walk, fetch: Callable[[ManifestFetch], bytes | None]) -> ResolvedManifest:
    """Run ``walk`` to its end, answering each fetch with ``fetch`` (synchronous)."""
    try:
        wanted = next(walk)
        while True:
            wanted = walk.send(fetch(wanted))
    except StopIteration as done:
        return done.value


async def adrive(walk: Walk, fetch: Callable[[ManifestFetch], Awaitable[bytes | None]]) -> ResolvedManifest:
    """``drive`` for an asynchronous ``fetch`` (the triggers' store reader)."""
    try:
        wanted = next(walk)
        while True:
            wanted = walk.send(await fetch(wanted))
    except StopIteration as done:
        return done.value


def _join_bases(doc: Manifest, checksum: str, root: str, cache: ManifestCache) -> Walk:
    """Join a chain document to its bases, fetching only the manifests ``cache`` does not hold."""
    if not doc.is_chain_document:
        found = ResolvedManifest(doc, checksum)
        cache.put(found)
        return found
    pending: list[tuple[Manifest, str]] = []
    while True:
        pending.append((doc, checksum))
        base_checksum = doc.base_manifest_checksum or ""
        cached = cache.get(base_checksum, doc.base_run_id)
        if cached is not None:
            found = cached
            break
        key = base_manifest_key(doc, root)
        data = yield ManifestFetch(key, doc.base_manifest_ref or "", doc.base_manifest_checksum, base_of=doc)
        if data is None:
            raise missing_base(doc, "it does not exist")
        base = base_document(doc, data, root)
        if not base.is_chain_document:
            found = ResolvedManifest(base, base_checksum)
            cache.put(found)
            break
        doc, checksum = base, base_checksum
    for doc, checksum in reversed(pending):
        link = ChainLink(doc.base_manifest_ref or "", doc.base_run_id or "", doc.base_manifest_checksum or "", doc.run_id)
        found = ResolvedManifest(resolve(doc, found.manifest), checksum, (link.ref, *found.ancestors),
                                 (link, *found.links))
        cache.put(found)
    return found


# -- one manifest's bytes ------------------------------------------------------------------------


def parse_manifest_bytes(where: str, data: bytes) -> Manifest:
    """Parse and validate manifest bytes read from ``where`` (named in the error)."""
    try:
        return Manifest.from_bytes(data)
    except ManifestValidationError as exc:
        raise ManifestValidationError(f"{where}: {exc}") from None


def manifest_document(uri: str, run_id: str, data: bytes, root: str) -> Manifest:
    """The manifest document stored at ``uri``: of the run its path names, its shards in their own folders."""
    doc = parse_manifest_bytes(uri, data)
    if doc.run_id != run_id:
        raise ManifestValidationError(f"{uri}: manifest is of run {doc.run_id!r}, its path says {run_id!r}")
    check_shard_urls(doc, root, uri)
    return doc


def manifest_for_pointer(pointer: CurrentPointer, data: bytes, root: str, *, checksum: str | None = None) -> Manifest:
    """Check manifest bytes against the pointer that names them.

    The bytes must be the ones the pointer recorded (checksum and size), of the pointer's run, and
    every ``db_url`` must lie in its own shard folder under ``root``: ``Manifest.validate`` checks
    them against the manifest's own ``output_uri``, which a tampered manifest could change too.
    ``checksum``: the bytes' checksum if the caller computed it already.
    """
    pointer.check_manifest_bytes(data, checksum)
    manifest = parse_manifest_bytes(pointer.manifest_ref, data)
    if manifest.run_id != pointer.run_id:
        raise ManifestValidationError(
            f"{pointer.manifest_ref}: manifest is of run {manifest.run_id!r} but _CURRENT names run {pointer.run_id!r}"
        )
    check_shard_urls(manifest, root, pointer.manifest_ref)
    return manifest


def check_shard_urls(manifest: Manifest, root: str, where: str) -> None:
    """Every ``db_url`` in its own run's shard folder under ``root`` (not only under the manifest's own
    ``output_uri``, which a tampered manifest could change too). Once per shard and layer of every
    manifest read: each run's folder is built once, each URL then costs string tests."""
    prefixes: dict[str, str] = {}
    for shard in manifest.shards:
        # A chain's layers lie in the folders of the runs that wrote them, each checked the same way.
        for run_id, db_url in [(x.run_id, x.db_url) for x in shard.layers] or [(manifest.run_id, shard.db_url)]:
            own_prefix = prefixes.get(run_id)
            if own_prefix is None:
                own_prefix = prefixes[run_id] = layout.join(root, layout.shards_prefix(run_id))
            own_db = own_prefix + layout.shard_db_dir(shard.db_id)
            if not db_url.startswith(own_db) or any(
                    part in ("", ".", "..") for part in db_url[len(own_db):].rstrip("/").split("/")):
                raise ManifestValidationError(
                    f"{where}: db_url {db_url!r} of shard {shard.db_id} is not under this "
                    f"snapshot's {own_db}; refusing to read it"
                )


# -- a chain document and its base ---------------------------------------------------------------


def base_manifest_key(doc: Manifest, root: str) -> str:
    """The key of a chain document's base manifest, refused unless it is a manifest under ``root``."""
    try:
        key = layout.relative_key(root, doc.base_manifest_ref or "")
    except ManifestValidationError as exc:
        raise missing_base(doc, str(exc)) from None
    if layout.parse_manifest_key(key) is None:
        raise missing_base(doc, f"it is not a manifest under {root}/{layout.MANIFESTS_DIR}/")
    return key


def base_document(doc: Manifest, data: bytes, root: str) -> Manifest:
    """A chain document's base manifest document from its stored bytes: exactly the bytes it was
    written on (checksum), of its base run, its shards in their own folders under ``root``."""
    check_base_bytes(doc, data)
    parsed = layout.parse_manifest_key(base_manifest_key(doc, root))
    assert parsed is not None  # base_manifest_key refuses anything else
    return manifest_document(doc.base_manifest_ref or "", parsed.run_id, data, root)


def check_base_bytes(doc: Manifest, data: bytes) -> None:
    """The base manifest's bytes must be exactly the ones the document was written on."""
    found = bytes_checksum(data)
    if found != doc.base_manifest_checksum:
        raise ChainLink(doc.base_manifest_ref or "", doc.base_run_id or "", doc.base_manifest_checksum or "",
                        doc.run_id).altered(found)


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
