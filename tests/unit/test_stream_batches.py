"""Run ids of streaming micro-batches and the per-batch decision (SPEC §14), without Spark or storage."""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, StreamOwnershipError
from airflow_provider_shardyfusion.core.stream.batches import (
    StreamRun,
    batch_run_id,
    decide_batch,
    parse_batch_run_id,
    validate_stream_id,
)
from airflow_provider_shardyfusion.streaming import check_stream_options, foreach_batch_writer

S = "orders.ingest"


def run(batch_id, retry=0, status="succeeded", published=True, deleted=False, stream=S):
    return StreamRun(batch_run_id(stream, batch_id, retry), batch_id, retry, status, published, deleted)


def test_run_ids_name_stream_batch_and_retry():
    assert batch_run_id(S, 0) == "orders.ingest-b000000000000"
    assert batch_run_id(S, 42, 3) == "orders.ingest-b000000000042-r3"
    assert batch_run_id(S, 10**13) == "orders.ingest-b10000000000000"
    assert parse_batch_run_id(S, "orders.ingest-b000000000042-r3") == (42, 3)
    assert parse_batch_run_id(S, "orders.ingest-b000000000042") == (42, 0)
    assert parse_batch_run_id(S, batch_run_id(S, 10**13)) == (10**13, 0)
    # Other streams, other runs, non-canonical names are not this stream's batches.
    for other in ("orders.ingest2-b000000000042", "orders-b000000000042", "orders.ingest-b42",
                  "orders.ingest-b0000000000042", "orders.ingest-b000000000042-r0", "20260101T000000Z-abcd1234",
                  "orders.ingest-b000000000001-b000000000002"):
        assert parse_batch_run_id(S, other) is None, other
    assert parse_batch_run_id("orders", "orders.ingest-b000000000042") is None


@pytest.mark.parametrize("bad", ["", "a b", "x/y", "..", "é", "a" * 97, None, 7])
def test_stream_id_must_be_a_run_id_fragment(bad):
    with pytest.raises(ConfigError, match="stream_id"):
        validate_stream_id(bad)


@pytest.mark.parametrize(("batch_id", "retry"), [(-1, 0), (1, -1), (True, 0), ("3", 0)])
def test_batch_and_retry_numbers_are_checked(batch_id, retry):
    with pytest.raises(ConfigError):
        batch_run_id(S, batch_id, retry)


def test_first_batch_on_an_empty_root_is_full():
    d = decide_batch(S, 0, [], live_run_id=None)
    assert (d.action, d.run_id, d.write_mode, d.warning) == ("write", batch_run_id(S, 0), "full", None)


def test_next_batch_is_a_delta_on_the_live_run():
    live = batch_run_id(S, 4)
    d = decide_batch(S, 5, [run(4)], live_run_id=live)
    assert (d.action, d.run_id, d.write_mode, d.last_published_batch) == ("write", batch_run_id(S, 5), "delta", 4)
    # A root whose live snapshot came from a batch write: the stream starts with a delta on it.
    d = decide_batch(S, 0, [], live_run_id="bootstrap-full")
    assert (d.action, d.write_mode) == ("write", "delta")


def test_a_replayed_batch_is_skipped():
    live = batch_run_id(S, 5, 1)
    runs = [run(5, 0, status="failed", published=False), run(5, 1)]
    d = decide_batch(S, 5, runs, live_run_id=live)
    assert (d.action, d.run_id) == ("skip", live)
    assert "already published" in d.reason
    # Live by the pointer even when published_at could not be stamped.
    d = decide_batch(S, 5, [run(5, published=False)], live_run_id=batch_run_id(S, 5))
    assert (d.action, d.run_id) == ("skip", batch_run_id(S, 5))


def test_a_batch_below_the_last_published_one_is_skipped():
    runs = [run(7), run(6, published=False, status="failed")]
    d = decide_batch(S, 6, runs, live_run_id=batch_run_id(S, 7))
    assert (d.action, d.run_id, d.last_published_batch) == ("skip", batch_run_id(S, 7), 7)
    assert "superseded" in d.reason
    # Published earlier but no longer live (rolled back): still not applied again.
    d = decide_batch(S, 3, [run(9)], live_run_id=batch_run_id(S, 2))
    assert d.action == "skip"


def test_failed_and_dead_attempts_are_rewritten_with_the_next_retry():
    live = batch_run_id(S, 1)
    runs = [run(1), run(2, 0, status="failed", published=False), run(2, 1, status="running", published=False)]
    d = decide_batch(S, 2, runs, live_run_id=live)
    assert (d.action, d.run_id, d.write_mode) == ("write", batch_run_id(S, 2, 2), "delta")
    assert d.abandon == (batch_run_id(S, 2, 1),)
    assert "failed" in d.reason and "dead running record" in d.reason


def test_a_succeeded_unpublished_attempt_is_written_again_not_published():
    # The job commits only the run it writes: an attempt left staged is never published by it.
    live = batch_run_id(S, 1)
    d = decide_batch(S, 2, [run(1), run(2, published=False)], live_run_id=live)
    assert (d.action, d.run_id, d.write_mode) == ("write", batch_run_id(S, 2, 1), "delta")
    assert "never published (its writer stopped before _CURRENT moved)" in d.reason
    # The first batch: a full run staged on an empty root.
    d = decide_batch(S, 0, [run(0, published=False)], live_run_id=None)
    assert (d.action, d.run_id, d.write_mode) == ("write", batch_run_id(S, 0, 1), "full")
    # Deleted by cleanup: the reason says so.
    d = decide_batch(S, 2, [run(1), run(2, published=False, deleted=True)], live_run_id=live)
    assert (d.action, d.run_id) == ("write", batch_run_id(S, 2, 1))
    assert "its data was deleted" in d.reason


@pytest.mark.parametrize(("live", "why"), [
    (batch_run_id(S, 3), "a rollback to an earlier batch of the stream"),
    ("20260101T000000Z-abcd1234", "another writer's full write went live"),
    (None, "_CURRENT deleted"),
])
def test_a_batch_is_refused_while_current_is_not_the_streams_last_batch(live, why):
    runs = [run(3), run(5), run(4)]
    with pytest.raises(StreamOwnershipError) as caught:
        decide_batch(S, 6, runs, live_run_id=live)
    message = str(caught.value)
    assert f"last batch 5 was published as run {batch_run_id(S, 5)!r}" in message, why
    assert (f"_CURRENT names run {live!r}" if live else "_CURRENT names no run") in message
    assert f"accept_live_run={live!r}" in message and "nothing was written" in message
    # Named explicitly, the stream continues on it: a delta on that run (full on an empty root).
    d = decide_batch(S, 6, runs, live_run_id=live, accept_live_run=live) if live else None
    assert d is None or (d.action, d.run_id, d.write_mode) == ("write", batch_run_id(S, 6), "delta")
    # A replay is still a replay: nothing to write, nothing refused.
    assert decide_batch(S, 5, runs, live_run_id=live).action == "skip"


def test_a_gap_is_warned_and_written():
    d = decide_batch(S, 9, [run(6)], live_run_id=batch_run_id(S, 6))
    assert (d.action, d.run_id) == ("write", batch_run_id(S, 9))
    assert d.warning is not None and "7..8" in d.warning


def test_other_streams_do_not_count():
    other = run(9, stream="other")
    d = decide_batch(S, 3, [other], live_run_id=other.run_id)
    assert (d.action, d.run_id, d.write_mode, d.last_published_batch) == ("write", batch_run_id(S, 3), "delta", None)


def test_async_progress_tracking_is_refused_with_the_reason():
    check_stream_options({"checkpointLocation": "/x", "asyncProgressTrackingEnabled": "false"})
    with pytest.raises(ConfigError, match=r"asyncProgressTrackingEnabled.*asynchronously.*replay a batch id"):
        check_stream_options({"asyncProgressTrackingEnabled": "true"})


def test_writer_refuses_configs_it_cannot_stream(tmp_path):
    from airflow_provider_shardyfusion.core.model.config import build_write_config

    base = {"output_uri": str(tmp_path), "input_path": str(tmp_path / "in"), "key_column": "id",
            "value_column": "v", "num_dbs": 2}
    with pytest.raises(ConfigError, match="stream_id"):
        foreach_batch_writer(build_write_config(**base), stream_id="no spaces")
    with pytest.raises(ConfigError, match="publish=False"):
        foreach_batch_writer(build_write_config(**base, publish=False), stream_id=S)
    with pytest.raises(ConfigError, match="base_run_id"):
        foreach_batch_writer(build_write_config(**base, write_mode="delta", base_run_id="r1"), stream_id=S)
    writer = foreach_batch_writer(build_write_config(**base, write_mode="delta", delete_column="d"), stream_id=S)
    assert writer.stream_id == S and writer.outcomes == []
