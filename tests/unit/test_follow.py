"""The follower alone (core/read/follow.py): waits, backoff, callbacks, stop; no store, no reader."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError, UnusableSnapshotError
from airflow_provider_shardyfusion.core.read.follow import (
    JITTER,
    MAX_BACKOFF_INTERVALS,
    Follower,
    check_follow_arguments,
    next_wait,
)
from tests.polling import wait_for


class FakeWatch:
    def __init__(self, answers):
        self.answers = list(answers)
        self.settled = 0

    def moved(self):
        answer = self.answers.pop(0) if self.answers else False
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def settle(self):
        self.settled += 1


def follower(watch, **kwargs):
    """A follower and the outcomes it recorded itself: those of rounds that did not call refresh()."""
    checks: list[BaseException | None] = []

    def on_check(exc, seconds):
        assert seconds >= 0
        checks.append(exc)

    defaults = {"interval_s": 1.0, "watch": watch, "refresh": lambda: True, "report": lambda: "report",
                "on_check": on_check}
    f = Follower(**{**defaults, **kwargs})
    return f, checks


def test_waits_double_per_failure_up_to_ten_intervals_within_the_jitter():
    assert [next_wait(2.0, n, lambda: 0.5) for n in range(6)] == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert next_wait(2.0, 100, lambda: 0.5) == 2.0 * MAX_BACKOFF_INTERVALS
    assert next_wait(1.0, 0, lambda: 0.0) == pytest.approx(1 - JITTER)
    assert next_wait(1.0, 0, lambda: 1.0) == pytest.approx(1 + JITTER)


@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_non_positive_or_odd_interval_is_refused(interval):
    with pytest.raises(ConfigError, match="follow_interval_s must be a positive number"):
        check_follow_arguments(interval, None, pinned=False)


def test_a_pinned_reader_cannot_follow():
    with pytest.raises(ConfigError, match="manifest_ref reader is pinned"):
        check_follow_arguments(5, None, pinned=True)
    check_follow_arguments(None, None, pinned=True)
    with pytest.raises(ConfigError, match="max_staleness_s"):
        check_follow_arguments(None, 0, pinned=False)


def test_a_round_refreshes_only_when_moved_and_reports_the_swap():
    refreshed: list[str] = []
    watch = FakeWatch([False, True])
    f, checks = follower(watch, on_refresh=refreshed.append)
    f.round()
    f.round()
    # The second round's outcome is refresh()'s to record (the reader's refresh does, with its metrics).
    assert refreshed == ["report"] and checks == [None] and watch.settled == 2


def test_failures_back_off_are_kept_and_a_raising_callback_does_not_stop_anything(caplog):
    boom = StorageError("S3 is away")

    def bad_callback(_arg):
        raise RuntimeError("the user's callback is broken")

    watch = FakeWatch([boom, boom, True])
    f, checks = follower(watch, on_error=bad_callback, on_refresh=bad_callback)
    f.round()
    f.round()
    assert f.failures == 2 and checks == [boom, boom] and watch.settled == 0  # a failed round keeps the old etag
    f.round()
    assert f.failures == 0 and checks == [boom, boom] and watch.settled == 1
    assert sum("raised; the follower goes on" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("boom", [StorageError("download failed"),
                                  UnusableSnapshotError("_CURRENT names run r2, which cannot be served")])
def test_a_refresh_that_raises_is_a_failed_check_tried_again_backed_off(boom):
    def refresh():
        raise boom

    errors: list[BaseException] = []
    watch = FakeWatch([True, True])
    f, checks = follower(watch, refresh=refresh, on_error=errors.append)
    f.round()
    f.round()
    # Not settled: the next round reads the pointer again and refreshes again, each wait longer.
    assert errors == [boom, boom] and checks == [] and f.failures == 2 and watch.settled == 0
    assert next_wait(f.interval_s, f.failures, lambda: 0.5) == 4 * f.interval_s


def test_the_thread_polls_and_stop_joins_without_waiting_out_the_interval():
    polled = threading.Event()

    class Watch(FakeWatch):
        def moved(self):
            polled.set()
            return False

    f, _ = follower(Watch([]), interval_s=0.01)
    f.start()
    assert polled.wait(10) and f.alive
    f.interval_s = 3600.0  # the next wait is an hour: stop() must not wait it out
    polled.clear()
    wait_for(polled.wait, what="one more round")
    f.stop()
    assert not f.alive
