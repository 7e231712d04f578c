"""Two-phase publish (SPEC §6 steps 11–13): manifest, own-record check, then ``_CURRENT``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import layout
from .errors import ManifestValidationError, ObjectNotFoundError, PublishManifestError, StorageError
from .manifest import Manifest
from .pointer import CurrentPointer, read_current
from .run_record import RunRecord, RunRecordLifecycle
from .storage.base import ObjectStore

log = logging.getLogger(__name__)

CURRENT_RETRY_BACKOFF_S = (1.0, 2.0, 4.0)


def _run_started_at(store: ObjectStore, pointer: CurrentPointer) -> str | None:
    try:
        manifest = Manifest.from_bytes(store.get(store.key_of(pointer.manifest_ref)).data)
    except (ObjectNotFoundError, ManifestValidationError) as exc:
        log.warning("current manifest %s is unreadable (%s); treating it as older", pointer.manifest_ref, exc)
        return None
    return manifest.stats.get("run_started_at")


def _refuse_backwards(store: ObjectStore, current: CurrentPointer, manifest: Manifest) -> None:
    ours = manifest.stats.get("run_started_at")
    theirs = _run_started_at(store, current)
    if theirs is not None and ours is not None and theirs > ours:
        raise PublishManifestError(
            f"_CURRENT names run {current.run_id!r}, which started at {theirs}, after this run "
            f"({manifest.run_id!r}, {ours}); refusing to move it backwards (pass allow_rollback=True to force)"
        )


def write_current(
    store: ObjectStore,
    manifest: Manifest,
    manifest_ref: str,
    *,
    allow_rollback: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> CurrentPointer:
    """Point ``_CURRENT`` at ``manifest_ref`` with a conditional put, 3 retries (1 s, 2 s, 4 s).

    Refuses to move to a run that started before the run currently named, unless
    ``allow_rollback``: a slow old run must not replace a newer snapshot.
    """
    pointer = CurrentPointer(manifest_ref=manifest_ref, run_id=manifest.run_id, updated_at=layout.utc_now())
    last_error: Exception | None = None
    for attempt, backoff in enumerate((*CURRENT_RETRY_BACKOFF_S, None)):
        try:
            current, etag = read_current(store)
        except Exception as exc:  # transient storage errors: retry with backoff
            last_error = exc
        else:
            if current is not None and current.run_id != manifest.run_id and not allow_rollback:
                _refuse_backwards(store, current, manifest)
            try:
                if store.put_if_match(layout.CURRENT_KEY, pointer.to_bytes(), etag) is not None:
                    return pointer
                last_error = PublishManifestError("_CURRENT changed while publishing (concurrent writer)")
            except Exception as exc:
                last_error = exc
        if backoff is None:
            break
        log.warning("run %s: writing _CURRENT failed (%s); retry %d in %.0fs", manifest.run_id, last_error, attempt + 1, backoff)
        sleep(backoff)
    raise PublishManifestError(
        f"could not write {store.uri(layout.CURRENT_KEY)} after {len(CURRENT_RETRY_BACKOFF_S)} retries: {last_error}"
    )


def publish(
    store: ObjectStore,
    manifest: Manifest,
    lifecycle: RunRecordLifecycle,
    *,
    allow_rollback: bool = False,
    live: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Write the manifest, re-check our run record, then move ``_CURRENT``. Returns the manifest URI.

    ``live=False`` stages the run (SPEC §8): the manifest is written and checked, ``_CURRENT`` is
    left alone, and ``PublishSnapshotOperator`` makes it live later.
    """
    manifest.validate()
    key = layout.manifest_key(manifest.run_id, layout.utc_now())
    if not store.put_if_absent(key, manifest.to_bytes()):
        raise PublishManifestError(f"manifest {store.uri(key)} already exists; manifests are immutable")
    manifest_ref = store.uri(key)
    log.info("run %s: manifest written to %s", manifest.run_id, manifest_ref)
    if not lifecycle.still_running():
        raise PublishManifestError(
            f"run record of {manifest.run_id!r} is no longer 'running' (reaped as abandoned?); _CURRENT left unchanged"
        )
    if not live:
        log.info("run %s: staged (publish=False); _CURRENT left unchanged", manifest.run_id)
        return manifest_ref
    write_current(store, manifest, manifest_ref, allow_rollback=allow_rollback, sleep=sleep)
    log.info("run %s: _CURRENT now points at %s", manifest.run_id, manifest_ref)
    return manifest_ref


def mark_succeeded(lifecycle: RunRecordLifecycle, manifest_ref: str, stats: dict[str, Any], *,
                   sleep: Callable[[float], None] = time.sleep) -> RunRecord:
    """Step 12 after a publish: retried like ``_CURRENT``, since the snapshot is already live and a
    transient storage error must not leave its run record looking failed."""
    for backoff in (*CURRENT_RETRY_BACKOFF_S, None):
        try:
            return lifecycle.succeed(manifest_ref, stats)
        except StorageError as exc:
            if backoff is None:
                raise PublishManifestError(
                    f"snapshot {lifecycle.record.run_id!r} is live (_CURRENT names {manifest_ref}) but its run record "
                    f"could not be marked succeeded: {exc}"
                ) from exc
            log.warning("run %s: marking the run record succeeded failed (%s); retrying in %.0fs",
                        lifecycle.record.run_id, exc, backoff)
            sleep(backoff)
    raise AssertionError("unreachable")


def delete_losing_attempts(store: ObjectStore, run_id: str, winner_urls: Iterable[str]) -> tuple[int, list[tuple[str, str]]]:
    """Best effort: delete every object of this run's shards not under a winning attempt."""
    keep = tuple(store.key_of(u).rstrip("/") + "/" for u in winner_urls)
    prefix = layout.shards_prefix(run_id)
    try:
        doomed = [o.key for o in store.list(prefix) if not o.key.startswith(keep)]
        failures = store.delete_many(doomed) if doomed else []
    except Exception as exc:  # the snapshot is already live: a failed clean-up must not fail the run
        log.warning("run %s: could not delete losing attempts under %s: %s", run_id, prefix, exc)
        return 0, [(prefix, f"{type(exc).__name__}: {exc}")]
    for key, err in failures:
        log.warning("run %s: could not delete losing attempt object %s: %s", run_id, key, err)
    return len(doomed) - len(failures), failures
