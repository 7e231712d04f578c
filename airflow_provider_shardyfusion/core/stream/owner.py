"""Who writes a stream (SPEC §14): its checkpoint's identity and a writer's lease, kept under the root.

The batch id is the stream's idempotency key only as long as one checkpoint numbers the batches.
A second query with another checkpoint on the same ``stream_id``, or the same query after its
checkpoint was deleted, numbers its batches from 0 again: every one of them at or below the last
published batch would be skipped as a replay, its rows lost without a word. So the stream's owner
is recorded in ``runs/_streams/<stream_id>/_owner.json`` (``layout.stream_owner_key``), written by
conditional puts only:

- ``checkpoint_id``: the identity of the checkpoint that numbers the batches (the query id Spark
  keeps in the checkpoint's ``metadata`` file: the same across restarts, new for a new or reset
  checkpoint). Another checkpoint is refused unless the writer is given ``stream_reset=True``; it
  then continues the stream after the newest batch the root holds (``batch_offset``), so its batch
  0 is a new batch, not a replay.
- ``writer_id`` and ``lease_expires_at``: the writer instance that holds the stream, renewed at the
  start and end of every batch. A new writer of the same checkpoint takes over at once (a restart
  after a crash: the checkpoint guarantees it replays, never races); the writer it replaced is
  fenced (its next batch is refused). A reset never takes over a writer whose lease is live.
- Before a batch's run is committed (marked succeeded, then ``_CURRENT``), the writer reads the
  owner object again (``still_held``): a writer that lost the stream while its batch was written
  (its lease ran out and another writer took over) is refused there, whether or not the taker has
  published yet: its batch's base may still be live, so nothing else would stop it.

``claim`` and ``still_held`` are pure: the store calls are the writer's (``streaming.BatchWriter``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import StreamOwnershipError

__all__ = ["DEFAULT_LEASE", "STREAM_OWNER_FORMAT_VERSION", "Claim", "StreamOwner", "claim", "still_held"]

STREAM_OWNER_FORMAT_VERSION = 1
DEFAULT_LEASE = timedelta(minutes=10)
_WHAT = "stream owner"


@dataclass(frozen=True)
class StreamOwner:
    """The checkpoint whose batch ids the stream follows, and the writer holding it."""

    stream_id: str
    checkpoint_id: str
    writer_id: str
    acquired_at: datetime
    lease_expires_at: datetime
    # Stream batch id = batch_offset + the checkpoint's batch id (0 unless a reset continued the stream).
    batch_offset: int = 0
    # Audit of the last stream_reset: the checkpoint it replaced, and when.
    previous_checkpoint_id: str | None = None
    reset_at: datetime | None = None
    format_version: int = STREAM_OWNER_FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> StreamOwner:
        return _CODEC.from_dict(obj)

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamOwner:
        return _CODEC.from_bytes(data)


_CODEC = ser.Codec(StreamOwner, _WHAT, StreamOwnershipError, supported=STREAM_OWNER_FORMAT_VERSION)


@dataclass(frozen=True)
class Claim:
    """What ``claim`` decided: the owner object to write, and a warning to log (a takeover, a reset)."""

    owner: StreamOwner
    warning: str | None = None


def claim(current: StreamOwner | None, *, stream_id: str, checkpoint_id: str, writer_id: str, held: bool,
          now: datetime, lease: timedelta = DEFAULT_LEASE, stream_reset: bool = False,
          next_free_batch: int = 0) -> Claim:
    """The owner after ``writer_id`` (of checkpoint ``checkpoint_id``) claims the stream at ``now``.

    ``held``: this writer held the stream before (a writer that lost it is fenced, never takes it
    back). ``next_free_batch``: one above the newest batch id of any run of the stream on the root
    (where a reset continues). Raises ``StreamOwnershipError`` when the claim is refused.
    """
    layout.validate_run_id(stream_id, what="stream_id")
    mine = StreamOwner(stream_id=stream_id, checkpoint_id=checkpoint_id, writer_id=writer_id, acquired_at=now,
                       lease_expires_at=now + lease)
    if current is None:
        if stream_reset and next_free_batch:
            return Claim(replace(mine, batch_offset=next_free_batch, reset_at=now),
                         f"stream {stream_id!r}: stream_reset=True: checkpoint {checkpoint_id!r} continues the stream "
                         f"at batch {next_free_batch}")
        return Claim(mine)
    live = now < current.lease_expires_at
    if held and current.writer_id != writer_id:
        # Before the checkpoint test: a writer fenced by a reset of another checkpoint must not take
        # the stream back by a reset of its own once the new owner's lease runs out.
        of = "the same checkpoint" if current.checkpoint_id == checkpoint_id else f"checkpoint {current.checkpoint_id!r}"
        raise StreamOwnershipError(
            f"stream {stream_id!r}: writer {current.writer_id!r} of {of} took the stream over at "
            f"{layout.format_ts(current.acquired_at)}; this writer ({writer_id!r}) is fenced and stops. Run one query "
            "per stream"
        )
    if current.checkpoint_id != checkpoint_id:
        return _reset(current, mine, live=live, stream_reset=stream_reset, next_free_batch=next_free_batch)
    if current.writer_id == writer_id:
        return Claim(replace(current, lease_expires_at=now + lease))
    warning = (f"stream {stream_id!r}: writer {current.writer_id!r} of the same checkpoint still held a lease "
               f"until {layout.format_ts(current.lease_expires_at)}; taken over (a restart after a crash; were it "
               "still running, it is fenced at its next batch)") if live else None
    return Claim(replace(current, writer_id=writer_id, acquired_at=now, lease_expires_at=now + lease), warning)


def still_held(current: StreamOwner | None, *, stream_id: str, writer_id: str, now: datetime,
               lease: timedelta = DEFAULT_LEASE, held_until: datetime | None = None, what: str = "its batch") -> StreamOwner:
    """The owner with ``writer_id``'s lease renewed, for the conditional put just before it commits
    ``what``; ``StreamOwnershipError`` naming the owner and its lease when the writer lost the stream.

    A lease that ran out while nobody took the stream over is renewed, not refused: a batch may take
    longer than the lease, and the conditional put makes the renewal and a takeover exclusive.
    ``held_until``: when this writer's own lease ran out, as far as it knows (for the message).
    """
    if current is not None and current.writer_id == writer_id:
        return replace(current, lease_expires_at=now + lease)
    mine = f"this writer ({writer_id!r}" + (f", its lease until {layout.format_ts(held_until)})" if held_until else ")")
    holder = ("its owner object is gone" if current is None else
              f"it is held by writer {current.writer_id!r} of checkpoint {current.checkpoint_id!r} (since "
              f"{layout.format_ts(current.acquired_at)}, its lease until {layout.format_ts(current.lease_expires_at)})")
    raise StreamOwnershipError(
        f"stream {stream_id!r}: {mine} lost the stream while it wrote {what}: {holder}. Nothing of it is published "
        "(its run is marked failed) and this query's checkpoint does not commit it; this writer stops. Run one query "
        "per stream, with a lease longer than a batch takes"
    )


def _reset(current: StreamOwner, mine: StreamOwner, *, live: bool, stream_reset: bool, next_free_batch: int) -> Claim:
    """Another checkpoint claims the stream: refused, unless ``stream_reset`` and no other writer's lease is live."""
    stream_id = mine.stream_id
    if not stream_reset:
        raise StreamOwnershipError(
            f"stream {stream_id!r} belongs to checkpoint {current.checkpoint_id!r}, and this query's checkpoint is "
            f"{mine.checkpoint_id!r} (a second query on the same stream_id, or a deleted or reset checkpoint). Its "
            "batch ids start again at 0, and batches already published under those ids would be skipped as replays, "
            "their rows lost. Nothing was written. Use the original checkpoint_location, give this query its own "
            "stream_id, or pass stream_reset=True to continue the stream from this checkpoint (its batch 0 becomes "
            f"stream batch {next_free_batch})"
        )
    if live and current.writer_id != mine.writer_id:
        raise StreamOwnershipError(
            f"stream {stream_id!r}: stream_reset=True, but writer {current.writer_id!r} of checkpoint "
            f"{current.checkpoint_id!r} holds the stream until {layout.format_ts(current.lease_expires_at)}. Stop "
            "that query (or wait for its lease to run out), then start this one again; nothing was written"
        )
    return Claim(replace(mine, batch_offset=next_free_batch, previous_checkpoint_id=current.checkpoint_id,
                         reset_at=mine.acquired_at),
                 f"stream {stream_id!r}: stream_reset=True: checkpoint {mine.checkpoint_id!r} replaces checkpoint "
                 f"{current.checkpoint_id!r}; its batch 0 is stream batch {next_free_batch}")
