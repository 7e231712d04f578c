"""Who writes a stream (SPEC §14, ``core.stream.owner``): checkpoint identity and writer lease, without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import StreamOwnershipError
from airflow_provider_shardyfusion.core.stream.owner import StreamOwner, claim, still_held

S = "orders.ingest"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(minutes=10)


def owner_after(*claims) -> StreamOwner:
    current = None
    for kw in claims:
        current = claim(current, stream_id=S, lease=LEASE, **{"held": False, "next_free_batch": 0, **kw}).owner
    return current


def test_the_first_writer_owns_the_stream_and_renews_its_lease():
    first = claim(None, stream_id=S, checkpoint_id="cp-a", writer_id="w1", held=False, now=T0)
    assert (first.owner.checkpoint_id, first.owner.writer_id, first.owner.batch_offset, first.warning) == (
        "cp-a", "w1", 0, None)
    later = claim(first.owner, stream_id=S, checkpoint_id="cp-a", writer_id="w1", held=True, now=T0 + LEASE * 3)
    assert later.owner.lease_expires_at == T0 + LEASE * 4 and later.owner.acquired_at == T0


def test_a_restart_of_the_same_checkpoint_takes_over_at_once_and_fences_the_old_writer():
    current = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0})
    # Killed, restarted a second later: its lease is still live, and the restart is not refused.
    restart = claim(current, stream_id=S, checkpoint_id="cp-a", writer_id="w2", held=False,
                    now=T0 + timedelta(seconds=1))
    assert restart.owner.writer_id == "w2" and "taken over" in restart.warning
    # Were w1 still alive, its next batch is refused: it never takes the stream back.
    with pytest.raises(StreamOwnershipError, match=r"'w1'.*is fenced"):
        claim(restart.owner, stream_id=S, checkpoint_id="cp-a", writer_id="w1", held=True,
              now=T0 + timedelta(seconds=2))


@pytest.mark.parametrize("held", [False, True])
def test_another_checkpoint_is_refused_without_stream_reset(held):
    current = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0})
    # Long after the lease ran out, and even for the same writer object given a new checkpoint.
    with pytest.raises(StreamOwnershipError) as caught:
        claim(current, stream_id=S, checkpoint_id="cp-b", writer_id="w1" if held else "w2", held=held,
              now=T0 + timedelta(days=3), next_free_batch=8)
    message = str(caught.value)
    assert "belongs to checkpoint 'cp-a'" in message and "checkpoint is 'cp-b'" in message
    assert "stream_reset=True" in message and "stream batch 8" in message and "Nothing was written" in message


def test_stream_reset_continues_after_the_newest_batch_once_no_other_lease_is_live():
    current = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0})
    with pytest.raises(StreamOwnershipError, match=r"holds the stream until 2026-01-01T00:10:00.000000Z"):
        claim(current, stream_id=S, checkpoint_id="cp-b", writer_id="w2", held=False, now=T0 + timedelta(minutes=1),
              stream_reset=True, next_free_batch=8)
    reset = claim(current, stream_id=S, checkpoint_id="cp-b", writer_id="w2", held=False, now=T0 + LEASE,
                  stream_reset=True, next_free_batch=8)
    assert (reset.owner.checkpoint_id, reset.owner.batch_offset, reset.owner.previous_checkpoint_id) == ("cp-b", 8, "cp-a")
    assert reset.owner.reset_at == T0 + LEASE and "stream batch 8" in reset.warning
    # From then on the new checkpoint is the owner; stream_reset left set changes nothing.
    again = claim(reset.owner, stream_id=S, checkpoint_id="cp-b", writer_id="w3", held=False,
                  now=T0 + LEASE * 5, stream_reset=True, next_free_batch=20)
    assert (again.owner.checkpoint_id, again.owner.batch_offset) == ("cp-b", 8)


def test_the_owner_object_round_trips_and_refuses_a_newer_format():
    owner = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0},
                        {"checkpoint_id": "cp-b", "writer_id": "w2", "now": T0 + LEASE, "stream_reset": True,
                         "next_free_batch": 4})
    assert StreamOwner.from_bytes(owner.to_bytes()) == owner
    assert StreamOwner.from_dict(owner.to_dict()) == owner
    with pytest.raises(StreamOwnershipError, match="format_version 2, newer"):
        StreamOwner.from_bytes(owner.to_bytes().replace(b'"format_version":1', b'"format_version":2'))
    with pytest.raises(StreamOwnershipError, match="checkpoint_id"):
        StreamOwner.from_dict({**owner.to_dict(), "checkpoint_id": None})
    assert layout.stream_owner_key(S) == "runs/_streams/orders.ingest/_owner.json"


def test_a_writer_must_still_hold_the_stream_when_it_commits_a_batch():
    mine = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0})
    # Its lease ran out but nobody took the stream: a batch longer than the lease still commits, renewed.
    late = T0 + LEASE * 2
    assert still_held(mine, stream_id=S, writer_id="w1", now=late, lease=LEASE) == \
        StreamOwner(S, "cp-a", "w1", T0, late + LEASE)
    # Taken over meanwhile (a reset checkpoint here): refused, naming the stream, the owner and both leases.
    taker = claim(mine, stream_id=S, checkpoint_id="cp-b", writer_id="w2", held=False, now=late, lease=LEASE,
                  stream_reset=True, next_free_batch=3).owner
    with pytest.raises(StreamOwnershipError) as refused:
        still_held(taker, stream_id=S, writer_id="w1", now=late, held_until=mine.lease_expires_at, what="run 'r-1'")
    said = str(refused.value)
    for needle in ("stream 'orders.ingest'", "this writer ('w1', its lease until 2026-01-01T00:10:00.000000Z)",
                   "writer 'w2' of checkpoint 'cp-b'", f"lease until {layout.format_ts(late + LEASE)}", "run 'r-1'",
                   "Nothing of it is published"):
        assert needle in said, (needle, said)
    with pytest.raises(StreamOwnershipError, match="its owner object is gone"):
        still_held(None, stream_id=S, writer_id="w1", now=late)


def test_a_writer_fenced_by_a_reset_never_takes_the_stream_back_by_a_reset_of_its_own():
    current = owner_after({"checkpoint_id": "cp-a", "writer_id": "w1", "now": T0})
    # A new checkpoint resets the stream once w1's lease ran out; w1 was only slow, not gone.
    taken = claim(current, stream_id=S, checkpoint_id="cp-b", writer_id="w2", held=False, now=T0 + LEASE * 2,
                  stream_reset=True, next_free_batch=5).owner
    assert (taken.checkpoint_id, taken.writer_id) == ("cp-b", "w2")
    # Long after w2's lease ran out too, w1 (started with stream_reset=True) comes back: still fenced.
    with pytest.raises(StreamOwnershipError, match=r"writer 'w2' of checkpoint 'cp-b' took .*'w1'\) is fenced"):
        claim(taken, stream_id=S, checkpoint_id="cp-a", writer_id="w1", held=True, now=T0 + LEASE * 10,
              stream_reset=True, next_free_batch=6)
    # A new writer of cp-a that never held the stream may still reset it, as before.
    back = claim(taken, stream_id=S, checkpoint_id="cp-a", writer_id="w3", held=False, now=T0 + LEASE * 10,
                 stream_reset=True, next_free_batch=6)
    assert (back.owner.checkpoint_id, back.owner.writer_id, back.owner.batch_offset) == ("cp-a", "w3", 6)
