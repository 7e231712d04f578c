"""``SnapshotRoot``: everything stored under one output root, read and changed through one object.

The reader, the CLI, the hook, the Spark job and the lifecycle (publish, validate, cleanup) all go
through it: the pointer with its etag and the conditional move that never goes backwards unless
asked, run records (read, list, conditional update), manifests (read against their pointer, find
a run's manifest) and the published history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    ManifestValidationError,
    ObjectNotFoundError,
    PublishManifestError,
    RunRecordError,
    RunSupersededError,
    StorageError,
)
from airflow_provider_shardyfusion.core.model import chain
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer, parse_pointer
from airflow_provider_shardyfusion.core.model.run_record import FAILED, RunError, RunRecord, read_run_record
from airflow_provider_shardyfusion.core.retry import RetryPolicy, call_with_retry, is_storage_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_shardyfusion.core.model.chain import ResolvedManifest
    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.storage.base import ObjectStore, StorageOptions

__all__ = [
    "POINTER_RETRY", "RESOLVED_CACHE_SIZE", "REWRITE_ON_LIVE", "ManifestRef", "ManifestSource", "PointerState",
    "SnapshotRoot", "base_not_live", "forget_decoded_manifests",
]

log = logging.getLogger(__name__)


def base_not_live(run_id: str, base_run_id: str, live_run_id: str | None) -> str:
    """Why a run written on ``base_run_id`` may not go live while ``_CURRENT`` names ``live_run_id``
    (SPEC §13): one wording for the writer's start, its publish and ``PublishSnapshotOperator``."""
    return (f"run {run_id!r} is written on run {base_run_id!r}, but _CURRENT names {live_run_id or 'no run'!r}: "
            f"publishing it would drop that run's changes, so publish refuses it until run {base_run_id!r} is "
            "live again")


REWRITE_ON_LIVE = "Write the change again on the live snapshot (a new delta run)"

# SPEC §6: the pointer write is retried 3 times, after 1 s, 2 s and 4 s.
POINTER_RETRY = RetryPolicy(attempts=4, base_delay_s=1.0, max_delay_s=4.0, deadline_s=None, jitter=False)


class _PointerMoved(PublishManifestError):
    """Our conditional put lost to a concurrent move: read again and decide again."""


@dataclass(frozen=True)
class PointerState:
    """``_CURRENT`` as read, with the etag a conditional replace needs (both ``None``: no pointer)."""

    pointer: CurrentPointer | None
    etag: str | None


@dataclass(frozen=True)
class ManifestRef:
    """A manifest object under the root: where it is, whose run, and when it was published."""

    uri: str
    key: str
    run_id: str
    published_at: datetime


# Decoded manifests (chain documents joined to their bases) kept per process by root and the checksum
# of their bytes: a reader's refresh along a chain then reads and decodes one new manifest, the
# writer's tasks (reused Python workers) decode their base once, and a history page of many chain
# runs decodes each document once. Entries share unchanged shards. A cached manifest is served only
# for the run the path or pointer names (checked again on every hit).
RESOLVED_CACHE_SIZE = 64
_RESOLVED: OrderedDict[tuple[str, str], ResolvedManifest] = OrderedDict()
_RESOLVED_LOCK = threading.Lock()


# What the process last hashed of each manifest it read, by root and key: (size, etag, checksum). A
# chain's bases are checked against it with a HEAD (``SnapshotRoot.check_chain``), and hashed again
# only when the size or ETag moved.
_SEEN: OrderedDict[tuple[str, str], tuple[int, str | None, str]] = OrderedDict()
_SEEN_SIZE = 1024


def forget_decoded_manifests() -> None:
    """Empty the process's cache of decoded manifests (the next read of each decodes it again)."""
    with _RESOLVED_LOCK:
        _RESOLVED.clear()
        _SEEN.clear()


def _remember_bytes(root: str, key: str, size: int, etag: str | None, checksum: str) -> None:
    with _RESOLVED_LOCK:
        _SEEN[(root, key)] = (size, etag, checksum)
        _SEEN.move_to_end((root, key))
        while len(_SEEN) > _SEEN_SIZE:
            _SEEN.popitem(last=False)


def _forget_chains_on(root: str, key: str, link: chain.ChainLink) -> None:
    """Drop what the process knows of a base found altered, and of every chain rebuilt on it: a walk
    finds a base in the cache by the checksum its successor recorded, and would not read it again."""
    ref = link.ref
    with _RESOLVED_LOCK:
        _SEEN.pop((root, key), None)
        _RESOLVED.pop((root, link.checksum), None)
        for cached in [k for k, r in _RESOLVED.items() if k[0] == root and ref in r.ancestors]:
            del _RESOLVED[cached]


class _DecodedManifests:
    """The process's decoded manifests of one root, as the chain walk uses them (``chain.ManifestCache``)."""

    def __init__(self, root: str):
        self.root = root

    def get(self, checksum: str, run_id: str | None) -> ResolvedManifest | None:
        with _RESOLVED_LOCK:
            found = _RESOLVED.get((self.root, checksum))
            if found is not None:
                _RESOLVED.move_to_end((self.root, checksum))
        return found if found is not None and found.manifest.run_id == run_id else None

    def put(self, resolved: ResolvedManifest) -> None:
        with _RESOLVED_LOCK:
            _RESOLVED[(self.root, resolved.checksum)] = resolved
            while len(_RESOLVED) > RESOLVED_CACHE_SIZE:
                _RESOLVED.popitem(last=False)


# What a manifest reader is given: a manifest (its ``ManifestRef`` or URI), or the pointer naming one.
ManifestSource = ManifestRef | str | CurrentPointer


class SnapshotRoot:
    """The snapshots under one output root (``s3://bucket/prefix`` or ``file:///abs/dir``)."""

    def __init__(self, store: ObjectStore):
        self.store = store

    @classmethod
    def open(cls, output_uri: str, storage_options: StorageOptions | dict[str, Any] | None = None) -> SnapshotRoot:
        from airflow_provider_shardyfusion.core.storage import open_store

        return cls(open_store(output_uri, storage_options))

    @property
    def root(self) -> str:
        return self.store.root

    # -- _CURRENT -------------------------------------------------------------------------------

    def read_pointer(self) -> PointerState:
        try:
            obj = self.store.get(layout.CURRENT_KEY)
        except ObjectNotFoundError:
            return PointerState(None, None)
        return PointerState(parse_pointer(obj.data, self.root), obj.etag)

    def read_pointer_if_changed(self, etag: str | None) -> PointerState | None:
        """``_CURRENT`` as read, or None while its etag is still ``etag`` (on S3 a conditional GET)."""
        try:
            obj = self.store.get_if_changed(layout.CURRENT_KEY, etag)
        except ObjectNotFoundError:
            return PointerState(None, None)
        return None if obj is None else PointerState(parse_pointer(obj.data, self.root), obj.etag)

    def current(self) -> CurrentPointer | None:
        return self.read_pointer().pointer

    def move_pointer(
        self,
        manifest: ManifestRef,
        *,
        allow_older: bool = False,
        require_base: bool | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> CurrentPointer:
        """Point ``_CURRENT`` at ``manifest`` with a conditional put on the pointer just read.

        A concurrent move makes it re-read and decide again (never overwrite blindly); transient
        storage errors are retried (1 s, 2 s, 4 s). A run that started before the live one is
        refused unless ``allow_older`` (a rollback). A run written on a base (a delta or a
        compaction) goes live only while ``_CURRENT`` names that base, unless ``require_base`` is
        False (default: ``not allow_older``; a rollback to a run that was live before). Already
        live: returns the live pointer.
        """
        if require_base is None:
            require_base = not allow_older
        data = self.store.get(manifest.key).data
        target = chain.parse_manifest_bytes(manifest.uri, data)
        if target.is_chain_document:
            try:
                # This process may have resolved the chain long ago: its bases must still be what they were.
                self.read_manifest_chain(manifest, check_bases=True)
            except ManifestValidationError as exc:
                raise PublishManifestError(f"run {target.run_id!r} cannot go live: {exc}") from None

        def attempt() -> CurrentPointer:
            state = self.read_pointer()
            live = state.pointer
            if live is not None and live.manifest_ref == manifest.uri:
                return live
            if require_base and target.base_run_id is not None and (live is None or live.run_id != target.base_run_id):
                raise BaseNotLiveError(f"{base_not_live(target.run_id, target.base_run_id, live.run_id if live else None)}. "
                                       f"{REWRITE_ON_LIVE}")
            if live is not None and live.run_id != target.run_id and not allow_older:
                self._refuse_backwards(live, target)
            pointer = CurrentPointer(
                manifest_ref=manifest.uri, run_id=target.run_id, updated_at=layout.utc_now(),
                previous_run_id=live.run_id if live is not None else None,
                manifest_checksum=bytes_checksum(data), manifest_size=len(data),
            )
            if self.store.put_if_match(layout.CURRENT_KEY, pointer.to_bytes(), state.etag) is None:
                raise _PointerMoved("_CURRENT changed while publishing (a concurrent publisher)")
            return pointer

        def give_up(exc: BaseException, attempts: int, _: float) -> PublishManifestError:
            return PublishManifestError(
                f"could not write {self.store.uri(layout.CURRENT_KEY)} after {attempts - 1} retries: {exc}"
            )

        return call_with_retry(
            attempt, policy=POINTER_RETRY, retryable=lambda e: is_storage_error(e) or isinstance(e, _PointerMoved),
            describe=f"run {target.run_id}: moving _CURRENT", give_up=give_up, sleep=sleep,
        )

    def _refuse_backwards(self, live: CurrentPointer, target: Manifest) -> None:
        theirs = self.started_after(live, target)
        if theirs is not None and target.run_started_at is not None:
            raise RunSupersededError(
                f"_CURRENT names run {live.run_id!r}, which started at {layout.format_ts(theirs)}, after run "
                f"{target.run_id!r} ({layout.format_ts(target.run_started_at)}); refusing to move it backwards. "
                "To roll back on purpose use PublishSnapshotOperator(allow_older=True) or "
                "'shardyfusion publish --allow-older'"
            )

    def started_after(self, live: CurrentPointer, target: Manifest) -> datetime | None:
        """When the live run started, if that was after ``target``'s run; else None."""
        try:
            theirs = self.read_manifest_document(live).run_started_at
        except (StorageError, ManifestValidationError) as exc:
            log.warning("live manifest %s is unreadable (%s); treating it as older", live.manifest_ref, exc)
            return None
        ours = target.run_started_at
        return theirs if theirs is not None and ours is not None and theirs > ours else None

    # -- manifests ------------------------------------------------------------------------------

    def manifest_ref(self, uri: str) -> ManifestRef:
        """Parse a manifest URI; refuse anything that is not a manifest under this root."""
        key = self.store.key_of(uri)
        parsed = layout.parse_manifest_key(key)
        if parsed is None:
            raise ManifestValidationError(f"{uri!r} is not a manifest under {self.root}/{layout.MANIFESTS_DIR}/")
        return ManifestRef(uri=self.store.uri(key), key=key, run_id=parsed.run_id, published_at=parsed.published_at)

    def list_manifests(self) -> list[ManifestRef]:
        """Every manifest under the root, oldest write first."""
        found = []
        for info in self.store.list(layout.MANIFESTS_DIR + "/"):
            parsed = layout.parse_manifest_key(info.key)
            if parsed is not None:
                found.append(ManifestRef(self.store.uri(info.key), info.key, parsed.run_id, parsed.published_at))
        return sorted(found, key=lambda m: (m.published_at, m.key))

    def find_manifest(self, run_id: str) -> ManifestRef | None:
        """The run's manifest; the latest one if it was written more than once."""
        layout.validate_run_id(run_id)
        of_run = [m for m in self.list_manifests() if m.run_id == run_id]
        return of_run[-1] if of_run else None

    def resolve_manifest(self, *, run_id: str | None = None, manifest_ref: str | None = None) -> ManifestRef:
        """The manifest a publish, a validation or a delta's base is about: by ``manifest_ref``, else
        the one the run's record names, else the run's newest under ``manifests/``."""
        if manifest_ref is not None:
            ref = self.manifest_ref(manifest_ref)
            if run_id is not None and ref.run_id != run_id:
                raise PublishManifestError(f"manifest_ref {manifest_ref!r} is of run {ref.run_id!r}, not run_id {run_id!r}")
            return ref
        if run_id is None:
            raise PublishManifestError("give run_id or manifest_ref")
        record = self.read_run(run_id)
        if record is not None and record.manifest_ref:
            ref = self.manifest_ref(record.manifest_ref)
            if ref.run_id != run_id:
                raise PublishManifestError(
                    f"the run record of {run_id!r} names manifest {record.manifest_ref!r}, which is run "
                    f"{ref.run_id!r}'s; refusing to publish another run in its name"
                )
            return ref
        found = self.find_manifest(run_id)
        if found is None and record is not None and record.error is not None:
            raise PublishManifestError(
                f"run {run_id!r} failed ({record.error.type}: {record.error.message}); it has no manifest to publish"
            )
        if found is None:
            raise PublishManifestError(
                f"run {run_id!r} has no manifest under {self.root}/{layout.MANIFESTS_DIR}/ (did its write finish?)"
            )
        return found

    def read_manifest_chain(self, source: ManifestSource, *, check_bases: bool = False) -> ResolvedManifest:
        """The run's whole snapshot (a chain document joined to its bases), the checksum of its
        manifest's bytes and the URIs of the base manifests it was rebuilt from, nearest first.

        ``source``: a manifest (``ManifestRef`` or URI), or a pointer, whose manifest is refused
        unless it is exactly the one the pointer was written for. Manifests this process decoded
        before are not read again; with ``check_bases`` the bases are then checked to be still what
        they were (``check_chain``): for what a run is written on, or goes live with.
        """
        cache = _DecodedManifests(self.root)
        if isinstance(source, CurrentPointer):
            walk = chain.walk_pointer(source, self.manifest_ref(source.manifest_ref).key, self.root, cache)
        else:
            ref = self.manifest_ref(source) if isinstance(source, str) else source
            walk = chain.walk_ref(ref.key, ref.uri, ref.run_id, self.root, cache)
        fetched: list[tuple[chain.ManifestFetch, int, str]] = []
        resolved = chain.drive(walk, lambda wanted: self._fetch_manifest(wanted, fetched))
        # What ``check_chain`` compares a later HEAD with, hashed by the walk already: the start's bytes
        # have the resolved checksum, and each base's the one recorded for it (the walk checked them).
        for wanted, size, etag in fetched:
            checksum = wanted.checksum if wanted.base_of is not None else resolved.checksum
            if checksum:
                _remember_bytes(self.root, wanted.key, size, etag, checksum)
        if check_bases:
            self.check_chain(resolved)
        return resolved

    def check_chain(self, resolved: ResolvedManifest) -> None:
        """Refuse, naming it, a base manifest of ``resolved``'s chain whose bytes are no longer the ones
        its successor recorded (or that is gone).

        The process keeps chains it resolved by checksum and does not read their bases again, so a
        long-lived writer (a streaming driver, a service) calls this before it writes on a base and
        when a run goes live. It costs a HEAD per base while its size and ETag are the ones last
        hashed here; the bytes are read and hashed again only when either moved.
        """
        for link in resolved.links:
            key = self.manifest_ref(link.ref).key
            info = self.store.head(key)
            if info is None:
                raise link.missing("it does not exist")
            with _RESOLVED_LOCK:
                seen = _SEEN.get((self.root, key))
            if info.etag is not None and seen == (info.size, info.etag, link.checksum):
                continue
            try:
                obj = self.store.get(key)
            except ObjectNotFoundError:
                raise link.missing("it does not exist") from None
            found = bytes_checksum(obj.data)
            if found != link.checksum:
                _forget_chains_on(self.root, key, link)
                raise link.altered(found)
            _remember_bytes(self.root, key, len(obj.data), obj.etag, found)

    def read_manifest(self, source: ManifestSource) -> Manifest:
        """``read_manifest_chain(source).manifest``: the run's whole snapshot, for the callers that
        need neither its checksum nor its bases."""
        return self.read_manifest_chain(source).manifest

    def read_manifest_document(self, source: ManifestSource) -> Manifest:
        """The manifest as stored, its chain not followed: for the run's own fields (``run_started_at``,
        ``chain_depth``, ``base_run_id``); a delta's ``shards`` are only those it changed. A pointer's
        manifest is checked against the pointer."""
        if isinstance(source, CurrentPointer):
            data = self.store.get(self.manifest_ref(source.manifest_ref).key).data
            return chain.manifest_for_pointer(source, data, self.root)
        ref = self.manifest_ref(source) if isinstance(source, str) else source
        return chain.manifest_document(ref.uri, ref.run_id, self.store.get(ref.key).data, self.root)

    def _fetch_manifest(self, wanted: chain.ManifestFetch, fetched: list[tuple[chain.ManifestFetch, int, str]],
                        ) -> bytes | None:
        """The chain walk's fetch: the manifest asked for is read as it is (noted in ``fetched`` with its
        size and etag); an unreadable base is named."""
        if wanted.base_of is None:
            obj = self.store.get(wanted.key)
        else:
            try:
                obj = self.store.get(wanted.key)
            except ObjectNotFoundError:
                return None
            except StorageError as exc:
                raise wanted.unreadable(str(exc)) from None
        fetched.append((wanted, len(obj.data), obj.etag))
        return obj.data

    def write_manifest(self, manifest: Manifest) -> ManifestRef:
        """Write a new, immutable manifest object for its run."""
        manifest.validate()
        key = layout.manifest_key(manifest.run_id, layout.utc_now())
        if not self.store.put_if_absent(key, manifest.to_bytes()):
            raise PublishManifestError(f"manifest {self.store.uri(key)} already exists; manifests are immutable")
        return self.manifest_ref(self.store.uri(key))

    # -- run records ----------------------------------------------------------------------------

    def read_run(self, run_id: str) -> RunRecord | None:
        return read_run_record(self.store, run_id)

    def run_record_ref(self, run_id: str) -> str:
        return self.store.uri(layout.run_record_key(run_id))

    def list_run_ids(self) -> list[str]:
        found = (layout.parse_run_record_key(o.key) for o in self.store.list(layout.RUNS_DIR + "/"))
        return sorted(r for r in found if r)

    def iter_runs(self, *, parallel: int = 1) -> Iterator[tuple[str, RunRecord | None, Exception | None]]:
        """``(run_id, record, error)`` for every record, in run id order; one bad record does not hide
        the others. ``parallel`` > 1 reads that many records at a time (a root of a thousand runs
        is a thousand round trips to S3)."""
        def read(run_id: str) -> tuple[str, RunRecord | None, Exception | None]:
            try:
                return run_id, self.read_run(run_id), None
            except (RunRecordError, StorageError) as exc:
                return run_id, None, exc

        run_ids = self.list_run_ids()
        if parallel <= 1 or len(run_ids) <= 1:
            yield from map(read, run_ids)
            return
        with ThreadPoolExecutor(max_workers=min(parallel, len(run_ids)), thread_name_prefix="run-records") as pool:
            yield from pool.map(read, run_ids)

    def update_run(self, run_id: str, change: Callable[[RunRecord], RunRecord | None], *,
                   attempts: int = 5) -> RunRecord | None:
        """Apply ``change`` to the record with a conditional put, re-reading on a concurrent change.

        ``change`` returns the new record, or ``None`` to leave it as it is. Returns what is stored.
        """
        key = layout.run_record_key(run_id)
        for _ in range(attempts):
            try:
                obj = self.store.get(key)
            except ObjectNotFoundError:
                return None
            record = RunRecord.from_bytes(obj.data)
            new = change(record)
            if new is None:
                return record
            new = replace(new, updated_at=layout.utc_now()).validate()
            if self.store.put_if_match(key, new.to_bytes(), obj.etag) is not None:
                return new
        raise RunRecordError(f"run record {self.store.uri(key)} kept changing; gave up after {attempts} attempts")

    def mark_failed(self, run_id: str, error: RunRecordError, *,
                    clock: Callable[[], datetime] = layout.utc_now) -> RunRecord | None:
        """Mark a still-running record failed from outside the writer (``RunKilled``, ``RunAbandoned``).

        One conditional put on the version read, so a writer finishing (or renewing its lease) at
        the same moment wins and what it stored is returned; the caller decides whether to try
        again. Because the writer turns its record ``succeeded`` (conditionally, over its own last
        version) before it moves ``_CURRENT``, a run marked failed here can never become live
        afterwards. None: no such record.
        """
        key = layout.run_record_key(run_id)
        try:
            obj = self.store.get(key)
        except ObjectNotFoundError:
            return None
        record = RunRecord.from_bytes(obj.data)
        if record.is_terminal:
            return record
        now = clock()
        failed = replace(record, status=FAILED, updated_at=now, finished_at=now,
                         error=RunError(type=type(error).__name__, message=str(error)))
        if self.store.put_if_match(key, failed.to_bytes(), obj.etag) is None:
            return self.read_run(run_id)
        return failed

    def mark_published(self, run_id: str, when: datetime | None = None) -> RunRecord | None:
        stamp = when or layout.utc_now()
        # The pointer moved: the publisher's claim has done its work, so cleanup need not wait on it.
        return self.update_run(run_id, lambda r: replace(r, published_at=stamp, publishing_at=None))

    # -- history --------------------------------------------------------------------------------

    def published_history(self) -> list[CurrentPointer]:
        """The pointer as it was after each publish still recorded in run records, newest first.

        Derived from ``published_at`` of the run records and the manifests on storage, so it stays
        available after ``_CURRENT`` moved on (e.g. to find what to roll back to).
        """
        manifests = {m.run_id: m for m in self.list_manifests()}
        out = []
        for run_id, record, _ in self.iter_runs():
            if record is None or record.published_at is None or record.deleted_at is not None:
                continue
            ref = manifests.get(run_id)
            if ref is not None:
                out.append(CurrentPointer(manifest_ref=ref.uri, run_id=run_id, updated_at=record.published_at))
        return sorted(out, key=lambda p: p.updated_at, reverse=True)


