"""Whether a written run may go live: the rules publish always applies and validation reports.

Written once, here: a publish of a written run (``PublishSnapshotOperator``, the CLI) and the
validation gate must never disagree on what makes a run publishable. The writer's own publish
(``core.write.commit.publish``) does not re-check what it has just written and recorded itself: it is the
source of the manifest identity these rules compare against.

- ``record_problems``: the run record says the run ``succeeded``, names exactly this manifest,
  and its data is neither deleted nor being deleted by cleanup; a failed run is named with its
  own error.
- ``manifest_problems``: the manifest bytes are the ones the writer finished with (the checksum
  and size it recorded in the run record), and they describe the run they are filed under.
- ``check_storage``: every file the manifest names (data and key indexes) is on storage with its
  recorded size (and checksum, when asked).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardyfusionError
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum, download_verified
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardFile
    from airflow_provider_shardyfusion.core.model.run_record import RunRecord
    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef, SnapshotRoot
    from airflow_provider_shardyfusion.core.storage.base import ObjectStore

__all__ = ["check_storage", "deletion_problems", "manifest_problems", "record_problems"]


def deletion_problems(record: RunRecord, where: str) -> list[str]:
    """Whether cleanup deleted (or began deleting) the run's data, which a live snapshot may not read."""
    if record.deleted_at is not None:
        return [f"{where}: the run's data was deleted by cleanup at {layout.format_ts(record.deleted_at)}"]
    if record.deleting_at is not None:
        return [f"{where}: cleanup began deleting the run's data at {layout.format_ts(record.deleting_at)}"]
    return []


def record_problems(record: RunRecord | None, ref: ManifestRef, where: str) -> list[str]:
    """What in the run record keeps the run of ``ref`` from going live (empty: nothing)."""
    if record is None:
        return [f"{where} does not exist"]
    problems = []
    if record.status != SUCCEEDED:
        why = f" ({record.error.type}: {record.error.message})" if record.error else ""
        problems.append(f"{where}: status is {record.status!r}, not 'succeeded'{why}")
    problems.extend(deletion_problems(record, where))
    if record.manifest_ref is not None and record.manifest_ref != ref.uri:
        problems.append(f"{where}: names manifest {record.manifest_ref!r}, not {ref.uri!r}")
    return problems


def manifest_problems(record: RunRecord | None, ref: ManifestRef, data: bytes) -> list[str]:
    """Whether ``data`` (the manifest's bytes) are what the writer of ``ref``'s run finished with.

    Records written before the writer kept the checksum have none: then only the run id is checked.
    """
    from airflow_provider_shardyfusion.core.model.chain import parse_manifest_bytes

    problems = []
    if record is not None and record.manifest_size is not None and len(data) != record.manifest_size:
        problems.append(f"manifest {ref.uri} is {len(data)} bytes, its writer recorded {record.manifest_size}: "
                        "it was changed after the run was written")
    elif record is not None and record.manifest_checksum is not None \
            and bytes_checksum(data, record.manifest_checksum) != record.manifest_checksum:
        problems.append(f"manifest {ref.uri} does not match the checksum its writer recorded "
                        f"({record.manifest_checksum}): it was changed after the run was written")
    try:
        manifest = parse_manifest_bytes(ref.uri, data)
    except ShardyfusionError as exc:
        return [*problems, str(exc)]
    if manifest.run_id != ref.run_id:
        problems.append(f"manifest {ref.uri} is of run {manifest.run_id!r}, but it is filed under run {ref.run_id!r}")
    return problems


def check_storage(snapshots: SnapshotRoot, manifest: Manifest, *, verify_checksums: bool = False) -> list[str]:
    """Problems with the manifest's winning files on storage (empty: every file is there as recorded).

    One listing per shard folder gives presence and size of all its files; ``verify_checksums``
    also downloads each file (one at a time, into a temporary folder) and checks its checksum.
    """
    problems: list[str] = []
    scratch = tempfile.mkdtemp(prefix="shardyfusion-validate-") if verify_checksums else None
    try:
        for shard in sorted(manifest.shards, key=lambda s: s.db_id):
            problems.extend(_shard_problems(snapshots.store, manifest.run_id, shard, scratch))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return problems


def _shard_problems(store: ObjectStore, run_id: str, shard: ShardEntry, scratch: str | None) -> list[str]:
    """Every layer of the shard (one for a full snapshot's shard) present on storage as recorded."""
    problems: list[str] = []
    for i, layer in enumerate(shard.all_layers()):
        where = f"shard {shard.db_id} of run {run_id!r}"
        if shard.layers:
            where += f" (layer {i}, written by run {layer.run_id!r})"
        problems.extend(_files_problems(store, where, layer.db_url, layer.stored_files(), scratch))
    return problems


def _files_problems(store: ObjectStore, where: str, db_url: str, files: tuple[ShardFile, ...],
                    scratch: str | None) -> list[str]:
    if not files:
        return [f"{where} ({db_url}): the manifest lists no files"]
    try:
        base = store.key_of(db_url).rstrip("/")
        listed = {info.key: info.size for info in store.list(base + "/")}
    except ShardyfusionError as exc:
        return [f"{where}: cannot list {db_url}: {exc}"]
    problems = []
    for f in files:
        key = layout.join(base, f.name)
        size = listed.get(key)
        if size is None:
            problems.append(f"{where}: file {store.uri(key)} is missing (manifest records {f.size} bytes)")
        elif size != f.size:
            problems.append(f"{where}: file {store.uri(key)} has {size} bytes on storage, the manifest records {f.size}")
        elif scratch is not None:
            problem = _checksum_problem(store, key, f.size, f.checksum, os.path.join(scratch, "file"), where)
            if problem:
                problems.append(problem)
    return problems


def _checksum_problem(store: ObjectStore, key: str, size: int, checksum: str, local: str, where: str) -> str | None:
    try:
        download_verified(store, key, local, size, checksum, source=f"{where}: file {store.uri(key)}")
    except ShardyfusionError as exc:
        return str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
    finally:
        if os.path.exists(local):
            os.unlink(local)
    return None
