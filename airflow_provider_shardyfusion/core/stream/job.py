"""What ``spark_jobs/streaming_job.py`` gets and gives back (SPEC §14); pure, shared with the operator.

The job's ``--config-b64`` holds ``{"write_config": <WriteConfig>, "stream": <StreamSettings>}``.

The job reports the batches it handled in a small JSON object under the snapshot root, a
``core.stream.report.StreamReport`` in ``runs/_streams/<stream_id>/<report_id>.json``
(``report_key``), rewritten after every micro-batch and once more when the query ended. The
operator reads it back after spark-submit returned. The store is the channel every deploy mode
shares (a cluster-mode driver's output never reaches the worker) and nothing in the job's log can
truncate or interleave it. ``runs/_streams/`` is never a
run record (those are ``runs/run_id=<id>/run.json``), so cleanup and history ignore it.
``stop_key`` is the other direction: the operator's ``on_kill`` puts it, the job stops its query
after the micro-batch in progress.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError
from airflow_provider_shardyfusion.core.layout import STREAM_OWNER_NAME, STREAMS_DIR, validate_run_id
from airflow_provider_shardyfusion.core.model.config import WriteConfig
from airflow_provider_shardyfusion.core.retry import RetryPolicy, call_with_retry
from airflow_provider_shardyfusion.core.secrets import refuse_secret_options, refuse_userinfo
from airflow_provider_shardyfusion.core.stream.batches import MAX_STREAM_ID_CHARS, validate_stream_id
from airflow_provider_shardyfusion.core.stream.report import StreamReport

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_shardyfusion.core.storage import ObjectStore

__all__ = [
    "FILE_FORMATS", "REPORT_READ_POLICY", "TRIGGERS", "StreamSettings", "StreamTrigger", "decode_job_config",
    "encode_job_config", "read_report", "report_key", "sanitize_stream_id", "stop_key", "wait_for_stop",
]

StreamTrigger = Literal["available_now", "processing_time"]
TRIGGERS: tuple[StreamTrigger, ...] = get_args(StreamTrigger)
FILE_FORMATS = ("parquet", "orc", "json", "csv", "avro", "text")
_REPORT_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def sanitize_stream_id(text: str) -> str:
    """``text`` as a valid stream id: other characters become ``_``, cut to the maximum length."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(text)).strip(".") or "stream"
    return cleaned[:MAX_STREAM_ID_CHARS]


@dataclass(frozen=True)
class StreamSettings:
    """The streaming query: source, checkpoint, trigger, and where the job reports."""

    stream_id: str
    checkpoint_location: str
    report_id: str
    source_path: str | None = None
    source_format: str = "parquet"
    source_schema: str | None = None
    source_options: dict[str, str] = field(default_factory=dict)
    trigger: str = "available_now"
    processing_time: str | None = None
    stream_reset: bool = False
    accept_live_run: str | None = None

    def validate(self) -> StreamSettings:
        validate_stream_id(self.stream_id)
        if not isinstance(self.checkpoint_location, str) or not self.checkpoint_location:
            raise ConfigError("checkpoint_location is required: the query's offsets and commits live there")
        if not _REPORT_ID_RE.fullmatch(str(self.report_id)):
            raise ConfigError(f"report_id {self.report_id!r} must be 1-128 characters of [A-Za-z0-9._-]")
        if f"{self.report_id}.json" == STREAM_OWNER_NAME:
            raise ConfigError(f"report_id {self.report_id!r} is the name of the stream's owner object")
        self._validate_ownership()
        if self.trigger not in TRIGGERS:
            raise ConfigError(f"trigger {self.trigger!r} must be one of {list(TRIGGERS)}")
        if self.trigger == "processing_time" and not self.processing_time:
            raise ConfigError("trigger 'processing_time' needs processing_time, e.g. '1 minute'")
        if self.trigger == "available_now" and self.processing_time:
            raise ConfigError("processing_time is for trigger 'processing_time'; 'available_now' takes none")
        if not isinstance(self.source_format, str) or not self.source_format:
            raise ConfigError(f"source_format {self.source_format!r} must be a Spark data source name")
        if self.source_path is None and self.source_format in FILE_FORMATS:
            raise ConfigError(f"source_format {self.source_format!r} is a file source: give source_path")
        # The settings travel on argv and into logs, as a write's input does.
        refuse_userinfo(self.checkpoint_location, "checkpoint_location")
        refuse_userinfo(self.source_path, "source_path")
        refuse_secret_options(self.source_options, "source_options")
        return self

    def _validate_ownership(self) -> None:
        if not isinstance(self.stream_reset, bool):
            raise ConfigError(f"stream_reset {self.stream_reset!r} must be True or False")
        if self.accept_live_run is not None:
            validate_run_id(self.accept_live_run, what="accept_live_run")

    @property
    def is_file_source(self) -> bool:
        return self.source_path is not None

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, d: Any) -> StreamSettings:
        """The settings as the operator wrote them; ``ConfigError`` naming the field that is missing or
        of the wrong type (the job reads what ``to_dict`` wrote: no coercion)."""
        return _CODEC.from_dict(d)


# What earlier operators may leave out takes its default.
_CODEC = ser.Codec(StreamSettings, "stream settings", ConfigError, absent_ok=("source_format", "trigger", "stream_reset"))


def encode_job_config(config: WriteConfig, stream: StreamSettings) -> str:
    """The JSON the streaming job gets (base64 on its command line; no secrets in either part)."""
    return json.dumps({"write_config": config.to_dict(), "stream": stream.to_dict()}, sort_keys=True,
                      separators=(",", ":"))


def decode_job_config(text: str) -> tuple[WriteConfig, StreamSettings]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"streaming job config is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "write_config" not in data or "stream" not in data:
        raise ConfigError("streaming job config must hold 'write_config' and 'stream'")
    return WriteConfig.from_dict(data["write_config"]).validate(), StreamSettings.from_dict(data["stream"]).validate()


def report_key(stream_id: str, report_id: str) -> str:
    return f"{STREAMS_DIR}/{validate_stream_id(stream_id)}/{report_id}.json"


def stop_key(stream_id: str, report_id: str) -> str:
    return f"{STREAMS_DIR}/{validate_stream_id(stream_id)}/{report_id}.stop"


# The report is read once the job ended: a short outage of the store must not turn into "the job
# left no report" (which reads as a failed stream) nor hide the batches it published.
REPORT_READ_POLICY = RetryPolicy(attempts=5, base_delay_s=1.0, max_delay_s=8.0, deadline_s=30.0)


def read_report(store: ObjectStore, stream_id: str, report_id: str, *,
                policy: RetryPolicy = REPORT_READ_POLICY) -> StreamReport | None:
    """The job's report, or None when it wrote none; ``StorageError`` naming it when it cannot be read.

    Storage errors are retried under ``policy``; a report that is not what the job writes is an
    error at once, naming the field (the job writes it whole, so reading again would not help).
    """
    key = report_key(stream_id, report_id)

    def load() -> StreamReport | None:
        if not store.exists(key):
            return None
        return StreamReport.from_bytes(store.get(key).data)

    try:
        return call_with_retry(load, policy=policy, describe=f"reading the streaming job's report {key}")
    except ConfigError as exc:
        raise StorageError(f"the streaming job's report {key} is malformed: {exc}") from None


def wait_for_stop(read: Callable[[], StreamReport | None], running: Callable[[], bool], *, timeout: float,
                  poll: float = 1.0, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether the job reported its query finished and its process ended within ``timeout`` seconds.

    ``read`` gives the report (a ``StorageError`` counts as "not yet": the job may still write it);
    ``running`` tells whether the job's process still runs. ``clock``/``sleep`` let tests drive time.
    """
    deadline = clock() + timeout
    while True:
        try:
            report = read()
        except StorageError:
            report = None
        if report is not None and report.finished and not running():
            return True
        left = deadline - clock()
        if left <= 0:
            return False
        sleep(min(poll, left))
