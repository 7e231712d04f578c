"""Stream ownership on the S3 test server (issue 42 item 10): the owner object's conditional puts
decide on S3 as on ``file://``.

Real Structured Streaming queries (``availableNow``, one file per micro-batch) through
``foreach_batch_writer`` into a bucket of the moto S3 server on loopback; every snapshot is read
back with ``ShardedReader`` and compared with a model the test builds.

- Two queries (two checkpoints) started at once on one ``stream_id``: one owns the stream and writes
  its batches; the other is refused with a ``StreamOwnershipError`` before it writes anything.
- A writer whose lease (1 s) runs out while it holds mid-batch (just before publishing, by the test
  faults' ``hold_before_publish``): a ``stream_reset`` query takes the stream over and publishes
  its batch; released, the first writer's batch fails cleanly (its run never goes live) and the
  writer is fenced. Never two owners publishing: every live run is the stream's, one per batch.
- The other order: the held writer is released after the ``stream_reset`` query took the stream
  over but before that query publishes (it holds just before publishing too). The held batch's
  base is still live, so only the ownership check before the commit stops it: it fails with a
  ``StreamOwnershipError`` naming the stream, the new owner and the lease expiry, its run record
  failed, nothing of it live; the taker then publishes, and the snapshot is exactly the model.
"""

from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.stream.batches import batch_run_id, parse_batch_run_id
from airflow_provider_shardyfusion.core.stream.owner import StreamOwner
from airflow_provider_shardyfusion.spark_jobs.faults import Faults
from airflow_provider_shardyfusion.streaming import foreach_batch_writer
from tests.stream_model import NUM_DBS, STREAM, Stream

pytestmark = [pytest.mark.spark, pytest.mark.s3]


class S3Stream(Stream):
    """A ``Stream`` whose root is a bucket of the S3 test server."""

    def __init__(self, spark, folder, root: str, options: dict):
        folder.mkdir()
        super().__init__(spark, folder)
        self.root, self.options = root, options
        self.config = build_write_config(output_uri=root, storage_options=options, input_path=str(self.source),
                                         key_column="id", value_column="payload", num_dbs=NUM_DBS,
                                         write_mode="delta", delete_column="deleted", max_chain_depth=3)

    def snapshots(self) -> SnapshotRoot:
        return SnapshotRoot.open(self.root, self.options)

    def values_off_model(self) -> tuple[int, int]:
        keys = sorted(self.model) + sorted(self.deleted)
        with ShardedReader(self.root, storage_options=self.options) as reader:
            got = reader.multi_get(keys)
        return sum(g != self.model.get(k) for k, g in zip(keys, got, strict=True)), len(keys)

    def published(self) -> dict[int, list[str]]:
        """Per stream batch id, the runs of the stream ever published."""
        out: dict[int, list[str]] = {}
        for run_id, record in self.stream_records().items():
            if record.published_at is not None:
                out.setdefault(parse_batch_run_id(STREAM, run_id)[0], []).append(run_id)
        return out


def share(first: S3Stream, second: S3Stream) -> None:
    """``second`` writes the same stream: same root and model."""
    second.model, second.deleted = first.model, first.deleted


def run_at_once(*jobs) -> list:
    results: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int, stream: S3Stream, writer) -> None:
        start.wait()
        results[i] = stream.run_query(writer)

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def test_two_queries_racing_for_one_stream_on_s3(spark, tmp_path, s3_root, s3_options, figure):
    a = S3Stream(spark, tmp_path / "a", s3_root, s3_options)
    b = S3Stream(spark, tmp_path / "b", s3_root, s3_options)
    a_files = [{k: f"a{n}-{k}" for k in range(n * 10, n * 10 + 30)} for n in range(2)]
    b_files = [{k: f"b{n}-{k}" for k in range(100 + n * 10, 130 + n * 10)} for n in range(2)]
    wa, wb = foreach_batch_writer(a.config, stream_id=STREAM), foreach_batch_writer(b.config, stream_id=STREAM)
    for fa, fb in zip(a_files, b_files, strict=True):
        a.add_file(fa)
        b.add_file(fb)
    errors = run_at_once((a, wa), (b, wb))
    refused = [e for e in errors if e is not None]
    assert len(refused) == 1 and "StreamOwnershipError" in str(refused[0]), errors
    assert "belongs to checkpoint" in str(refused[0]), str(refused[0])[:2000]
    winner = a if errors[0] is None else b
    won, lost = (wa, wb) if winner is a else (wb, wa)
    assert lost.outcomes == [] and [(o.batch_id, o.action) for o in won.outcomes] == [(0, "written"), (1, "written")]
    winner.check_each_batch_live_once(2)
    off, checked = winner.values_off_model()
    assert off == 0
    owner = StreamOwner.from_bytes(winner.snapshots().store.get(layout.stream_owner_key(STREAM)).data)
    assert owner.writer_id == won.writer_id
    figure(writers=2, owners=1, refused=len(refused), batches_live=len(winner.published()), keys_off_model=off,
           keys_checked=checked)


def test_a_lease_that_expires_mid_batch_never_makes_two_owners_publish(spark, tmp_path, s3_root, s3_options,
                                                                       figure):
    a = S3Stream(spark, tmp_path / "a", s3_root, s3_options)
    a.add_file({k: f"a0-{k}" for k in range(40)})
    assert a.run_query(foreach_batch_writer(a.config, stream_id=STREAM, lease_seconds=1)) is None
    # A's next batch: its writer holds just before publishing, past its 1 s lease. Its file is
    # kept out of the model: that batch must not go live.
    model, deleted = dict(a.model), set(a.deleted)
    a.add_file({k: f"a1-{k}" for k in range(0, 40, 2)}, [1])
    a.model.clear(), a.model.update(model), a.deleted.clear(), a.deleted.update(deleted)
    marker, release = tmp_path / "held", tmp_path / "release"
    held = foreach_batch_writer(a.config, stream_id=STREAM, lease_seconds=1, faults=Faults(
        {"hold_before_publish": {"marker": str(marker), "release": str(release), "seconds": 120}}))
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(a.run_query(held)))
    thread.start()
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    time.sleep(1.5)  # the held writer's lease has run out
    owner_before = StreamOwner.from_bytes(a.snapshots().store.get(layout.stream_owner_key(STREAM)).data)
    assert owner_before.writer_id == held.writer_id and owner_before.lease_expires_at < layout.utc_now()

    b = S3Stream(spark, tmp_path / "b", s3_root, s3_options)
    share(a, b)
    b.add_file({k: f"b0-{k}" for k in range(30, 60)}, [2])
    taker = foreach_batch_writer(b.config, stream_id=STREAM, stream_reset=True)
    assert b.run_query(taker) is None
    assert [(o.batch_id, o.action) for o in taker.outcomes] == [(2, "written")]  # after the held batch 1
    live = b.snapshots().current().run_id
    release.write_text("go")
    thread.join(timeout=300)
    error = outcome[0]
    assert error is not None and held.outcomes == [], (error, held.outcomes)
    said = str(error)
    # Refused at its publish (its base is no longer live), or fenced by its lease: a clean failure.
    assert any(n in said for n in ("BaseNotLiveError", "StreamOwnershipError", "is not live")), said[-3000:]
    snapshots = b.snapshots()
    assert snapshots.current().run_id == live  # the held writer's publish moved nothing
    published = b.published()
    assert sorted(published) == [0, 2] and all(len(runs) == 1 for runs in published.values()), published
    off, checked = b.values_off_model()
    assert off == 0
    figure(writers=2, leases_expired_mid_batch=1, batches_published_by_taker=1, held_batch_published=int(1 in published),
           live_runs_per_batch=max(len(r) for r in published.values()), keys_off_model=off, keys_checked=checked,
           held_error=next(n for n in ("BaseNotLiveError", "StreamOwnershipError", "not live") if n in said))


def wait_for(path, thread: threading.Thread, outcome: list, timeout: float = 180) -> None:
    """Until ``path`` exists (a writer reached its hold); the query in ``thread`` must not end before."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)


def start_query(stream: S3Stream, writer) -> tuple[threading.Thread, list]:
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(stream.run_query(writer)))
    thread.start()
    return thread, outcome


def test_a_writer_released_before_the_taker_publishes_is_refused_by_its_lease(spark, tmp_path, s3_root, s3_options,
                                                                              figure):
    a = S3Stream(spark, tmp_path / "a", s3_root, s3_options)
    a.add_file({k: f"a0-{k}" for k in range(40)})
    model, deleted = dict(a.model), set(a.deleted)
    # Batch 1 is held just before publishing, past the 1 s lease; kept out of the model: it must not go live.
    a.add_file({k: f"a1-{k}" for k in range(0, 40, 2)}, [1])
    a.model.clear(), a.model.update(model), a.deleted.clear(), a.deleted.update(deleted)
    # One query, two batches: batch 0's release exists already, so only batch 1 holds.
    hold = {"marker": str(tmp_path / "held-{run_id}"), "release": str(tmp_path / "release-{run_id}"), "seconds": 240}
    (tmp_path / f"release-{batch_run_id(STREAM, 0)}").write_text("go")
    held = foreach_batch_writer(a.config, stream_id=STREAM, lease_seconds=1,
                                faults=Faults({"hold_before_publish": hold}))
    b = S3Stream(spark, tmp_path / "b", s3_root, s3_options)
    share(a, b)
    taker_hold = {"marker": str(tmp_path / "taker-held"), "release": str(tmp_path / "taker-release"), "seconds": 240}
    taker = foreach_batch_writer(b.config, stream_id=STREAM, stream_reset=True,
                                 faults=Faults({"hold_before_publish": taker_hold}))
    held_release, taker_release = tmp_path / f"release-{batch_run_id(STREAM, 1)}", tmp_path / "taker-release"
    threads: list[threading.Thread] = []
    try:
        held_thread, held_outcome = start_query(a, held)
        threads.append(held_thread)
        wait_for(tmp_path / f"held-{batch_run_id(STREAM, 1)}", held_thread, held_outcome)
        time.sleep(1.5)  # the held writer's lease has run out

        b.add_file({k: f"b0-{k}" for k in range(30, 60)}, [2])
        taker_thread, taker_outcome = start_query(b, taker)
        threads.append(taker_thread)
        wait_for(tmp_path / "taker-held", taker_thread, taker_outcome)  # the taker owns the stream, not published yet
        owner = StreamOwner.from_bytes(b.snapshots().store.get(layout.stream_owner_key(STREAM)).data)
        assert owner.writer_id == taker.writer_id
        live_before = b.snapshots().current().run_id
        assert live_before == batch_run_id(STREAM, 0)  # the held batch's base is still live

        held_release.write_text("go")  # the held writer first
        held_thread.join(timeout=300)
        said = str(held_outcome[0])
        assert held_outcome[0] is not None and "StreamOwnershipError" in said, said[-3000:]
        for needle in (repr(STREAM), repr(taker.writer_id), layout.format_ts(owner.lease_expires_at)):
            assert needle in said, (needle, said[-3000:])
        assert [(o.batch_id, o.action) for o in held.outcomes] == [(0, "written")]
        snapshots = b.snapshots()
        assert snapshots.current().run_id == live_before  # the refused writer moved nothing
        record = snapshots.read_run(batch_run_id(STREAM, 1))
        assert record.status == "failed" and record.published_at is None, record
        assert record.error is not None and record.error.type == "StreamOwnershipError", record.error

        taker_release.write_text("go")
        taker_thread.join(timeout=300)
        assert taker_outcome == [None]
        assert [(o.batch_id, o.action) for o in taker.outcomes] == [(2, "written")]
        assert b.snapshots().current().run_id == batch_run_id(STREAM, 2)
    finally:  # whatever failed, no query is left holding
        held_release.write_text("go"), taker_release.write_text("go")
        for thread in threads:
            thread.join(timeout=300)
    published = b.published()
    assert sorted(published) == [0, 2] and all(len(runs) == 1 for runs in published.values()), published
    off, checked = b.values_off_model()
    assert off == 0
    figure(writers=2, held_released_before_taker_published=1, held_batch_published=int(1 in published),
           held_run_status=record.status, live_runs_per_batch=max(len(r) for r in published.values()),
           keys_off_model=off, keys_checked=checked, held_error="StreamOwnershipError")
