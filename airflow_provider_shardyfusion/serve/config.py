"""What ``shardyfusion serve`` was asked for: one ``ServeConfig``, carried to every worker as JSON.

uvicorn starts its worker processes afresh (``--workers N``), so the options travel in the
environment variable ``SERVE_CONFIG_ENV`` and each worker builds its own app from them. They cross
that boundary through the project's one codec (``core.serialization``), as every other object
does: a key the worker does not know, or a value not of its field's type, is one ``ConfigError``
naming the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.encoding import KEY_TEXTS, KeyText
from airflow_provider_shardyfusion.core.read.value_decoding import ValueDecoding, validate_value_decoding

__all__ = ["DEFAULT_MAX_STALENESS_S", "SERVE_CONFIG_ENV", "ServeConfig", "parse_shard_ids"]

SERVE_CONFIG_ENV = "SHARDYFUSION_SERVE_CONFIG"
# Sixty checks at the default interval: a storage outage of a few minutes keeps the fleet in
# rotation (answering from its cache); a longer one takes it out, saying why.
DEFAULT_MAX_STALENESS_S = 300.0


@dataclass(frozen=True)
class ServeConfig:
    """The reader a worker opens and how it answers: the ``serve`` command's options.

    ``storage_options`` holds only what may be persisted (``StorageOptions.to_dict()``): the
    environment of the workers is no place for a credential (boto3's chain finds its own).
    """

    root: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    follow_interval_s: float | None = 5.0
    shard_ids: tuple[int, ...] | None = None
    value_decoding: ValueDecoding = "json"
    # /readyz: 503 once the reader has not confirmed it is current for this long (serve.readiness).
    max_staleness_s: float | None = DEFAULT_MAX_STALENESS_S
    cache_dir: str | None = None
    key_type: KeyText = "auto"
    # Not an option: the folder ``run_server`` makes for the workers' metrics (serve.worker_metrics).
    metrics_dir: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> ServeConfig:
        validate_value_decoding(self.value_decoding)
        if self.key_type not in KEY_TEXTS:
            raise ConfigError(f"--key-type {self.key_type!r} is not supported; choose one of {list(KEY_TEXTS)}")
        for name in ("follow_interval_s", "max_staleness_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value!r}")
        return self

    def to_json(self) -> str:
        return ser.dumps(ser.to_plain(self)).decode("utf-8")

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        """The config ``to_json`` wrote; an unknown key or a value of the wrong type is a ``ConfigError`` naming it."""
        return _CODEC.from_bytes(text)

    @classmethod
    def from_environment(cls) -> ServeConfig:
        text = os.environ.get(SERVE_CONFIG_ENV)
        if not text:
            raise ConfigError(f"{SERVE_CONFIG_ENV} is not set: start the server with 'shardyfusion serve ROOT'")
        return cls.from_json(text)


_CODEC = ser.Codec(ServeConfig, f"serve config ({SERVE_CONFIG_ENV})", ConfigError, absent_ok=True,
                   refuse_unknown=(ServeConfig,))


def parse_shard_ids(text: str) -> tuple[int, ...]:
    """``"0-15,20"`` → ``(0, 1, …, 15, 20)``: comma-separated ids and inclusive ranges."""
    ids: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        first, sep, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            raise ConfigError(f"--shard-ids {text!r}: {part!r} is not a shard id or a range like 0-15") from None
        if low < 0 or high < low:
            raise ConfigError(f"--shard-ids {text!r}: {part!r} is not a range of non-negative ids (low-high)")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))
