"""The streaming job's report as the operator reads it (core/stream/job.py, core/stream/report.py): typed,
through outages, malformed ones named by field, stop waits."""

from __future__ import annotations

import json

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.stream.job import StreamSettings, read_report, report_key, wait_for_stop
from airflow_provider_shardyfusion.core.stream.report import BatchOutcome, StreamReport, parse_result_line

FAST = RetryPolicy(attempts=4, base_delay_s=0.0, max_delay_s=0.0, deadline_s=None)
REPORT = StreamReport("s1", True, None, (BatchOutcome(0, "written", "s1-b000000000000", "written (full)", rows=3),
                                         BatchOutcome(1, "skipped", "s1-b000000000001", "already live")))
# As the job writes it: every field of every batch, rows null when not counted.
REPORT_JSON = {"stream_id": "s1", "finished": True, "error": None, "batches": [
    {"batch_id": 0, "action": "written", "run_id": "s1-b000000000000", "reason": "written (full)", "rows": 3},
    {"batch_id": 1, "action": "skipped", "run_id": "s1-b000000000001", "reason": "already live", "rows": None}]}


class FlakyStore:
    """A real local store whose first ``failures`` reads raise, as during a short outage."""

    def __init__(self, store, failures: int):
        self.store, self.failures, self.calls = store, failures, 0

    def exists(self, key):
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise StorageError(f"GET {key}: connection reset")
        return self.store.exists(key)

    def get(self, key):
        return self.store.get(key)


def test_report_is_read_through_a_short_outage_and_an_absent_one_is_none(tmp_path):
    store = open_store(f"file://{tmp_path}/snap")
    assert read_report(store, "s1", "r1", policy=FAST) is None
    store.put(report_key("s1", "r1"), json.dumps(REPORT_JSON).encode())
    flaky = FlakyStore(store, failures=3)
    assert read_report(flaky, "s1", "r1", policy=FAST) == REPORT
    assert flaky.calls == 4


def test_the_report_crosses_the_job_boundary_typed_and_unchanged():
    assert json.loads(REPORT.to_bytes()) == REPORT_JSON
    assert StreamReport.from_bytes(REPORT.to_bytes()) == REPORT
    assert REPORT.batches[0].summary() == {"batch_id": 0, "run_id": "s1-b000000000000",
                                           "action": "written", "rows": 3}
    assert [b.live for b in REPORT.batches] == [True, False]
    # The job's stderr line, parsed by the module that formats it.
    assert parse_result_line("noise\n" + REPORT.result_line() + "\nbye") == REPORT
    assert parse_result_line("noise") is None


@pytest.mark.parametrize(("batch", "said"), [
    ({"rows": "3"}, r"field 'rows' is missing or not int \(got '3'\) at \$\.batches\[1\]\.rows"),
    ({"action": "lost"}, r"action 'lost' is not one of \['skipped', 'written', 'published'\] at \$\.batches\[1\]\.action"),
    ({"run_id": None}, r"field 'run_id' is missing or not str \(got None\) at \$\.batches\[1\]\.run_id"),
    ("not a batch", r"batches entry 'not a batch' is not an object at \$\.batches\[1\]"),
])
def test_a_malformed_batch_entry_is_one_error_naming_the_field(tmp_path, batch, said):
    store = open_store(f"file://{tmp_path}/snap")
    entry = {**REPORT_JSON["batches"][1], **batch} if isinstance(batch, dict) else batch
    store.put(report_key("s1", "r1"), json.dumps({**REPORT_JSON, "batches": [REPORT_JSON["batches"][0], entry]}).encode())
    with pytest.raises(StorageError, match=rf"report runs/_streams/s1/r1.json is malformed: stream report: {said}"):
        read_report(store, "s1", "r1", policy=FAST)


def test_report_unreadable_for_longer_than_the_retries_or_malformed_is_a_storage_error(tmp_path):
    store = open_store(f"file://{tmp_path}/snap")
    key = report_key("s1", "r1")
    store.put(key, b'{"finished": true}')
    flaky = FlakyStore(store, failures=10)
    with pytest.raises(StorageError, match="connection reset"):
        read_report(flaky, "s1", "r1", policy=FAST)
    assert flaky.calls == FAST.attempts
    store.put(key, b"[1, 2]")
    once = FlakyStore(store, failures=0)
    with pytest.raises(StorageError, match=rf"report {key} is malformed: stream report must be a JSON object, got list"):
        read_report(once, "s1", "r1", policy=FAST)
    assert once.calls == 1  # a whole-written object does not heal: no retry


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_wait_for_stop_needs_the_finished_report_and_the_process_gone():
    clock = Clock()
    running_report, finished = StreamReport("s1", False), StreamReport("s1", True)
    reads = iter([StorageError("outage"), None, running_report, finished, finished])

    def read():
        item = next(reads)
        if isinstance(item, Exception):
            raise item
        return item

    running = iter([True, False])
    assert wait_for_stop(read, lambda: next(running), timeout=10, poll=1.0, clock=clock, sleep=clock.sleep)
    assert clock.slept == [1.0, 1.0, 1.0, 1.0]


def test_wait_for_stop_gives_up_at_the_timeout():
    clock = Clock()
    assert not wait_for_stop(lambda: StreamReport("s1", False), lambda: True, timeout=2.5, poll=1.0, clock=clock,
                             sleep=clock.sleep)
    assert clock.slept == [1.0, 1.0, 0.5] and clock.now == 2.5


def test_stream_settings_cross_the_job_boundary_unchanged_and_bad_fields_are_named():
    """The operator's settings reach the job as they were sent; a wrong one names its field."""
    stream = StreamSettings(stream_id="s1", checkpoint_location="/cp", report_id="r1", source_path="/in",
                            source_options={"maxFilesPerTrigger": "2"}, trigger="processing_time",
                            processing_time="1 minute", stream_reset=True, accept_live_run="run-1").validate()
    sent = json.loads(json.dumps(stream.to_dict()))
    assert sorted(sent) == ["accept_live_run", "checkpoint_location", "processing_time", "report_id", "source_format",
                            "source_options", "source_path", "source_schema", "stream_id", "stream_reset", "trigger"]
    assert StreamSettings.from_dict(sent) == stream
    oldest = {"stream_id": "s1", "checkpoint_location": "/cp", "report_id": "r1", "source_path": "/in"}
    assert StreamSettings.from_dict(oldest) == StreamSettings("s1", "/cp", "r1", source_path="/in")
    with pytest.raises(ConfigError, match=r"stream settings: field 'checkpoint_location' is missing"):
        StreamSettings.from_dict({k: v for k, v in sent.items() if k != "checkpoint_location"})
    with pytest.raises(ConfigError, match=r"stream settings: field 'stream_reset' is missing or not bool \(got 'yes'\)"):
        StreamSettings.from_dict({**sent, "stream_reset": "yes"})
    with pytest.raises(ConfigError, match=r"source_options"):
        StreamSettings.from_dict({**sent, "source_options": {"maxFilesPerTrigger": 2}})
    with pytest.raises(ConfigError, match=r"stream settings must be a JSON object, got list"):
        StreamSettings.from_dict([])
