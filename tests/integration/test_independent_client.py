"""Shards are plain RocksDB data that older, independent RocksDB clients read exactly (SPEC §5).

A snapshot is written by the real Spark job (local mode). The writer ships each shard as its SST
file(s) only (``shard_layout`` "sst"); every shard is fetched with exactly the files its manifest
lists into a fresh folder, then read by clients that share no code with the writer or the reader:
Debian 12's RocksDB 7.8 tools (``sst_dump`` scans each SST; ``ldb`` ingests them, in manifest
order, into a new database and scans it; both refuse block-based ``format_version`` 6) and the
Java RocksDB bundled with Spark, through the driver's JVM (ingest into a new database, iterate).
Every key and value is compared with the input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model import encoding, routing
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.spark
MISSING_TOOL = "{} not found: `make install` installs Debian's rocksdb-tools (RocksDB 7.8) when run as root with apt-get"


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]").appName("shardyfusion-independent-client")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, MISSING_TOOL.format(name)
    return path


def _fetch_shards(root: str) -> tuple[Manifest, dict[int, str]]:
    """Follow _CURRENT and copy every shard's listed files, and nothing else, into fresh folders."""
    store = open_store(root)
    pointer = CurrentPointer.from_bytes(store.get(layout.CURRENT_KEY).data)
    manifest = Manifest.from_bytes(store.get(store.key_of(pointer.manifest_ref)).data)
    folders = {}
    for shard in manifest.shards:
        local = tempfile.mkdtemp(prefix=f"independent-db{shard.db_id}-")
        for f in shard.files:
            store.download_file(f"{store.key_of(shard.db_url)}/{f.name}", os.path.join(local, f.name))
        folders[shard.db_id] = local
    return manifest, folders


def _parse_hex_pairs(lines: list[str], sep: str) -> list[tuple[bytes, bytes]]:
    pairs = []
    for line in lines:
        k, v = line.split(sep, 1)
        pairs.append((bytes.fromhex(k.strip().removeprefix("0x").strip("'")), bytes.fromhex(v.strip().removeprefix("0x"))))
    return pairs


def _ssts(manifest: Manifest, db_id: int, folder: str) -> list[str]:
    """The shard's SSTs in manifest order (the order a reader ingests them in)."""
    shard = manifest.shard(db_id)
    assert shard is not None and shard.files and all(f.name.endswith(".sst") for f in shard.files), \
        f"shard {db_id}: an 'sst' layout shard ships SST files only, got {[f.name for f in shard.files]}"
    return [os.path.join(folder, f.name) for f in shard.files]


def _ldb_ingest_and_scan(ssts: list[str]) -> list[tuple[bytes, bytes]]:
    folder = tempfile.mkdtemp(prefix="independent-ldb-")
    try:
        for sst in ssts:  # one at a time, as the reader does: each is its own ingestion
            proc = subprocess.run([_tool("ldb"), f"--db={folder}", "--create_if_missing", "ingest_extern_sst", sst],
                                  capture_output=True, text=True, check=False)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0 and "Failed" not in out, f"ldb refused to ingest {sst}: {out}"
        return _ldb_scan(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _ldb_scan(folder: str) -> list[tuple[bytes, bytes]]:
    proc = subprocess.run([_tool("ldb"), f"--db={folder}", "scan", "--hex"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and not proc.stdout.startswith("Failed"), f"ldb refused {folder}: {proc.stdout}{proc.stderr}"
    return _parse_hex_pairs([ln for ln in proc.stdout.splitlines() if ln.strip()], " : ")


def _sst_dump_scan(sst: str) -> list[tuple[bytes, bytes]]:
    proc = subprocess.run([_tool("sst_dump"), f"--file={sst}", "--command=scan", "--output_hex"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "not a valid SST file" not in proc.stdout + proc.stderr, \
        f"sst_dump refused {sst}: {proc.stdout}{proc.stderr}"
    # Data lines look like: '00AB...' seq:0, type:1 => 76...
    rows = [ln for ln in proc.stdout.splitlines() if " => " in ln and " seq:" in ln]
    return [(bytes.fromhex(ln.split("'")[1]), bytes.fromhex(ln.split(" => ", 1)[1].strip())) for ln in rows]


def _java_ingest_and_scan(spark, ssts: list[str]) -> list[tuple[bytes, bytes]]:
    jvm = spark.sparkContext._jvm
    jvm.org.rocksdb.RocksDB.loadLibrary()
    folder = tempfile.mkdtemp(prefix="independent-java-")
    options = jvm.org.rocksdb.Options().setCreateIfMissing(True)
    ingest = jvm.org.rocksdb.IngestExternalFileOptions()  # copies: the fetched files stay as they are
    db = jvm.org.rocksdb.RocksDB.open(options, folder)
    pairs = []
    try:
        for sst in ssts:
            paths = jvm.java.util.ArrayList()
            paths.add(sst)
            db.ingestExternalFile(paths, ingest)
        it = db.newIterator()
        try:
            it.seekToFirst()
            while it.isValid():
                pairs.append((bytes(it.key()), bytes(it.value())))
                it.next()
        finally:
            it.close()
    finally:
        db.close()
        ingest.close()
        options.close()
        shutil.rmtree(folder, ignore_errors=True)
    return pairs


def _check_exact(manifest: Manifest, shard_pairs: dict[int, list[tuple[bytes, bytes]]], expected: dict[bytes, bytes],
                 key_encoding: str, what: str) -> None:
    seen = {}
    for db_id, pairs in shard_pairs.items():
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys), f"{what}: shard {db_id} not in bytewise key order"
        assert len(pairs) == manifest.shard(db_id).row_count, f"{what}: shard {db_id} row count"
        for k, v in pairs:
            assert routing.route_key(encoding.decode_key(k, key_encoding), manifest.num_dbs) == db_id, \
                f"{what}: key {k.hex()} in the wrong shard {db_id}"
            assert k not in seen, f"{what}: key {k.hex()} stored twice"
            seen[k] = v
    assert seen == expected, f"{what}: keys/values differ from the input"


def _write(spark, tmp_path: Path, table: pa.Table, **kwargs) -> str:
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    src = str(tmp_path / "input.parquet")
    pq.write_table(table, src)
    root = f"file://{tmp_path / 'out'}"
    run_write(spark, build_write_config(output_uri=root, input_path=src, **kwargs))
    return root


CASES = {
    # Several Spark-sorted runs per shard → several SSTs ingested into each database.
    # Small Arrow batches let the writer flush a run every ~500 rows.
    "int-keys-several-ssts": {"rows": 6_000, "num_dbs": 5, "sort_run_rows": 500, "batch_size": 200,
                              "spark_conf_overrides": {"spark.sql.execution.arrow.maxRecordsPerBatch": "250"}},
    # One in-memory sort run per shard, string keys, JSON values.
    "string-keys-json": {"rows": 3_000, "num_dbs": 3, "sort_run_rows": 1_000_000, "batch_size": 50_000},
}


@pytest.mark.parametrize("case", CASES)
def test_every_shard_reads_back_exactly_with_rocksdb_7_tools_and_java(spark, tmp_path, case):
    c = CASES[case]
    n = c["rows"]
    if case.startswith("int"):
        ids = list(range(0, n * 7, 7))
        table = pa.table({"id": pa.array(ids, pa.int64()),
                          "payload": pa.array([b"v%d-" % i + bytes([i % 256]) * (i % 40) for i in ids], pa.binary())})
        kwargs = {"key_column": "id", "value_column": "payload"}
        key_encoding = "u64be"
        expected = {encoding.encode_key(i, key_encoding): b"v%d-" % i + bytes([i % 256]) * (i % 40) for i in ids}
    else:
        names = [f"user-{i:05d}-é" for i in range(n)]
        table = pa.table({"name": names, "age": list(range(n)), "city": [f"c{i % 13}" for i in range(n)]})
        kwargs = {"key_column": "name", "value_columns": ["age", "city"], "value_format": "json"}
        key_encoding = "utf8"
        expected = {encoding.encode_key(s, key_encoding): i for i, s in enumerate(names)}
    root = _write(spark, tmp_path, table, num_dbs=c["num_dbs"], sort_run_rows=c["sort_run_rows"],
                  batch_size=c["batch_size"], spark_conf_overrides=c.get("spark_conf_overrides"), **kwargs)
    manifest, folders = _fetch_shards(root)
    assert len(folders) == c["num_dbs"]
    assert manifest.shard_layout == "sst"
    ssts = {db_id: _ssts(manifest, db_id, folder) for db_id, folder in folders.items()}
    if case.startswith("int"):
        assert all(len(s.files) > 1 for s in manifest.shards)

    def normalize(pairs):
        if key_encoding == "utf8":  # JSON text is compared as data, so key order inside it is free
            return [(k, json.loads(v)) for k, v in pairs]
        return pairs

    want = expected if key_encoding == "u64be" else {
        k: {"age": i, "city": f"c{i % 13}"} for k, i in expected.items()}
    sst = {}
    for db_id, paths in ssts.items():
        pairs = []
        for path in paths:
            pairs.extend(_sst_dump_scan(path))
        sst[db_id] = normalize(sorted(pairs))
    _check_exact(manifest, sst, want, key_encoding, "sst_dump 7.x")
    ldb = {db_id: normalize(_ldb_ingest_and_scan(paths)) for db_id, paths in ssts.items()}
    _check_exact(manifest, ldb, want, key_encoding, "ldb 7.x (ingested)")
    java = {db_id: normalize(_java_ingest_and_scan(spark, paths)) for db_id, paths in ssts.items()}
    _check_exact(manifest, java, want, key_encoding, "Java RocksDB (Spark's rocksdbjni)")
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)


def test_rocksdb_7_tools_are_the_old_release():
    """The guard above means something only if the tools predate format_version 6 (RocksDB 8.6)."""
    proc = subprocess.run([_tool("ldb"), "--version"], capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    version = next((w for w in out.replace(",", " ").split() if w[:1].isdigit() and w.count(".") >= 1), None)
    assert version is not None, f"cannot read ldb's version from {out!r}"
    major, minor = (int(x) for x in version.split(".")[:2])
    assert (major, minor) < (8, 6), f"ldb {version} reads format_version 6 too; this test needs RocksDB < 8.6"


def test_every_layer_of_a_delta_chain_reads_back_with_rocksdb_7_tools(spark, tmp_path):
    """SPEC §13: each layer is a plain SST (puts and point tombstones); RocksDB 7.8's ``ldb``
    ingests a shard's layers oldest first into a new database and reads exactly the chain's data."""
    from airflow_provider_shardyfusion.spark_jobs.driver import run_write

    ids = list(range(0, 3000, 3))
    model = {i: b"v0-%d" % i for i in ids}
    root = _write(spark, tmp_path, pa.table({"id": pa.array(ids, pa.int64()),
                                             "payload": pa.array(list(model.values()), pa.binary())}),
                  key_column="id", value_column="payload", num_dbs=3)
    for step, (upserts, deletes) in enumerate((({i: b"v1-%d" % i for i in range(0, 300, 2)}, [3, 9, 15, 10_000]),
                                                ({3: b"back", 7: b"new"}, [0, 2, 12]))):
        keys = [*upserts, *deletes]
        src = str(tmp_path / f"delta{step}.parquet")
        pq.write_table(pa.table({"id": pa.array(keys, pa.int64()),
                                 "payload": pa.array([upserts.get(k) for k in keys], pa.binary()),
                                 "gone": [k in deletes for k in keys]}), src)
        run_write(spark, build_write_config(output_uri=root, input_path=src, key_column="id", value_column="payload",
                                            write_mode="delta", delete_column="gone"))
        model.update(upserts)
        for k in deletes:
            model.pop(k, None)
    store = open_store(root)
    # A delta's manifest names its base's (format 3): the whole chain, rebuilt by the snapshot root.
    manifest = SnapshotRoot(store).read_manifest(SnapshotRoot(store).current())
    assert manifest.chain_depth == 2
    shard_pairs, tombstones = {}, 0
    for shard in manifest.shards:
        ssts = []
        for i, layer in enumerate(shard.layers):
            for f in layer.files:
                local = os.path.join(tempfile.mkdtemp(prefix=f"layer{shard.db_id}-{i}-"), f.name)
                store.download_file(f"{store.key_of(layer.db_url)}/{f.name}", local)
                ssts.append(local)
                if layer.kind == "delta":  # sst_dump sees the tombstones as deletions (type 0)
                    proc = subprocess.run([_tool("sst_dump"), f"--file={local}", "--command=scan", "--output_hex"],
                                          capture_output=True, text=True, check=True)
                    tombstones += sum(1 for ln in proc.stdout.splitlines() if "type:0" in ln)
        shard_pairs[shard.db_id] = _ldb_ingest_and_scan(ssts)
    assert tombstones == 4 + 3  # every deletion of both deltas, 10_000 and 12 included (absent keys)
    want = {encoding.encode_key(k, "u64be"): v for k, v in model.items()}
    _check_exact(manifest, shard_pairs, want, "u64be", "ldb 7.x over the chain's layers")
