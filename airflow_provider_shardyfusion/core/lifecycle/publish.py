"""Publishing: the writer's two-phase publish (SPEC §6 steps 11–13) and the later publish or
rollback of a staged run (SPEC §8, ``PublishSnapshotOperator``).

The writer's order is the fence that keeps a failed run from ever going live: manifest, then the
run record turned ``succeeded`` by a conditional put over the writer's own last version, and only
then ``_CURRENT``. Anyone who marked the run failed first (a kill, a cleanup reaping an expired
lease) changed the record, so the conditional put fails and the pointer is never moved; and a
``succeeded`` record is never marked failed afterwards (``mark_failed`` only touches running runs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import (
    BaseNotLiveError,
    ClockSkewError,
    PublishManifestError,
    RunRecordError,
    RunSupersededError,
    StorageError,
)
from airflow_provider_shardyfusion.core.lifecycle import integrity
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import (
    PUBLISH_CLAIM_TTL,
    RunRecord,
    RunRecordLifecycle,
    check_storage_clock,
)
from airflow_provider_shardyfusion.core.model.snapshot import POINTER_RETRY, ManifestRef, SnapshotRoot
from airflow_provider_shardyfusion.core.retry import call_with_retry, is_storage_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.storage.base import ObjectStore

__all__ = [
    "PublishResult", "delete_losing_attempts", "mark_succeeded", "publish", "publish_run", "release_publish_claim",
]

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
) -> RunRecord:
    """Write the manifest, mark the run succeeded (fenced), then move ``_CURRENT``.

    ``live=False`` stages the run (SPEC §8): ``_CURRENT`` is left alone and
    ``PublishSnapshotOperator`` makes it live later. ``before_pointer_move`` runs between the two
    (the reliability tests hold and kill the writer there). Returns the final run record.
    """
    snapshots = SnapshotRoot(store)
    ref = snapshots.write_manifest(manifest)
    log.info("run %s: manifest written to %s", manifest.run_id, ref.uri)
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
    return _stamp_published(snapshots, manifest.run_id) or record


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


def _stamp_published(snapshots: SnapshotRoot, run_id: str) -> RunRecord | None:
    """Record ``published_at``; the pointer already moved, so a failure here is logged, not raised."""
    try:
        return snapshots.mark_published(run_id)
    except (StorageError, RunRecordError) as exc:
        log.warning("run %s is live but published_at could not be recorded: %s", run_id, exc)
        return None


@dataclass(frozen=True)
class PublishResult:
    """What a publish did: the pointer now live, the one it replaced, and whether it moved at all."""

    pointer: CurrentPointer
    previous_run_id: str | None
    moved: bool
    rollback: bool

    def to_dict(self) -> dict[str, Any]:
        return {"pointer": self.pointer.to_dict(), "previous_run_id": self.previous_run_id,
                "moved": self.moved, "rollback": self.rollback}


def publish_run(
    snapshots: SnapshotRoot,
    *,
    run_id: str | None = None,
    manifest_ref: str | None = None,
    allow_older: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], datetime] = layout.utc_now,
) -> PublishResult:
    """Make a staged (or older) run live: claim, check, then a conditional move of ``_CURRENT``.

    The run record is claimed first (``publishing_at``, conditional put), so a cleanup that has not
    begun deleting the run leaves it alone, and one that has is seen here (``deleting_at``). Then
    ``core.lifecycle.integrity`` always checks the record, the manifest bytes and the files; any problem, or
    a run older than the live one without ``allow_older``, refuses the publish with everything that
    is wrong. Publishing the run that is already live is a no-op success.
    """
    ref = snapshots.resolve_manifest(run_id=run_id, manifest_ref=manifest_ref)
    claimed = _claim_for_publish(snapshots, ref, clock)
    try:
        return _checked_move(snapshots, ref, claimed, allow_older=allow_older, sleep=sleep, clock=clock)
    except BaseException:
        release_publish_claim(snapshots, ref.run_id)  # refused or failed: cleanup need not wait on us
        raise


def release_publish_claim(snapshots: SnapshotRoot, run_id: str) -> RunRecord | None:
    """Clear ``publishing_at`` once a publish is over without moving the pointer; best effort
    (a claim left behind only delays cleanup of the run by ``PUBLISH_CLAIM_TTL``)."""
    try:
        return snapshots.update_run(run_id, lambda r: replace(r, publishing_at=None) if r.publishing_at else None)
    except (StorageError, RunRecordError) as exc:
        log.warning("run %s: could not clear its publish claim (cleanup waits %s): %s", run_id, PUBLISH_CLAIM_TTL, exc)
        return None


def _checked_move(snapshots: SnapshotRoot, ref: ManifestRef, claimed: RunRecord, *, allow_older: bool,
                  sleep: Callable[[float], None], clock: Callable[[], datetime]) -> PublishResult:
    data = snapshots.store.get(ref.key).data
    problems = integrity.manifest_problems(claimed, ref, data)
    manifest = None if problems else snapshots.read_manifest(ref)
    if manifest is not None:
        problems = integrity.check_storage(snapshots, manifest)
    if problems or manifest is None:
        raise PublishManifestError(_refusal(ref, problems))
    layer_runs = sorted(manifest.layer_run_ids() - {ref.run_id})
    try:
        _claim_layer_runs(snapshots, ref, layer_runs, clock)
        return _move(snapshots, ref, manifest, claimed, allow_older=allow_older, sleep=sleep, clock=clock)
    finally:
        for layer_run in layer_runs:
            release_publish_claim(snapshots, layer_run)


def _claim_layer_runs(snapshots: SnapshotRoot, ref: ManifestRef, layer_runs: list[str],
                      clock: Callable[[], datetime]) -> None:
    """A chain reads the layers of earlier runs: claim each against cleanup, as the run itself is claimed."""
    for layer_run in layer_runs:
        where = f"run record {snapshots.run_record_ref(layer_run)} (its layers are part of run {ref.run_id!r})"
        problems: list[str] = []

        def claim(record: RunRecord, where: str = where, problems: list[str] = problems) -> RunRecord | None:
            problems[:] = integrity.deletion_problems(record, where)
            return None if problems else replace(record, publishing_at=clock())

        if snapshots.update_run(layer_run, claim) is None and not problems:
            problems.append(f"{where} does not exist")
        if problems:
            raise PublishManifestError(_refusal(ref, problems))


def _move(snapshots: SnapshotRoot, ref: ManifestRef, manifest: Manifest, claimed: RunRecord, *, allow_older: bool,
          sleep: Callable[[float], None], clock: Callable[[], datetime]) -> PublishResult:
    if clock() - (claimed.publishing_at or clock()) > PUBLISH_CLAIM_TTL:
        # Cleanup ignores a claim older than this: past it, the run's data may be going.
        raise PublishManifestError(_refusal(ref, [f"checking took longer than the claim holds ({PUBLISH_CLAIM_TTL})"]))
    before = snapshots.current()
    # A chain's run that was never live needs its base live even in a rollback: its changes were
    # computed on that base. One that was live before is a self-contained snapshot to go back to.
    require_base = not allow_older or claimed.published_at is None
    pointer = snapshots.move_pointer(ref, allow_older=allow_older, require_base=require_base, sleep=sleep)
    moved = before is None or before.manifest_ref != pointer.manifest_ref
    # The pointer this publish replaced is the one its successful conditional put read, which
    # differs from ``before`` when a concurrent publisher moved it in between.
    previous = pointer.previous_run_id if moved else (before.run_id if before else None)
    rollback = moved and before is not None and snapshots.started_after(before, manifest) is not None
    if moved or claimed.published_at is None:
        _stamp_published(snapshots, ref.run_id)
    else:
        release_publish_claim(snapshots, ref.run_id)
    log.info("%s: _CURRENT %s run %s (was %s)", snapshots.root,
             "now names" if moved else "already named", ref.run_id, previous)
    return PublishResult(pointer=pointer, previous_run_id=previous, moved=moved, rollback=rollback)


def _refusal(ref: ManifestRef, problems: list[str]) -> str:
    return f"refusing to publish run {ref.run_id!r} ({ref.uri}): " + "; ".join(problems) + "; _CURRENT unchanged"


def _claim_for_publish(snapshots: SnapshotRoot, ref: ManifestRef, clock: Callable[[], datetime]) -> RunRecord:
    """Stamp ``publishing_at`` on the run's record by a conditional put, refusing an unpublishable run.

    The rules are checked on the record the put replaces: a cleanup that claimed the run first
    (``deleting_at``) makes the put fail, the record is read again, and the publish is refused.
    """
    where = f"run record {snapshots.run_record_ref(ref.run_id)}"
    problems: list[str] = []

    def claim(record: RunRecord) -> RunRecord | None:
        problems[:] = integrity.record_problems(record, ref, where)
        if record.manifest_ref is None:
            problems.append(f"{where}: names no manifest")
        return None if problems else replace(record, publishing_at=clock())

    stored = snapshots.update_run(ref.run_id, claim)
    if stored is None:
        problems = [f"{where} does not exist"]
    if problems or stored is None:
        raise PublishManifestError(_refusal(ref, problems))
    if stored.publishing_at is not None:
        # Cleanup judges this claim by its own clock: a publisher's clock far off would make the
        # claim look expired (or everlasting) to it.
        try:
            check_storage_clock(snapshots.store, layout.run_record_key(ref.run_id), stored.publishing_at,
                                "the machine publishing")
        except ClockSkewError:
            release_publish_claim(snapshots, ref.run_id)
            raise
    return stored


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
