"""The writer's commit (SPEC §6 steps 11–13): manifest, run record ``succeeded``, then ``_CURRENT``.

The order is the fence that keeps a failed run from ever going live: manifest, then the run record
turned ``succeeded`` by a conditional put over the writer's own last version, and only then
``_CURRENT``. Anyone who marked the run failed first (a kill, a cleanup reaping an expired lease)
changed the record, so the conditional put fails and the pointer is never moved; and a
``succeeded`` record is never marked failed afterwards (``mark_failed`` only touches running runs).
Then the losing attempts of the run's shards are deleted, best effort.

Publishing a staged run later, or rolling back, is ``core.lifecycle.publish.publish_run``'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    PublishManifestError,
    RunRecordError,
    RunSupersededError,
    StorageError,
)
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.run_record import PUBLISH_CLAIM_TTL
from airflow_provider_shardyfusion.core.model.snapshot import POINTER_RETRY, SnapshotRoot
from airflow_provider_shardyfusion.core.retry import call_with_retry, is_storage_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.model.run_record import RunRecord, RunRecordLifecycle
    from airflow_provider_shardyfusion.core.storage.base import ObjectStore

__all__ = ["delete_losing_attempts", "mark_succeeded", "publish", "release_publish_claim", "stamp_published"]

log = logging.getLogger(__name__)


def publish(
    store: ObjectStore,
    manifest: Manifest,
    lifecycle: RunRecordLifecycle,
    *,
    stats: dict[str, Any] | None = None,
    allow_rollback: bool = False,
    live: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    before_pointer_move: Callable[[], None] | None = None,
    fence: Callable[[], None] | None = None,
) -> RunRecord:
    """Write the manifest, mark the run succeeded (fenced), then move ``_CURRENT``.

    ``live=False`` stages the run (SPEC §8): ``_CURRENT`` is left alone and
    ``PublishSnapshotOperator`` makes it live later. ``before_pointer_move`` runs between the two
    (the reliability tests hold and kill the writer there). ``fence`` runs just before the run is
    marked succeeded: what it raises refuses the commit while the record is still running, so the
    run fails instead of staying a succeeded run that could be published later (a streaming writer
    checks there that it still holds its stream). Returns the final run record.
    """
    snapshots = SnapshotRoot(store)
    ref = snapshots.write_manifest(manifest)
    log.info("run %s: manifest written to %s", manifest.run_id, ref.uri)
    if fence is not None:
        fence()
    data = manifest.to_bytes()  # what write_manifest stored: its identity goes into the record
    record = mark_succeeded(lifecycle, ref.uri, stats if stats is not None else dict(manifest.stats), sleep=sleep,
                            manifest_checksum=bytes_checksum(data), manifest_size=len(data), publishing=live)
    if not live:
        log.info("run %s: staged (publish=False); _CURRENT left unchanged", manifest.run_id)
        return record
    if before_pointer_move is not None:
        before_pointer_move()
    try:
        snapshots.move_pointer(ref, allow_older=allow_rollback, sleep=sleep)
    except RunSupersededError as exc:
        # Not a failure of this run: newer data is live, and failing would invite a retry that
        # publishes this older input over it under a fresh (newer) run id.
        log.warning("run %s: superseded, so it stays staged (written, recorded succeeded, not live): %s",
                    manifest.run_id, exc)
        return release_publish_claim(snapshots, manifest.run_id) or record
    except BaseNotLiveError as exc:
        # The base stopped being live while the run was written: a publish now would be refused too.
        release_publish_claim(snapshots, manifest.run_id)
        raise BaseNotLiveError(f"run {manifest.run_id!r} is written and recorded succeeded, but stays staged: {exc}") from exc
    except PublishManifestError as exc:
        release_publish_claim(snapshots, manifest.run_id)
        raise PublishManifestError(
            f"run {manifest.run_id!r} is written and recorded succeeded, but _CURRENT was not moved to it: {exc}. "
            "It stays staged; publish it with PublishSnapshotOperator or 'shardyfusion publish'"
        ) from exc
    log.info("run %s: _CURRENT now points at %s", manifest.run_id, ref.uri)
    return stamp_published(snapshots, manifest.run_id) or record


def mark_succeeded(lifecycle: RunRecordLifecycle, manifest_ref: str, stats: dict[str, Any], *,
                   sleep: Callable[[float], None] = time.sleep, manifest_checksum: str | None = None,
                   manifest_size: int | None = None, publishing: bool = False) -> RunRecord:
    """Turn our running record ``succeeded``; transient storage errors are retried (1 s, 2 s, 4 s).

    A record someone else changed (killed, reaped) is never overwritten: the run cannot publish.
    The record keeps the manifest's checksum and size, so a manifest edited later is refused by
    publish and validation; ``publishing`` claims the run for the pointer move that follows.
    """
    def attempt() -> RunRecord:
        try:
            return lifecycle.succeed(manifest_ref, stats, manifest_checksum=manifest_checksum,
                                     manifest_size=manifest_size, publishing=publishing)
        except RunRecordError as exc:
            raise PublishManifestError(
                f"run record of {lifecycle.record.run_id!r} is no longer 'running' (killed, or reaped as "
                f"abandoned?); _CURRENT left unchanged: {exc}"
            ) from exc

    def give_up(exc: BaseException, attempts: int, _: float) -> PublishManifestError:
        return PublishManifestError(
            f"the run record of {lifecycle.record.run_id!r} could not be marked succeeded, so the run was "
            f"not published (_CURRENT unchanged; manifest {manifest_ref}): {exc}"
        )

    return call_with_retry(attempt, policy=POINTER_RETRY, retryable=is_storage_error,
                           describe=f"run {lifecycle.record.run_id}: marking the run record succeeded",
                           give_up=give_up, sleep=sleep)


def stamp_published(snapshots: SnapshotRoot, run_id: str) -> RunRecord | None:
    """Record ``published_at``; the pointer already moved, so a failure here is logged, not raised."""
    try:
        return snapshots.mark_published(run_id)
    except (StorageError, RunRecordError) as exc:
        log.warning("run %s is live but published_at could not be recorded: %s", run_id, exc)
        return None


def release_publish_claim(snapshots: SnapshotRoot, run_id: str) -> RunRecord | None:
    """Clear ``publishing_at`` once a publish is over without moving the pointer; best effort
    (a claim left behind only delays cleanup of the run by ``PUBLISH_CLAIM_TTL``)."""
    try:
        return snapshots.update_run(run_id, lambda r: replace(r, publishing_at=None) if r.publishing_at else None)
    except (StorageError, RunRecordError) as exc:
        log.warning("run %s: could not clear its publish claim (cleanup waits %s): %s", run_id, PUBLISH_CLAIM_TTL, exc)
        return None


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
