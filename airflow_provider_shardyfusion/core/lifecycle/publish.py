"""Publishing a staged run later, or rolling back to an older one (SPEC §8, ``PublishSnapshotOperator``,
``shardyfusion publish``). The Spark jobs never call it: a streaming batch left staged is written again.

The writer's own publish at the end of its run (manifest, run record, ``_CURRENT``) is
``core.write.commit``'s; both release their publish claim the same way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ClockSkewError, PublishManifestError
from airflow_provider_shardyfusion.core.lifecycle import integrity
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import PUBLISH_CLAIM_TTL, RunRecord, check_storage_clock
from airflow_provider_shardyfusion.core.write.commit import release_publish_claim, stamp_published

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef, SnapshotRoot

__all__ = ["PublishResult", "publish_run"]

log = logging.getLogger(__name__)


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
        stamp_published(snapshots, ref.run_id)
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
