"""Winner selection per shard (SPEC §6 step 10)."""

from __future__ import annotations

import itertools
import random

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardCoverageError
from airflow_provider_shardyfusion.core.model.manifest import ShardFile
from airflow_provider_shardyfusion.core.write.winner import ShardResult, select_winners

ROOT = "s3://bkt/snap"


def result(db_id, attempt=0, task=None, *, rows=5, url=None):
    if rows == 0:
        return ShardResult(db_id=db_id, attempt=attempt, task_attempt_id=task, db_url=None, row_count=0)
    return ShardResult(
        db_id=db_id, attempt=attempt, task_attempt_id=task,
        db_url=url or layout.join(ROOT, layout.attempt_key("r1", db_id, attempt, task)),
        row_count=rows, byte_size=rows * 10, min_key="00", max_key="ff",
        files=(ShardFile("000001.sst", rows * 10, "xxh3_128:" + "0" * 32),),
    )


def all_orders(results):
    orders = list(itertools.permutations(results)) if len(results) <= 6 else []
    rng = random.Random(7)
    for _ in range(20):
        shuffled = list(results)
        rng.shuffle(shuffled)
        orders.append(tuple(shuffled))
    return orders


def test_one_result_per_shard_all_win():
    results = [result(i, task=i) for i in range(4)]
    sel = select_winners(results, 4)
    assert sel.winners == {i: results[i] for i in range(4)}
    assert sel.losers == () and sel.empty_db_ids == () and sel.attempts_seen == 4
    assert [e.db_id for e in sel.entries()] == [0, 1, 2, 3]
    assert sel.entries()[2].db_url == results[2].db_url


def test_smallest_attempt_wins():
    a0, a1, a2 = result(1, 0, 30), result(1, 1, 10), result(1, 2, 5)
    for order in all_orders([a2, a0, a1]):
        sel = select_winners(order, 2)
        assert sel.winners == {1: a0}
        assert sorted(sel.losers, key=lambda r: r.attempt) == [a1, a2]
        assert sel.empty_db_ids == (0,)


def test_tie_on_attempt_broken_by_task_attempt_id():
    low, high = result(0, 1, 11), result(0, 1, 12)
    for order in all_orders([high, low]):
        assert select_winners(order, 1).winners[0] is low


def test_tie_on_attempt_and_task_broken_by_db_url():
    a = result(0, 0, 3, url=f"{ROOT}/shards/run_id=r1/db=00000/attempt=00-task=3a")
    b = result(0, 0, 3, url=f"{ROOT}/shards/run_id=r1/db=00000/attempt=00-task=3b")
    for order in all_orders([b, a]):
        sel = select_winners(order, 1)
        assert sel.winners[0] is a and sel.losers == (b,)


def test_missing_task_attempt_id_sorts_first():
    none_id, with_id = result(0, 0, None), result(0, 0, 0)
    for order in all_orders([with_id, none_id]):
        assert select_winners(order, 1).winners[0] is none_id


def test_speculative_duplicates_one_winner_rest_losers():
    # Speculation: same attempt number 0, different task attempt ids, for every shard.
    results = [result(db, 0, task) for db in range(3) for task in (100 + db, 200 + db, 300 + db)]
    for order in all_orders(results):
        sel = select_winners(order, 3)
        assert {db: w.task_attempt_id for db, w in sel.winners.items()} == {0: 100, 1: 101, 2: 102}
        assert len(sel.losers) == 6
        assert {(r.db_id, r.task_attempt_id) for r in sel.losers} == {
            (db, t + db) for db in range(3) for t in (200, 300)
        }
        assert sel.attempts_seen == 9
        assert not {w.db_url for w in sel.winners.values()} & {r.db_url for r in sel.losers}


def test_stage_retry_attempt_numbers_restart():
    # After a stage retry attempt numbers restart at 0 but task attempt ids keep growing.
    first, retried = result(0, 0, 4), result(0, 0, 17)
    assert first.db_url != retried.db_url
    assert select_winners([retried, first], 1).winners[0] is first


def test_empty_shards_left_out_and_listed():
    results = [result(0), result(1, rows=0), result(3)]
    sel = select_winners(results, 5)
    assert set(sel.winners) == {0, 3}
    assert sel.empty_db_ids == (1, 2, 4)
    assert [e.db_id for e in sel.entries()] == [0, 3]
    assert sel.losers == ()


def test_empty_winner_attempt_makes_shard_empty():
    # The winning attempt decides: an empty smallest attempt means the shard is empty.
    empty, full = result(0, 0, 1, rows=0), result(0, 1, 2)
    sel = select_winners([full, empty], 1)
    assert sel.winners == {} and sel.empty_db_ids == (0,) and sel.losers == (full,)


def test_all_empty():
    sel = select_winners([result(i, rows=0) for i in range(3)], 3)
    assert sel.winners == {} and sel.empty_db_ids == (0, 1, 2) and sel.entries() == ()


def test_no_results_at_all():
    sel = select_winners([], 2)
    assert sel.winners == {} and sel.empty_db_ids == (0, 1) and sel.attempts_seen == 0


@pytest.mark.parametrize("db_id", [4, -1, 1000])
def test_id_outside_range(db_id):
    with pytest.raises(ShardCoverageError, match=rf"db_id {db_id} is outside \[0, 4\)"):
        select_winners([result(0), result(db_id)], 4)


def test_empty_result_has_no_manifest_entry():
    with pytest.raises(ShardCoverageError, match="empty"):
        result(0, rows=0).to_entry()


def test_shard_result_dict_round_trip():
    r = result(3, 1, 99)
    r = ShardResult(**{**r.__dict__, "timings": {"write": 1.5, "upload": 0.25}})
    assert ShardResult.from_dict(r.to_dict()) == r
    empty = result(2, rows=0)
    assert ShardResult.from_dict(empty.to_dict()) == empty


def test_a_malformed_task_result_names_the_field():
    """A result from an executor of another build, or damaged on the way, is one error naming its field."""
    from airflow_provider_shardyfusion.core.errors import ShardWriteError
    from airflow_provider_shardyfusion.core.write.delta import LayerResult

    sent = result(3, 1, 99).to_dict()
    with pytest.raises(ShardWriteError, match=r"shard task result: field 'row_count' is missing or not int \(got '5'\) "
                                              r"at \$\.row_count"):
        ShardResult.from_dict({**sent, "row_count": "5"})
    with pytest.raises(ShardWriteError, match=r"shard task result: field 'db_id' is missing"):
        ShardResult.from_dict({k: v for k, v in sent.items() if k != "db_id"})
    layer = LayerResult(db_id=1, attempt=0, task_attempt_id=7, db_url=None)
    assert LayerResult.from_dict(layer.to_dict()) == layer
    with pytest.raises(ShardWriteError, match=r"layer task result: field 'inserted' is missing or not int .* "
                                              r"at \$\.counts\.inserted"):
        LayerResult.from_dict({**layer.to_dict(), "counts": {**layer.to_dict()["counts"], "inserted": None}})
