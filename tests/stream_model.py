"""A stream under test: a source folder, a checkpoint, an output root, and the model every file applies to."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.stream.batches import parse_batch_run_id

STREAM = "orders.stream"
NUM_DBS = 4
SCHEMA = "id LONG, payload STRING, deleted BOOLEAN"


class Stream:
    """A source folder, a checkpoint, an output root and the model: every file applied once, in order."""

    def __init__(self, spark, tmp_path, *, value_format: str = "binary"):
        self.spark = spark
        # json: the payload as a one-column JSON value (SPEC §18), read back as {"payload": ...}
        self.json_values = value_format == "json"
        self.source = tmp_path / "source"
        self.source.mkdir()
        self.staging = tmp_path / "staging"
        self.staging.mkdir()
        self.checkpoint = str(tmp_path / "checkpoint")
        self.root = layout.normalize_root(str(tmp_path / "root"))
        self.files: list[str] = []
        self.model: dict[int, bytes | dict[str, str]] = {}
        self.deleted: set[int] = set()
        values: dict = ({"value_columns": ["payload"], "value_format": "json"} if self.json_values
                        else {"value_column": "payload"})
        self.config = build_write_config(
            output_uri=self.root, input_path=str(self.source), key_column="id", num_dbs=NUM_DBS,
            write_mode="delta", delete_column="deleted", max_chain_depth=3, **values,
        )

    def add_file(self, upserts: dict[int, str], deletes: list[int] = ()) -> str:
        """Write one file into the source (atomically, mtimes increasing) and apply it to the model."""
        n = len(self.files)
        keys = [*upserts, *deletes]
        table = pa.table({"id": pa.array(keys, pa.int64()), "payload": [upserts.get(k) for k in keys],
                          "deleted": pa.array([False] * len(upserts) + [True] * len(deletes), pa.bool_())})
        staged = self.staging / f"part-{n:04d}.parquet"
        pq.write_table(table, staged)
        stamp = 1_700_000_000 + 10 * n  # the file source takes files oldest first
        os.utime(staged, (stamp, stamp))
        final = self.source / staged.name
        os.replace(staged, final)
        self.files.append(str(final))
        for k, v in upserts.items():
            self.model[k] = {"payload": v} if self.json_values else v.encode()
            self.deleted.discard(k)
        for k in deletes:
            if self.model.pop(k, None) is not None or k not in upserts:
                self.deleted.add(k)
        return str(final)

    def run_query(self, writer) -> Exception | None:
        """One ``availableNow`` run of the query (one file per micro-batch); the query's error, if any."""
        query = (self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(self.source))
                 .writeStream.foreachBatch(writer).option("checkpointLocation", self.checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        except Exception as exc:  # the foreachBatch error ends the query
            return exc
        return query.exception()

    def snapshots(self) -> SnapshotRoot:
        return SnapshotRoot.open(self.root)

    def check_reader(self) -> ShardedReader:
        reader = ShardedReader(self.root)
        keys = sorted(self.model)
        absent = sorted(self.deleted | {10**9})
        assert reader.multi_get(keys) == [self.model[k] for k in keys]
        assert reader.multi_get(absent) == [None] * len(absent)
        assert reader.manifest.row_count == len(self.model)
        return reader

    def stream_records(self) -> dict[str, object]:
        snapshots = self.snapshots()
        return {run_id: snapshots.read_run(run_id) for run_id in snapshots.list_run_ids()
                if parse_batch_run_id(STREAM, run_id) is not None}

    def check_each_batch_live_once(self, num_batches: int) -> None:
        """Every batch id 0..n-1 has exactly one published run, whose manifest names the stream and batch."""
        snapshots = self.snapshots()
        published: dict[int, list[str]] = {}
        for run_id, record in self.stream_records().items():
            if record.published_at is not None:
                parsed = parse_batch_run_id(STREAM, run_id)
                assert parsed is not None
                published.setdefault(parsed[0], []).append(run_id)
        assert sorted(published) == list(range(num_batches))
        assert all(len(runs) == 1 for runs in published.values()), published
        for batch_id, (run_id,) in published.items():
            manifest = snapshots.read_manifest(snapshots.find_manifest(run_id))
            assert (manifest.writer["stream_id"], manifest.writer["batch_id"]) == (STREAM, batch_id)
        live = snapshots.current()
        assert live is not None and parse_batch_run_id(STREAM, live.run_id)[0] == num_batches - 1
