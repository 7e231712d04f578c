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
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer, parse_pointer
from airflow_provider_shardyfusion.core.model.run_record import RunRecord, read_run_record
from airflow_provider_shardyfusion.core.retry import RetryPolicy, call_with_retry, is_storage_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_shardyfusion.core.storage.base import ObjectStore, StorageOptions

__all__ = [
    "POINTER_RETRY", "RESOLVED_CACHE_SIZE", "REWRITE_ON_LIVE", "ManifestRef", "PointerState", "ResolvedManifest",
    "SnapshotRoot", "base_document", "base_manifest_key", "base_not_live", "check_shard_urls", "forget_decoded_manifests",
    "manifest_document", "manifest_for_pointer", "parse_manifest_bytes",
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


def forget_decoded_manifests() -> None:
    """Empty the process's cache of decoded manifests (the next read of each decodes it again)."""
    with _RESOLVED_LOCK:
        _RESOLVED.clear()


@dataclass(frozen=True)
class ResolvedManifest:
    """A manifest as readers use it, the checksum of its stored bytes, and the manifests of its chain
    it was rebuilt from (nearest first)."""

    manifest: Manifest
    checksum: str
    ancestors: tuple[str, ...] = ()


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
        target = self._manifest_from_bytes(manifest.uri, data)

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
            theirs = self.load_manifest_document(live).run_started_at
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

    def read_manifest(self, ref: ManifestRef | str) -> Manifest:
        """The run's whole snapshot (a chain document joined to its base chain)."""
        return self.read_manifest_chain(ref).manifest

    def read_manifest_chain(self, ref: ManifestRef | str) -> ResolvedManifest:
        """``read_manifest`` and the URIs of the base manifests it was rebuilt from, nearest first."""
        ref = self.manifest_ref(ref) if isinstance(ref, str) else ref
        data = self.store.get(ref.key).data
        checksum = bytes_checksum(data)
        cached = self._cached(checksum)
        if cached is not None and cached.manifest.run_id == ref.run_id:
            return cached
        return self._resolve(self._document(ref, data), checksum)

    def load_manifest(self, pointer: CurrentPointer) -> Manifest:
        """The manifest ``pointer`` names, refused unless it is exactly the one the pointer was written for."""
        return self.load_manifest_chain(pointer).manifest

    def load_manifest_chain(self, pointer: CurrentPointer) -> ResolvedManifest:
        """``load_manifest`` with the checksum of the pointer's manifest and the chain it was rebuilt from."""
        ref = self.manifest_ref(pointer.manifest_ref)
        data = self.store.get(ref.key).data
        checksum = bytes_checksum(data)
        pointer.check_manifest_bytes(data, checksum)
        cached = self._cached(checksum)
        if cached is not None and cached.manifest.run_id == pointer.run_id:
            return cached
        return self._resolve(manifest_for_pointer(pointer, data, self.root, checksum=checksum), checksum)

    def read_manifest_document(self, ref: ManifestRef | str) -> Manifest:
        """The manifest as stored, its chain not followed: for the run's own fields (``run_started_at``,
        ``chain_depth``, ``base_run_id``); a delta's ``shards`` are only those it changed."""
        ref = self.manifest_ref(ref) if isinstance(ref, str) else ref
        return self._document(ref, self.store.get(ref.key).data)

    def load_manifest_document(self, pointer: CurrentPointer) -> Manifest:
        """``read_manifest_document`` of the manifest ``pointer`` names, checked against the pointer."""
        ref = self.manifest_ref(pointer.manifest_ref)
        return manifest_for_pointer(pointer, self.store.get(ref.key).data, self.root)

    def _document(self, ref: ManifestRef, data: bytes) -> Manifest:
        return manifest_document(ref.uri, ref.run_id, data, self.root)

    def _resolve(self, doc: Manifest, checksum: str) -> ResolvedManifest:
        """Join a chain document to its bases, reading only the manifests not resolved before."""
        if not doc.is_chain_document:
            whole = ResolvedManifest(doc, checksum)
            self._remember(checksum, whole)
            return whole
        pending: list[tuple[Manifest, str]] = []
        while True:
            pending.append((doc, checksum))
            base_checksum = doc.base_manifest_checksum or ""
            found = self._cached(base_checksum)
            if found is not None and found.manifest.run_id == doc.base_run_id:
                break
            base = self._base_document(doc)
            if not base.is_chain_document:
                found = ResolvedManifest(base, base_checksum)
                self._remember(base_checksum, found)
                break
            doc, checksum = base, base_checksum
        assert found is not None  # the loop ends on a cached or a self-contained manifest
        for doc, checksum in reversed(pending):
            found = ResolvedManifest(chain.resolve(doc, found.manifest), checksum,
                                     (doc.base_manifest_ref or "", *found.ancestors))
            self._remember(checksum, found)
        return found

    def _base_document(self, doc: Manifest) -> Manifest:
        try:
            data = self.store.get(base_manifest_key(doc, self.root)).data
        except ObjectNotFoundError:
            raise chain.missing_base(doc, "it does not exist") from None
        except StorageError as exc:
            raise chain.missing_base(doc, str(exc)) from None
        return base_document(doc, data, self.root)

    def _cached(self, checksum: str) -> ResolvedManifest | None:
        with _RESOLVED_LOCK:
            found = _RESOLVED.get((self.root, checksum))
            if found is not None:
                _RESOLVED.move_to_end((self.root, checksum))
            return found

    def _remember(self, checksum: str, resolved: ResolvedManifest) -> None:
        with _RESOLVED_LOCK:
            _RESOLVED[(self.root, checksum)] = resolved
            while len(_RESOLVED) > RESOLVED_CACHE_SIZE:
                _RESOLVED.popitem(last=False)

    @staticmethod
    def _manifest_from_bytes(where: str, data: bytes) -> Manifest:
        return parse_manifest_bytes(where, data)

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


def base_manifest_key(doc: Manifest, root: str) -> str:
    """The key of a chain document's base manifest, refused unless it is a manifest under ``root``."""
    try:
        key = layout.relative_key(root, doc.base_manifest_ref or "")
    except ManifestValidationError as exc:
        raise chain.missing_base(doc, str(exc)) from None
    if layout.parse_manifest_key(key) is None:
        raise chain.missing_base(doc, f"it is not a manifest under {root}/{layout.MANIFESTS_DIR}/")
    return key


def base_document(doc: Manifest, data: bytes, root: str) -> Manifest:
    """A chain document's base manifest document from its stored bytes: exactly the bytes it was
    written on (checksum), of its base run, its shards in their own folders under ``root``."""
    chain.check_base_bytes(doc, data)
    parsed = layout.parse_manifest_key(base_manifest_key(doc, root))
    assert parsed is not None  # base_manifest_key refuses anything else
    return manifest_document(doc.base_manifest_ref or "", parsed.run_id, data, root)


def manifest_for_pointer(pointer: CurrentPointer, data: bytes, root: str, *, checksum: str | None = None) -> Manifest:
    """Check manifest bytes against the pointer that names them (pure: async callers read the bytes).

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
