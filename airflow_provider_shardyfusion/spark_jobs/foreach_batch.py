"""The ``foreachBatch`` writer of a streaming query, next to the job it runs each micro-batch through.

Public as ``airflow_provider_shardyfusion.streaming``, whose docstring states the contract
(exactly once, ownership, async progress tracking).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..core import layout
from ..core.errors import (
    ConfigError,
    ObjectNotFoundError,
    PublishManifestError,
    RunAbandoned,
    RunRecordError,
    StorageError,
    StreamOwnershipError,
)
from ..core.model.config import DeltaSpec, WriteConfig
from ..core.model.snapshot import SnapshotRoot
from ..core.storage import open_store
from ..core.stream.batches import Decision, StreamRun, decide_batch, parse_batch_run_id, validate_stream_id
from ..core.stream.owner import DEFAULT_LEASE, Claim, StreamOwner, claim, still_held
from ..core.stream.report import BatchOutcome
from ..core.write.job_contract import RunStats
from .faults import NO_FAULTS, Faults

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "ASYNC_PROGRESS_CONF", "ASYNC_PROGRESS_OPTION", "QUERY_ID_PROPERTY", "BatchOutcome", "BatchWriter",
    "batch_config", "check_session", "check_stream_options", "checkpoint_identity", "decide", "foreach_batch_writer",
    "next_free_batch", "stream_runs",
]

log = logging.getLogger("shardyfusion.streaming")

ASYNC_PROGRESS_OPTION = "asyncProgressTrackingEnabled"
ASYNC_PROGRESS_CONF = "spark.sql.streaming.asyncProgressTrackingEnabled"
# Spark sets it on the thread that runs a micro-batch: the query id, kept in the checkpoint's
# ``metadata`` file (``{"id": ...}``), so the same across restarts and new for a new checkpoint.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _async_refusal(where: str) -> ConfigError:
    return ConfigError(
        f"{where}: async progress tracking ({ASYNC_PROGRESS_OPTION}) is not supported by the shardyfusion streaming "
        "writer. It commits offsets asynchronously, so after a restart Spark can replay a batch id with other data "
        "or skip batch ids, and the batch id (the idempotency key of every published snapshot) would no longer "
        "stand for the same data: a replay would be skipped and its rows lost. Remove the option"
    )


def check_stream_options(options: Mapping[str, Any]) -> None:
    """Refuse query options the exactly-once contract cannot keep (call before ``start()``)."""
    for name, value in options.items():
        if name.lower() == ASYNC_PROGRESS_OPTION.lower() and str(value).strip().lower() == "true":
            raise _async_refusal(f"query option {name}={value!r}")


def check_session(spark) -> None:
    """Refuse async progress tracking as far as it is visible from the micro-batch's session."""
    try:
        conf_value = spark.conf.get(ASYNC_PROGRESS_CONF, None)
    except Exception:  # a session without the key
        conf_value = None
    if conf_value is not None and str(conf_value).strip().lower() == "true":
        raise _async_refusal(f"Spark conf {ASYNC_PROGRESS_CONF}={conf_value!r}")


@dataclass
class BatchWriter:
    """The ``foreachBatch`` function: ``writer(batch_df, batch_id)``; ``outcomes`` lists every call."""

    config: WriteConfig
    stream_id: str
    faults: Faults = NO_FAULTS
    checkpoint_location: str | None = None
    stream_reset: bool = False
    accept_live_run: str | None = None
    lease: timedelta = DEFAULT_LEASE
    outcomes: list[BatchOutcome] = field(default_factory=list)
    writer_id: str = field(default_factory=lambda: secrets.token_hex(8))
    _held: bool = field(default=False, repr=False)
    _lease_until: datetime | None = field(default=None, repr=False)

    def __call__(self, batch_df, batch_id: int) -> None:
        spark = batch_df.sparkSession
        check_session(spark)
        snapshots = SnapshotRoot.open(self.config.output_uri, self.config.storage_options)
        checkpoint_id = checkpoint_identity(spark, self.checkpoint_location, self.config)
        owner = self._claim(snapshots, checkpoint_id)
        self._batch(spark, batch_df, owner.batch_offset + int(batch_id), snapshots)
        self._claim(snapshots, checkpoint_id)  # renews the lease; a writer fenced meanwhile stops here

    def _claim(self, snapshots: SnapshotRoot, checkpoint_id: str) -> StreamOwner:
        """Claim (or renew) the stream for this writer with a conditional put on its owner object."""
        def decide(current: StreamOwner | None) -> Claim:
            fresh = current is None or current.checkpoint_id != checkpoint_id
            return claim(current, stream_id=self.stream_id, checkpoint_id=checkpoint_id, writer_id=self.writer_id,
                         held=self._held, now=layout.utc_now(), lease=self.lease, stream_reset=self.stream_reset,
                         next_free_batch=next_free_batch(snapshots, self.stream_id) if fresh else 0)

        return self._put_owner(snapshots, decide)

    def _still_held(self, snapshots: SnapshotRoot, run_id: str) -> None:
        """The fence before a batch's run is committed: this writer must still hold the stream (its lease
        renewed by a conditional put), else ``StreamOwnershipError`` and the run fails unpublished."""
        self._put_owner(snapshots, lambda current: Claim(still_held(
            current, stream_id=self.stream_id, writer_id=self.writer_id, now=layout.utc_now(), lease=self.lease,
            held_until=self._lease_until, what=f"run {run_id!r}")))

    def _put_owner(self, snapshots: SnapshotRoot, decide: Callable[[StreamOwner | None], Claim]) -> StreamOwner:
        """Read the owner object, ``decide`` what it becomes, and put that conditionally (again if it changed)."""
        key = layout.stream_owner_key(self.stream_id)
        for _ in range(3):
            try:
                obj = snapshots.store.get(key)
                current, etag = StreamOwner.from_bytes(obj.data), obj.etag
            except ObjectNotFoundError:
                current, etag = None, None
            decided = decide(current)
            if snapshots.store.put_if_match(key, decided.owner.to_bytes(), etag) is not None:
                if decided.warning:
                    log.warning("%s", decided.warning)
                self._held, self._lease_until = True, decided.owner.lease_expires_at
                return decided.owner
        raise StreamOwnershipError(f"stream {self.stream_id!r}: its owner object {snapshots.store.uri(key)} kept "
                                   "changing while this writer claimed it (another writer on the stream?)")

    def release(self) -> None:
        """End this writer's lease once its query ended (a ``stream_reset`` may then take over at once).

        The owner object stays (the checkpoint still owns the stream); a writer that no longer holds
        the stream leaves it alone.
        """
        if not self._held:
            return
        store = SnapshotRoot.open(self.config.output_uri, self.config.storage_options).store
        key = layout.stream_owner_key(self.stream_id)
        try:
            obj = store.get(key)
        except ObjectNotFoundError:
            return
        owner = StreamOwner.from_bytes(obj.data)
        if owner.writer_id == self.writer_id and store.put_if_match(
                key, replace(owner, lease_expires_at=layout.utc_now()).to_bytes(), obj.etag) is not None:
            self._held = False

    def _batch(self, spark, batch_df, batch_id: int, snapshots: SnapshotRoot) -> None:
        decision = decide(snapshots, self.stream_id, batch_id, accept_live_run=self.accept_live_run)
        if decision.warning:
            log.warning("%s", decision.warning)
        log.info("stream %s batch %d: %s", self.stream_id, batch_id, decision.reason)
        if decision.action == "skip":
            self.outcomes.append(BatchOutcome(batch_id, "skipped", decision.run_id, decision.reason))
            return
        self._abandon(snapshots, decision)
        assert decision.write_mode is not None
        self._write(spark, batch_df, batch_id, decision.run_id, decision.write_mode, snapshots)
        self._hold_after_batch(decision.run_id)

    def _hold_after_batch(self, run_id: str | None) -> None:
        """Test-only: hold where the batch is live and Spark has not committed it to the checkpoint."""
        if run_id is not None:
            self.faults.hold_point("hold_after_batch", run_id)

    def _abandon(self, snapshots: SnapshotRoot, decision: Decision) -> None:
        for run_id in decision.abandon:
            error = RunAbandoned(f"stream {self.stream_id!r}: a new attempt of the batch replaces this running "
                                 "attempt, whose writer is gone")
            snapshots.mark_failed(run_id, error)
            log.warning("stream %s: run %s was still 'running'; marked failed (its writer is gone)", self.stream_id,
                        run_id)

    def _write(self, spark, batch_df, batch_id: int, run_id: str, mode: Literal["full", "delta"],
               snapshots: SnapshotRoot) -> None:
        from .driver import run_write

        config = batch_config(self.config, run_id, mode)
        df = batch_df
        delete_column = self.config.delta.delete_column
        if mode == "full" and delete_column is not None:
            df = batch_df.where(f"NOT coalesce(`{delete_column}`, false)").drop(delete_column)
        record = run_write(spark, config, faults=self.faults, df=df, stream_batch=(self.stream_id, batch_id),
                           fence=lambda: self._still_held(snapshots, run_id))
        if record.published_at is None:
            raise PublishManifestError(
                f"stream {self.stream_id!r} batch {batch_id}: run {run_id!r} was written but is not live "
                "(another writer moved _CURRENT?); the batch is not committed and will be retried"
            )
        rows = RunStats.from_dict(record.stats).rows
        self.outcomes.append(BatchOutcome(batch_id, "written", run_id, f"written ({mode})", rows=rows))
        log.info("stream %s batch %d: run %s (%s) is live, %s rows", self.stream_id, batch_id, run_id, mode, rows)


def batch_config(config: WriteConfig, run_id: str, mode: Literal["full", "delta"]) -> WriteConfig:
    """The write config of one micro-batch: its run id and write mode, always on the live snapshot."""
    delta = DeltaSpec(write_mode=mode, delete_column=config.delta.delete_column if mode == "delta" else None,
                      base_run_id=None, max_chain_depth=config.delta.max_chain_depth)
    # A stream's first batch is a full write: an unset value_format is binary there, as in any full write.
    return replace(config, run_id=run_id, delta=delta, value=config.value.for_mode(mode)).validate()


def foreach_batch_writer(config: WriteConfig, *, stream_id: str, checkpoint_location: str | None = None,
                         stream_reset: bool = False, accept_live_run: str | None = None,
                         lease_seconds: float = DEFAULT_LEASE.total_seconds(),
                         faults: Faults = NO_FAULTS) -> BatchWriter:
    """The function for ``DataStreamWriter.foreachBatch``: one published snapshot per micro-batch.

    ``stream_id`` must stay the same across restarts of the query (same checkpoint); it starts
    every run id. The stream belongs to one checkpoint (the query id Spark keeps in it, read from
    the micro-batch's thread, or from ``checkpoint_location``'s ``metadata`` where that is not
    visible, as over Spark Connect): another checkpoint is refused unless ``stream_reset=True``,
    which continues the stream from the new checkpoint after the newest batch on the root. A batch
    is refused while ``_CURRENT`` names another run than the stream's last published batch, unless
    it names ``accept_live_run``. ``lease_seconds``: how long the writer's claim on the stream holds
    without a batch (renewed at each batch). ``faults`` is for tests (``spark_jobs.faults.Faults``).
    """
    validate_stream_id(stream_id)
    if not isinstance(stream_reset, bool):
        raise ConfigError(f"stream_reset {stream_reset!r} must be True or False")
    if accept_live_run is not None:
        layout.validate_run_id(accept_live_run, what="accept_live_run")
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)) or not 0 < lease_seconds < 1e9:
        raise ConfigError(f"lease_seconds {lease_seconds!r} must be a positive number of seconds")
    if not isinstance(config, WriteConfig):
        raise ConfigError(f"config must be a WriteConfig (build_write_config(...)), got {type(config).__name__}")
    config.validate()
    if config.options.publish is not True:
        raise ConfigError("a streaming writer publishes every micro-batch (the next one is a delta on it); "
                          "publish=False is not supported")
    if config.delta.write_mode == "compact":
        raise ConfigError("write_mode 'compact' reads no input; a streaming writer writes 'full' then 'delta' runs")
    if config.delta.base_run_id is not None:
        raise ConfigError(f"base_run_id {config.delta.base_run_id!r}: every micro-batch is written on the live "
                          "snapshot; leave base_run_id unset")
    return BatchWriter(config=config, stream_id=stream_id, faults=faults, checkpoint_location=checkpoint_location,
                       stream_reset=stream_reset, accept_live_run=accept_live_run,
                       lease=timedelta(seconds=lease_seconds))


def checkpoint_identity(spark, checkpoint_location: str | None, config: WriteConfig) -> str:
    """The identity of the checkpoint numbering the batches: the running query's id.

    Read from the micro-batch's thread (classic PySpark), else from ``<checkpoint_location>/metadata``
    (a ``file://``, local or S3 checkpoint, reached with the config's storage options).
    """
    try:
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # Spark Connect: no SparkContext
        query_id = None
    if query_id:
        return str(query_id)
    if not checkpoint_location:
        raise ConfigError("the writer cannot see which checkpoint numbers the batches (called outside a streaming "
                          "query's micro-batch, or over Spark Connect): pass checkpoint_location= to "
                          "foreach_batch_writer")
    store = open_store(checkpoint_location, config.storage_options)
    try:
        query_id = json.loads(store.get("metadata").data).get("id")
    except (ObjectNotFoundError, ValueError, AttributeError) as exc:
        raise ConfigError(f"checkpoint {checkpoint_location!r} has no readable metadata file (its query id): {exc}") \
            from None
    if not isinstance(query_id, str) or not query_id:
        raise ConfigError(f"checkpoint {checkpoint_location!r}: its metadata file names no query id")
    return query_id


def next_free_batch(snapshots: SnapshotRoot, stream_id: str) -> int:
    """One above the newest batch id of any run of the stream on the root (0: none)."""
    batches = [parsed[0] for run_id in snapshots.list_run_ids()
               if (parsed := parse_batch_run_id(stream_id, run_id)) is not None]
    return max(batches, default=-1) + 1


def decide(snapshots: SnapshotRoot, stream_id: str, batch_id: int, *, accept_live_run: str | None = None) -> Decision:
    """Read what the root holds about the stream's runs and decide about ``batch_id``."""
    pointer = snapshots.current()
    live = pointer.run_id if pointer is not None else None
    return decide_batch(stream_id, batch_id, stream_runs(snapshots, stream_id, batch_id, live), live_run_id=live,
                        accept_live_run=accept_live_run)


def stream_runs(snapshots: SnapshotRoot, stream_id: str, batch_id: int, live: str | None) -> list[StreamRun]:
    """The runs ``decide_batch`` needs: every attempt of ``batch_id`` and of later batches, and the
    newest published run of an earlier batch (for the gap warning). One LIST and a few run records."""
    named = []
    for run_id in snapshots.list_run_ids():
        parsed = parse_batch_run_id(stream_id, run_id)
        if parsed is not None:
            named.append((parsed[0], parsed[1], run_id))
    named.sort(reverse=True)
    runs = [_stream_run(snapshots, run_id, b, r, live) for b, r, run_id in named if b >= batch_id]
    for b, r, run_id in named:
        if b < batch_id:
            run = _stream_run(snapshots, run_id, b, r, live)
            if run.published:
                runs.append(run)
                break
    return runs


def _stream_run(snapshots: SnapshotRoot, run_id: str, batch_id: int, retry: int, live: str | None) -> StreamRun:
    try:
        record = snapshots.read_run(run_id)
    except (RunRecordError, StorageError) as exc:
        log.warning("run record of %s is unreadable (%s); counted as a failed attempt", run_id, exc)
        record = None
    if record is None:
        return StreamRun(run_id, batch_id, retry, "failed", published=run_id == live)
    published = record.published_at is not None or run_id == live
    return StreamRun(run_id, batch_id, retry, record.status, published=published, deleted=record.deleted_at is not None)
