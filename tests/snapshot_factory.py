"""Build and publish a snapshot through ``core`` alone, without Spark (tests and the read benchmark).

It lays a snapshot out exactly as SPEC §3/§5/§7 describe: per non-empty shard either one raw
RocksDB database (``shard_layout="db"``: keys = ``encode_key``, sorted, written as one SST and
ingested) or its SST file(s) alone (``"sst"``, optionally split into interleaved runs), uploaded under
the layout's attempt directory with sizes and checksums, the manifest at ``layout.manifest_key``,
a succeeded run record, and ``_CURRENT``. It is deliberately independent of the Spark writer so
the reader can be tested against the contract rather than against the writer's own code.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rocksdict import Options, Rdict, SstFileWriter

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import InputDataError
from airflow_provider_shardyfusion.core.model.checksum import file_checksum
from airflow_provider_shardyfusion.core.model.encoding import (
    default_key_encoding,
    encode_binary_value,
    encode_json_value,
    encode_key,
)
from airflow_provider_shardyfusion.core.model.manifest import (
    CHAIN_DOCUMENT_FORMAT_VERSION,
    CHAIN_FORMAT_VERSION,
    SHARD_LAYOUT_DB,
    SHARD_LAYOUT_SST,
    Manifest,
    ShardEntry,
    ShardFile,
    ShardingInfo,
)
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.routing import CelRouter, CelSpec, route_key
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED, RunRecord
from airflow_provider_shardyfusion.core.storage import ObjectStore, open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef, SnapshotRoot
    from airflow_provider_shardyfusion.core.model.value_schema import ValueSchema

# Not part of a database: the lock and the informational log RocksDB leaves next to it.
_NOT_SHIPPED = ("LOCK", "LOG")


@dataclass(frozen=True)
class BuiltSnapshot:
    root: str
    run_id: str
    manifest: Manifest
    manifest_key: str
    manifest_ref: str
    published_at: datetime


def _key_kind(key: Any) -> str:
    if isinstance(key, bool):
        raise InputDataError(f"key {key!r} is a bool")
    if isinstance(key, int):
        return "int"
    if isinstance(key, str):
        return "string"
    if isinstance(key, (bytes, bytearray, memoryview)):
        return "binary"
    raise InputDataError(f"key {key!r} of type {type(key).__name__} is not supported")


def _sort_unique(items: list[tuple[bytes, bytes]]) -> None:
    items.sort(key=lambda kv: kv[0])
    for (a, _), (b, _) in itertools.pairwise(items):
        if a == b:
            raise InputDataError(f"duplicate key {a.hex()} (rule: keys are unique within a snapshot)")


def write_shard_ssts(path: str, items: list[tuple[bytes, bytes]], runs: int = 1) -> None:
    """``items`` (sorted here) as ``runs`` SST files in the folder ``path``; several runs interleave
    (every ``runs``-th item), so their key ranges overlap as unsorted sort runs' do."""
    _sort_unique(items)
    os.makedirs(path)
    for r in range(runs):
        part = items[r::runs]
        if not part:
            continue
        writer = SstFileWriter(options=Options(raw_mode=True))
        writer.open(os.path.join(path, f"run-{r:05d}.sst"))
        for k, v in part:
            writer[k] = v
        writer.finish()


def write_shard_db(path: str, items: list[tuple[bytes, bytes]]) -> None:
    """A raw-mode RocksDB database at ``path`` holding ``items`` (sorted here), via SST + ingest."""
    _sort_unique(items)
    os.makedirs(path)
    sst = path + ".sst"
    writer = SstFileWriter(options=Options(raw_mode=True))
    writer.open(sst)
    for k, v in items:
        writer[k] = v
    writer.finish()
    db = Rdict(path, Options(raw_mode=True))
    try:
        db.ingest_external_file([sst])
    finally:
        db.close()
    os.unlink(sst)


def upload_shard(store: ObjectStore, local_dir: str, attempt_key: str) -> tuple[ShardFile, ...]:
    files = []
    for name in sorted(os.listdir(local_dir)):
        if name in _NOT_SHIPPED or name.startswith("LOG."):
            continue
        path = os.path.join(local_dir, name)
        store.upload_file(path, f"{attempt_key}/{name}")
        files.append(ShardFile(name=name, size=os.path.getsize(path), checksum=file_checksum(path)))
    return tuple(files)


def write_key_index(store: ObjectStore, folder: str, sorted_keys: list[bytes], attempt_key: str) -> ShardFile:
    """A full shard's key index (core.write.key_index.KEY_INDEX_FILE) of ``sorted_keys``, uploaded next to its data."""
    from airflow_provider_shardyfusion.core.write.key_index import finish_key_index, key_index_writer

    os.makedirs(folder)
    writer = key_index_writer(folder)
    for key in sorted_keys:
        writer[key] = b""
    index = finish_key_index(writer, folder)
    store.upload_file(os.path.join(folder, index.name), f"{attempt_key}/{index.name}")
    shutil.rmtree(folder)
    return index


def publish_current(store: ObjectStore, manifest_key: str, run_id: str, when: datetime | None = None) -> CurrentPointer:
    pointer = CurrentPointer(manifest_ref=store.uri(manifest_key), run_id=run_id, updated_at=when or layout.utc_now())
    store.put(layout.CURRENT_KEY, pointer.to_bytes())
    return pointer


def build_snapshot(
    root: str,
    rows: Iterable[tuple[Any, Any]],
    *,
    num_dbs: int,
    storage_options: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    key_column: str = "key",
    key_encoding: str | None = None,
    value_format: str = "binary",
    cel_expr: str | None = None,
    cel_columns: Mapping[str, str] | None = None,
    cel_mode: str | None = None,
    routing_values: tuple[Any, ...] | list[Any] | None = None,
    routing_context: Callable[[Any], Mapping[str, Any]] | None = None,
    published_at: datetime | None = None,
    attempt: int = 0,
    task_attempt_id: int | None = 7,
    publish: bool = True,
    write_run_record: bool = True,
    work_dir: str | None = None,
    shard_layout: str = SHARD_LAYOUT_DB,
    ssts_per_shard: int = 1,
    writer: Mapping[str, Any] | None = None,
    key_index: bool = False,
    value_schema: ValueSchema | None = None,
    value_encoding_version: int | None = None,
    encode_value: Callable[[Any], bytes] | None = None,
) -> BuiltSnapshot:
    """Write ``rows`` (key, value) as a snapshot under ``root`` and (by default) publish it.

    Values: bytes/str for ``value_format="binary"``, mappings for ``"json"``. CEL routing takes
    ``cel_expr``/``cel_columns``/``cel_mode``/``routing_values``; ``routing_context(key)`` supplies
    the non-key CEL columns of a row. ``shard_layout="sst"`` ships each shard as
    ``ssts_per_shard`` SST files (no database), recorded in ``storage_engine``. ``writer``: extra
    writer info (``spark_app_id``, ``airflow``...) for the manifest and the run record.
    ``key_index`` (with "sst"): each shard also gets its key index, as the Spark writer writes it;
    without it, the shards are as written before key indexes existed.
    ``value_schema`` / ``value_encoding_version`` go into the manifest (the value columns are then
    the schema's); ``encode_value`` replaces the value format's encoder (e.g. bytes written by hand).
    """
    store = open_store(root, dict(storage_options) if storage_options else None)
    run_id = layout.validate_run_id(run_id or layout.new_run_id())
    published_at = published_at or layout.utc_now()
    router = None
    if cel_expr is not None:
        columns = dict(cel_columns or {key_column: "int"})
        mode = cel_mode or ("categorical" if routing_values is not None else "direct")
        router = CelRouter(CelSpec(expr=cel_expr, columns=columns, mode=mode, num_dbs=num_dbs,
                                   routing_values=tuple(routing_values) if routing_values is not None else None))

    by_shard: dict[int, list[tuple[bytes, bytes]]] = {}
    value_columns: tuple[str, ...] = tuple(c.name for c in value_schema.columns) if value_schema else ()
    if encode_value is None:
        encode_value = encode_binary_value if value_format == "binary" else encode_json_value
    for key, value in rows:
        if key_encoding is None:
            key_encoding = default_key_encoding(_key_kind(key))
        if router is None:
            db_id = route_key(key, num_dbs)
        else:
            row = dict(routing_context(key)) if routing_context else {}
            row[key_column] = key
            db_id = router.route(row)
        if value_format == "json" and not value_columns:
            value_columns = tuple(sorted(value))
        by_shard.setdefault(db_id, []).append((encode_key(key, key_encoding, column=key_column), encode_value(value)))
    key_encoding = key_encoding or "u64be"

    own_work = work_dir is None
    work = tempfile.mkdtemp(prefix="shardyfusion-factory-") if own_work else work_dir
    shards = []
    try:
        for db_id in sorted(by_shard):
            items = by_shard.pop(db_id)
            local = os.path.join(work, f"db={db_id:05d}")
            if shard_layout == SHARD_LAYOUT_SST:
                write_shard_ssts(local, items, ssts_per_shard)
            else:
                write_shard_db(local, items)
            akey = layout.attempt_key(run_id, db_id, attempt, task_attempt_id)
            files = upload_shard(store, local, akey)
            index = write_key_index(store, f"{local}-keys", [k for k, _ in items], akey) if key_index else None
            shards.append(ShardEntry(
                db_id=db_id, db_url=store.uri(akey), attempt=attempt, task_attempt_id=task_attempt_id,
                row_count=len(items), byte_size=sum(f.size for f in files),
                min_key=items[0][0].hex(), max_key=items[-1][0].hex(), files=files, key_index=index,
            ))
            shutil.rmtree(local)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)

    rows_total = sum(s.row_count for s in shards)
    bytes_total = sum(s.byte_size for s in shards)
    manifest = Manifest(
        run_id=run_id, created_at=published_at, output_uri=store.root, num_dbs=num_dbs,
        sharding=ShardingInfo(
            strategy="hash" if router is None else "cel", key_column=key_column,
            cel_expr=cel_expr, cel_columns=dict(router.spec.columns) if router else None,
            cel_mode=router.spec.mode if router else None,
            routing_values=router.spec.routing_values if router else None,
        ),
        key_encoding=key_encoding, value_format=value_format, shards=tuple(shards), value_columns=value_columns,
        storage_engine={"name": "rocksdb", "writer": "tests.snapshot_factory",
                        **({"shard_layout": shard_layout} if shard_layout != SHARD_LAYOUT_DB else {})},
        stats={"rows": rows_total, "bytes": bytes_total, "empty_shards": num_dbs - len(shards), "attempts_seen": len(shards)},
        writer={"provider": "snapshot_factory", **(writer or {})}, run_started_at=published_at - timedelta(seconds=1),
        value_schema=value_schema, value_encoding_version=value_encoding_version,
    ).validate()
    mkey = layout.manifest_key(run_id, published_at)
    store.put(mkey, manifest.to_bytes())
    if write_run_record:
        record = RunRecord(
            run_id=run_id, status=SUCCEEDED, started_at=published_at - timedelta(seconds=1), updated_at=published_at,
            lease_expires_at=published_at + timedelta(minutes=10), output_uri=store.root, finished_at=published_at,
            manifest_ref=store.uri(mkey), num_dbs=num_dbs, stats=dict(manifest.stats),
            published_at=published_at if publish else None,  # as a real pointer move stamps it
            writer=dict(manifest.writer),
        )
        store.put(layout.run_record_key(run_id), record.to_bytes())
    if publish:
        publish_current(store, mkey, run_id, published_at)
    return BuiltSnapshot(root=store.root, run_id=run_id, manifest=manifest, manifest_key=mkey,
                         manifest_ref=store.uri(mkey), published_at=published_at)


def build_delta(
    root: str,
    upserts: Mapping[Any, Any],
    deletes: Iterable[Any] = (),
    *,
    storage_options: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    base_ref: str | None = None,
    published_at: datetime | None = None,
    publish: bool = True,
) -> BuiltSnapshot:
    """A delta run on ``base_ref`` (default: the live manifest), laid out as the Spark writer lays it out:
    one layer per changed shard written by ``core.write.delta`` against the base shard, the format-3
    chain document (only the changed shards, the base by reference and checksum), a succeeded run
    record and (by default) ``_CURRENT``. Binary values; keys route with the base's hash sharding."""
    from airflow_provider_shardyfusion.core.model.manifest import CHAIN_DOCUMENT_FORMAT_VERSION, stored_files
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader
    from airflow_provider_shardyfusion.core.write.delta import (
        Change,
        LayerResult,
        chain_shards,
        chain_stats,
        select_layer_winners,
        write_delta_layer,
    )

    options = dict(storage_options) if storage_options else None
    store = open_store(root, options)
    snapshots = SnapshotRoot(store)
    base_ref = base_ref or snapshots.current().manifest_ref
    resolved = snapshots.read_manifest_chain(base_ref)
    base = resolved.manifest
    run_id = layout.validate_run_id(run_id or layout.new_run_id())
    published_at = published_at or layout.utc_now()
    by_shard: dict[int, list[Change]] = {}
    changes = [*((k, encode_binary_value(v)) for k, v in upserts.items()), *((k, None) for k in deletes)]
    for key, value in changes:
        by_shard.setdefault(route_key(key, base.num_dbs), []).append(
            Change(encode_key(key, base.key_encoding, column=base.sharding.key_column), value))
    results = []
    with tempfile.TemporaryDirectory(prefix="shardyfusion-factory-delta-") as work, \
            ShardedReader(root, storage_options=options, manifest_ref=base_ref, cache_dir=os.path.join(work, "base"),
                          max_local_layers=None) as reader:
        for db_id, shard_changes in sorted(by_shard.items()):
            shard_changes.sort(key=lambda c: c.key)
            entry = base.shard(db_id)
            built = write_delta_layer(os.path.join(work, f"db={db_id:05d}"), shard_changes,
                                      base_db=reader.open_shard(db_id), base_rows=entry.row_count if entry else 0)
            akey = layout.attempt_key(run_id, db_id, 0, 7)
            for f in stored_files(built.files, built.key_index):
                store.upload_file(os.path.join(built.folder, f.name), f"{akey}/{f.name}")
            results.append(LayerResult(db_id=db_id, attempt=0, task_attempt_id=7, db_url=store.uri(akey),
                                       row_count=built.row_count, files=built.files, key_index=built.key_index,
                                       counts=built.counts,
                                       min_key=built.min_key.hex() if built.min_key else None,
                                       max_key=built.max_key.hex() if built.max_key else None))
    winners = select_layer_winners(results, base.num_dbs)
    shards = chain_shards(base, run_id, winners, compact=False)
    manifest = Manifest(
        run_id=run_id, created_at=published_at, output_uri=store.root, num_dbs=base.num_dbs, sharding=base.sharding,
        key_encoding=base.key_encoding, value_format=base.value_format, value_columns=base.value_columns,
        storage_engine=dict(base.storage_engine), shards=shards, stats=chain_stats(base, shards, winners),
        writer={"provider": "snapshot_factory"}, run_started_at=published_at - timedelta(seconds=1),
        base_run_id=base.run_id, chain_depth=base.chain_depth + 1, write_mode="delta",
        format_version=CHAIN_DOCUMENT_FORMAT_VERSION, base_manifest_ref=base_ref,
        base_manifest_checksum=resolved.checksum,
    ).validate()
    mkey = layout.manifest_key(run_id, published_at)
    store.put(mkey, manifest.to_bytes())
    record = RunRecord(
        run_id=run_id, status=SUCCEEDED, started_at=published_at - timedelta(seconds=1), updated_at=published_at,
        lease_expires_at=published_at + timedelta(minutes=10), output_uri=store.root, finished_at=published_at,
        manifest_ref=store.uri(mkey), num_dbs=base.num_dbs, stats=dict(manifest.stats),
        published_at=published_at if publish else None, writer=dict(manifest.writer),
    )
    store.put(layout.run_record_key(run_id), record.to_bytes())
    if publish:
        publish_current(store, mkey, run_id, published_at)
    return BuiltSnapshot(root=store.root, run_id=run_id, manifest=manifest, manifest_key=mkey,
                         manifest_ref=store.uri(mkey), published_at=published_at)
# -- metadata-only snapshots (benchmarks/bench_metadata.py) ------------------------------------------
# Manifests, run records and ``_CURRENT`` as the writer makes them, with shard entries that name
# files nobody wrote: what reads metadata only (manifest decoding, chains, cleanup planning, the
# history pages) sees a real root; nothing may open a shard of it.

_KEY_SPAN = 1 << 40  # u64be keys of shard ``db_id`` lie in [db_id * span, (db_id + 1) * span)


def keys_by_shard(num_dbs: int, per_shard: int) -> dict[int, list[int]]:
    """The smallest int keys, by the shard hash routing sends them to, until every shard has ``per_shard``."""
    keys: dict[int, list[int]] = {}
    key = 0
    while len(keys) < num_dbs or min(len(v) for v in keys.values()) < per_shard:
        keys.setdefault(route_key(key, num_dbs), []).append(key)
        key += 1
    return keys


def _fake_file(name: str, run_id: str, db_id: int, rows: int) -> ShardFile:
    digest = f"{hash((run_id, db_id, name)) & ((1 << 128) - 1):032x}"
    return ShardFile(name=name, size=40 * rows + 4096, checksum=f"xxh3_128:{digest}")


def _key_hex(db_id: int, offset: int) -> str:
    return (db_id * _KEY_SPAN + offset).to_bytes(8, "big").hex()


def metadata_full_manifest(store: ObjectStore, run_id: str, num_dbs: int, *, rows_per_shard: int = 1000,
                           started_at: datetime | None = None) -> Manifest:
    """A full snapshot of ``num_dbs`` non-empty shards (one fake SST each), as the Spark writer describes it."""
    started_at = started_at or layout.utc_now()
    shards = tuple(
        ShardEntry(db_id=db_id, db_url=store.uri(layout.attempt_key(run_id, db_id, 0, 7 + db_id)), attempt=0,
                   task_attempt_id=7 + db_id, row_count=rows_per_shard, byte_size=f.size,
                   min_key=_key_hex(db_id, 0), max_key=_key_hex(db_id, 2 * rows_per_shard), files=(f,))
        for db_id in range(num_dbs) for f in (_fake_file("run-00000.sst", run_id, db_id, rows_per_shard),)
    )
    return Manifest(
        run_id=run_id, created_at=started_at + timedelta(seconds=30), output_uri=store.root, num_dbs=num_dbs,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        shards=shards, storage_engine={"name": "rocksdb", "writer": "tests.snapshot_factory",
                                       "shard_layout": SHARD_LAYOUT_SST},
        stats={"rows": sum(s.row_count for s in shards), "bytes": sum(s.byte_size for s in shards), "num_dbs": num_dbs,
               "empty_shards": 0, "shards_written": num_dbs, "attempts_seen": num_dbs},
        writer={"provider": "snapshot_factory"}, run_started_at=started_at,
    )


def metadata_chain_manifest(store: ObjectStore, base: Manifest, base_ref: str, base_checksum: str, run_id: str,
                            db_ids: Iterable[int], *, compact: bool = False,
                            started_at: datetime | None = None) -> Manifest:
    """A run on ``base`` (resolved) as the Spark driver builds it (``_write_chain``): a delta's layer
    on each shard of ``db_ids`` (10 rows changed: 4 updates, 3 inserts, 3 deletes), or a compaction
    (one full layer per shard; ``db_ids`` ignored). The delta is a format-3 chain document on
    ``base_ref`` / ``base_checksum``."""
    from airflow_provider_shardyfusion.core.write.delta import LayerCounts, LayerResult, chain_shards, chain_stats

    started_at = started_at or layout.utc_now()
    counts = LayerCounts(puts=7, deletes=3, inserted=3, updated=4, deleted=3)
    touched = range(base.num_dbs) if compact else sorted(set(db_ids))
    winners = {}
    for db_id in touched:
        before = base.shard(db_id)
        rows = (before.row_count if before else 0) + (0 if compact else counts.row_delta)
        name = "run-00000.sst" if compact else "layer-00000.sst"
        winners[db_id] = LayerResult(
            db_id=db_id, attempt=0, task_attempt_id=3 + db_id, db_url=store.uri(layout.attempt_key(run_id, db_id, 0, 3 + db_id)),
            row_count=rows, files=(_fake_file(name, run_id, db_id, rows if compact else 10),),
            counts=LayerCounts(puts=rows, inserted=rows) if compact else counts,
            min_key=_key_hex(db_id, 0), max_key=_key_hex(db_id, 2 * rows + 1),
        )
    shards = chain_shards(base, run_id, winners, compact=compact)
    return Manifest(
        run_id=run_id, created_at=started_at + timedelta(seconds=10), output_uri=store.root, num_dbs=base.num_dbs,
        sharding=base.sharding, key_encoding=base.key_encoding, value_format=base.value_format,
        value_columns=base.value_columns, storage_engine=dict(base.storage_engine), shards=shards,
        stats=dict(chain_stats(base, shards, winners), write_mode="compact" if compact else "delta"),
        writer={"provider": "snapshot_factory"}, run_started_at=started_at, base_run_id=base.run_id,
        chain_depth=0 if compact else base.chain_depth + 1, write_mode="compact" if compact else "delta",
        format_version=CHAIN_FORMAT_VERSION if compact else CHAIN_DOCUMENT_FORMAT_VERSION,
        base_manifest_ref=None if compact else base_ref, base_manifest_checksum=None if compact else base_checksum,
    )


def publish_metadata_run(snapshots: SnapshotRoot, manifest: Manifest) -> ManifestRef:
    """The writer's publish order through core (``core.write.commit.publish``'s steps): a running run record,
    the manifest, the record marked succeeded with the manifest's identity, ``_CURRENT`` moved
    (conditionally, on its base), ``published_at`` stamped. Done on ``snapshots`` rather than through
    ``publish`` itself, which opens a new ``SnapshotRoot`` and so re-reads the live chain every call."""
    from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
    from airflow_provider_shardyfusion.core.model.run_record import RunRecordLifecycle
    from airflow_provider_shardyfusion.core.write.commit import mark_succeeded

    started = manifest.run_started_at or manifest.created_at
    lifecycle = RunRecordLifecycle(snapshots.store, manifest.run_id, num_dbs=manifest.num_dbs,
                                   writer=dict(manifest.writer), clock=lambda: started).start()
    ref = snapshots.write_manifest(manifest)
    data = snapshots.store.get(ref.key).data
    lifecycle.clock = lambda: manifest.created_at
    mark_succeeded(lifecycle, ref.uri, dict(manifest.stats), manifest_checksum=bytes_checksum(data),
                   manifest_size=len(data), publishing=True)
    snapshots.move_pointer(ref)
    snapshots.mark_published(manifest.run_id)
    return ref
