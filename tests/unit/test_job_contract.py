"""The typed contracts across the job boundary: the verdict line, a run's stats and its writer."""

from __future__ import annotations

import json

from airflow_provider_shardyfusion.core import serialization
from airflow_provider_shardyfusion.core.model.run_record import RunRecord
from airflow_provider_shardyfusion.core.write.job_contract import (
    RunStats,
    TaskTry,
    WriterIdentity,
    done_line,
    failed_line,
    parse_failure,
)

# A run record as the job wrote it before these types existed (a streaming micro-batch's delta).
RECORD = {
    "run_id": "orders.s-b000000000001-r0", "status": "succeeded", "started_at": "2026-01-02T03:04:05.000000Z",
    "updated_at": "2026-01-02T03:04:10.000000Z", "lease_expires_at": "2026-01-02T03:14:10.000000Z",
    "output_uri": "file:///r", "finished_at": "2026-01-02T03:04:10.000000Z",
    "manifest_ref": "file:///r/manifests/orders.s-b000000000001-r0/manifest.json", "error": None, "num_dbs": 4,
    "config_fingerprint": "f" * 64, "published_at": "2026-01-02T03:04:10.000000Z", "deleted_at": None,
    "deleting_at": None, "publishing_at": None, "manifest_checksum": "c" * 64, "manifest_size": 2048,
    "validation": None, "format_version": 1,
    "stats": {"rows": 120, "bytes": 4096, "num_dbs": 4, "empty_shards": 0, "shards_written": 3, "inserted": 7,
              "base_run_id": "orders.s-b000000000000-r0", "write_mode": "delta", "layer_bytes": 900,
              "durations_s": {"publish": 0.02}, "weird": None},
    "writer": {"provider": "airflow-provider-shardyfusion", "provider_version": "0.1.0", "spark_version": "4.1.1",
               "python_version": "3.11.9", "spark_app_id": "local-1", "spark_ui_url": None, "publish": True,
               "airflow": {"dag_id": "d", "task_id": "t", "run_id": "manual__1", "try_number": 2, "map_index": -1},
               "stream_id": "orders.s", "batch_id": 1},
}


def test_existing_stats_and_writer_read_typed_and_write_back_the_same_bytes():
    stats, writer = RunStats.from_dict(RECORD["stats"]), WriterIdentity.from_dict(RECORD["writer"])
    assert (stats.rows, stats.bytes, stats.base_run_id, stats.write_mode) == (120, 4096, "orders.s-b000000000000-r0",
                                                                             "delta")
    assert stats.inserted == 7 and stats.other == {"layer_bytes": 900, "weird": None}
    assert writer.airflow == TaskTry("d", "t", "manual__1", -1, 2) and (writer.stream_id, writer.batch_id) == ("orders.s", 1)
    assert writer.spark_ui_url is None and writer.publish is True
    assert serialization.dumps(stats.to_dict()) == serialization.dumps(RECORD["stats"])
    assert serialization.dumps(writer.to_dict()) == serialization.dumps(RECORD["writer"])
    # The run record itself still reads and writes the same bytes.
    data = json.dumps(RECORD, sort_keys=True, separators=(",", ":")).encode()
    assert RunRecord.from_bytes(data).to_bytes() == data


def test_values_of_the_wrong_type_are_kept_not_typed():
    stats = RunStats.from_dict({"rows": "many", "bytes": True, "num_dbs": 3})
    assert stats.rows is None and stats.bytes is None and stats.num_dbs == 3
    assert stats.to_dict() == {"rows": "many", "bytes": True, "num_dbs": 3}
    writer = WriterIdentity.from_dict({"airflow": "not a mapping", "batch_id": "7"})
    assert writer.airflow is None and writer.batch_id is None
    assert writer.to_dict()["airflow"] == "not a mapping" and writer.to_dict()["batch_id"] == "7"
    assert RunStats.from_dict(None) == RunStats() and WriterIdentity.from_dict(None).airflow is None


def test_task_tries_compare_by_task_instance_then_try():
    me = TaskTry.from_dict({"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 2})
    earlier = TaskTry("d", "t", "r", -1, 1)
    assert me.same_task_instance(earlier) and not me.same_try(earlier) and me.same_try(TaskTry("d", "t", "r", -1, 2))
    assert not me.same_task_instance(TaskTry("d", "t", "r", 0, 2))


def test_the_verdict_line_is_parsed_by_the_module_that_formats_it():
    tail = "\n".join([
        failed_line("ConfigError", "an older line"),
        "INFO other output",
        "25/01/01 WARN: " + failed_line("InputDataError", "column 'id': duplicate key 2"),
        failed_line("StreamError", "not the batch job's", job="shardyfusion streaming job"),
    ])
    assert parse_failure(tail) == ("InputDataError", "column 'id': duplicate key 2")
    assert parse_failure(done_line("published", "r1", "file:///m.json")) is None
    assert done_line("staged", "r1", "file:///m.json") == "shardyfusion job staged run r1: file:///m.json"


def test_a_writers_airflow_try_keeps_what_it_does_not_type_inside_it():
    data = {"provider": "p", "airflow": {"dag_id": "d", "try_number": "2", "pool": "default"}, "stream_id": None}
    writer = WriterIdentity.from_dict(data)
    assert writer.airflow == TaskTry(dag_id="d", other={"try_number": "2", "pool": "default"})
    assert writer.other == {"stream_id": None}
    expected = dict.fromkeys(("provider_version", "spark_version", "python_version", "spark_app_id", "spark_ui_url",
                              "publish")) | data
    assert writer.to_dict() == expected
