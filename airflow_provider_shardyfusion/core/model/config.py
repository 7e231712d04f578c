"""The write configuration (SPEC §3–§6): frozen dataclasses, validation, JSON and fingerprint.

``build_write_config(**kwargs)`` takes the flat arguments of ``ShardedWriteOperator`` and is the
one place that checks everything that can be checked before Spark starts; its messages name the
argument at fault. The Spark job receives ``WriteConfig.to_json()`` inline (never secrets), written
and read by the codec of ``core.serialization``: a field of the wrong type is refused naming it and
its path, a misspelt write option, delta or storage option is refused, other unknown keys are
ignored. Numbers that may be given as integers are typed ``int | float`` so that they are read
back as written: ``fingerprint`` hashes these bytes, and run records compare it across versions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.arguments import as_bool, as_int, as_list, as_literal, as_mapping, as_number
from airflow_provider_shardyfusion.core.errors import ConfigError, show_value, text_number_hint
from airflow_provider_shardyfusion.core.model import encoding, routing
from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding
from airflow_provider_shardyfusion.core.model.manifest import WRITE_MODES, WriteMode
from airflow_provider_shardyfusion.core.model.write_args import DEFAULTS as _D
from airflow_provider_shardyfusion.core.model.write_args import INPUT_FORMATS, InputFormat
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.secrets import refuse_embedded_uris, refuse_secret_options, refuse_userinfo
from airflow_provider_shardyfusion.core.storage.base import StorageOptions

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.model.encoding import ValueFormat

__all__ = [
    "CONFIG_FORMAT_VERSION", "MAX_LEASE_SECONDS", "DeltaSpec", "InputSpec", "ShardRetry", "ShardingSpec", "ValueSpec",
    "WriteConfig", "WriteOptions", "build_write_config",
]

CONFIG_FORMAT_VERSION = 1
# A run that stops renewing holds its run id until the lease runs out; a week is already generous.
MAX_LEASE_SECONDS = 7 * 24 * 3600


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} {value!r} must be an integer > 0{text_number_hint(value)}")


def _positive_number(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{name} {value!r} must be a finite number > 0{text_number_hint(value)}")


def _str_map(name: str, value: Any) -> dict[str, str]:
    """A mapping of string keys (or its rendering as text), its values as text."""
    return {k: str(v) for k, v in (as_mapping(name, value) or {}).items()}


@dataclass(frozen=True)
class InputSpec:
    """Exactly one of ``path`` (with ``format``/``options``), ``table`` or ``sql``."""

    path: str | None = None
    format: str = "parquet"
    options: dict[str, str] = field(default_factory=dict)
    table: str | None = None
    sql: str | None = None

    def validate(self) -> None:
        given = [n for n, v in (("input_path", self.path), ("input_table", self.table), ("input_sql", self.sql)) if v]
        if len(given) != 1:
            raise ConfigError(
                "give exactly one of input_path, input_table or input_sql"
                + (f" (got {', '.join(given)})" if given else " (got none)")
            )
        if self.path is not None and self.format not in INPUT_FORMATS:
            raise ConfigError(f"input_format {self.format!r} is not supported; choose one of {list(INPUT_FORMATS)}")
        refuse_userinfo(self.path, "input_path")
        refuse_embedded_uris(self.sql, "input_sql")
        for name, v in (("input_path", self.path), ("input_table", self.table), ("input_sql", self.sql)):
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"{name} {v!r} must be a string")
        refuse_secret_options(self.options, "input_options")


@dataclass(frozen=True)
class ValueSpec:
    """``binary``: one column (binary or string); ``json``: named columns → JSON object.

    ``format=None`` only in a delta: the base's format, and the base's columns where none are given.
    """

    format: str | None = "binary"
    column: str | None = None
    columns: tuple[str, ...] | None = None

    def validate(self) -> None:
        if self.format is None:
            if self.column is not None and (not isinstance(self.column, str) or not self.column):
                raise ConfigError(f"value_column {show_value(self.column)} must be a column name")
            if self.columns:
                self._check_columns(self.columns)
            if self.column and self.columns:
                raise ConfigError("give value_column or value_columns, not both")
            return
        encoding.validate_value_format(self.format)
        if self.format == "binary":
            if not self.column or not isinstance(self.column, str):
                raise ConfigError("value_format 'binary' needs value_column (one binary or string column)")
            if self.columns:
                raise ConfigError("value_columns is for value_format 'json'; with 'binary' use value_column")
        else:
            if self.column and self.columns:
                raise ConfigError("give value_column or value_columns, not both")
            self._check_columns(self.value_columns())

    @staticmethod
    def _check_columns(cols: Sequence[str]) -> None:
        if not cols or not all(isinstance(c, str) and c for c in cols):
            raise ConfigError("value_format 'json' needs value_columns (a non-empty list of column names)")
        if len(set(cols)) != len(cols):
            raise ConfigError(f"value_columns {list(cols)} repeats a column")

    def for_mode(self, write_mode: WriteMode) -> ValueSpec:
        """Unset in a full write is ``binary``; a chain keeps it unset for its base's (``on_base``)."""
        return replace(self, format="binary") if self.format is None and write_mode == "full" else self

    def on_base(self, base_format: str, base_columns: Sequence[str]) -> tuple[ValueSpec, list[str]]:
        """The value a chain writes on a base: what is unset is the base's; what is given must agree.

        Returns the resolved spec and the conflicts, each naming both values. A binary value's
        column may be named differently (only its bytes are stored); JSON columns are the stored
        object's member names, so they must include the base's (SPEC §18: additions only).
        """
        conflicts = []
        if self.format is not None and self.format != base_format:
            conflicts.append(f"value_format {self.format!r} vs the base's {base_format!r}")
        given = self.value_columns()
        if base_format == "json":
            # Added columns are checked against the input's schema (value_schema.check_on_base).
            if given and not set(base_columns) <= set(given):
                conflicts.append(f"value_columns {list(given)} vs the base's {list(base_columns)} (a delta may add "
                                 "nullable columns, never drop one)")
            return ValueSpec(format="json", columns=tuple(given or base_columns)), conflicts
        if len(given) > 1:
            conflicts.append(f"value_columns {list(given)} vs the base's binary value_column "
                             f"{base_columns[0] if base_columns else None!r}")
        column = given[0] if given else (base_columns[0] if base_columns else None)
        if column is None:
            conflicts.append(f"no value_column given, and the base records none (value_format {base_format!r})")
        return ValueSpec(format=base_format, column=column), conflicts

    def value_columns(self) -> tuple[str, ...]:
        if self.columns:
            return tuple(self.columns)
        return (self.column,) if self.column else ()


@dataclass(frozen=True)
class ShardingSpec:
    """``hash`` (num_dbs or max_keys_per_shard) or ``cel`` (direct / categorical / inferred)."""

    strategy: routing.Strategy = "hash"
    num_dbs: int | None = None
    max_keys_per_shard: int | None = None
    cel_expr: str | None = None
    cel_columns: dict[str, str | None] | None = None
    routing_values: tuple[Any, ...] | None = None
    infer_routing_values: bool = False

    @property
    def cel_mode(self) -> routing.CelMode | None:
        if self.strategy != "cel":
            return None
        return "categorical" if (self.routing_values is not None or self.infer_routing_values) else "direct"

    def validate(self, key_column: str) -> None:  # noqa: C901 - one check per sharding field, each with its own message
        if self.strategy == "hash":
            if self.cel_columns or self.routing_values is not None or self.infer_routing_values:
                raise ConfigError("cel_columns, routing_values and infer_routing_values need cel_expr")
            if (self.num_dbs is None) == (self.max_keys_per_shard is None):
                raise ConfigError("give exactly one of num_dbs or max_keys_per_shard for hash sharding")
            if self.num_dbs is not None:
                routing.validate_num_dbs(self.num_dbs)
            _positive_int("max_keys_per_shard", self.max_keys_per_shard, allow_none=True)
            return
        if self.strategy != "cel":
            raise ConfigError(f"sharding strategy {self.strategy!r} must be 'hash' or 'cel'")
        if self.max_keys_per_shard is not None:
            raise ConfigError("max_keys_per_shard applies to hash sharding only, not with cel_expr")
        columns = routing.normalize_cel_columns(self.cel_columns if self.cel_columns is not None else [key_column])
        routing.compile_cel(self.cel_expr or "", columns)
        if self.routing_values is not None and self.infer_routing_values:
            raise ConfigError("give routing_values or infer_routing_values=True, not both")
        if not isinstance(self.infer_routing_values, bool):
            raise ConfigError(f"infer_routing_values {show_value(self.infer_routing_values)} must be True or False")
        if self.routing_values is not None:
            values = routing.validate_routing_values(list(self.routing_values))
            routing.validate_num_dbs(len(values), what="the number of routing_values")
            if self.num_dbs is not None and self.num_dbs != len(values):
                raise ConfigError(
                    f"num_dbs {self.num_dbs} disagrees with routing_values ({len(values)} values); "
                    "leave num_dbs unset for categorical routing"
                )
        elif self.infer_routing_values:
            if self.num_dbs is not None:
                raise ConfigError("num_dbs is inferred with infer_routing_values=True; leave it unset")
        elif self.num_dbs is None:
            raise ConfigError("CEL direct routing needs num_dbs (the expression returns an id in [0, num_dbs))")
        else:
            routing.validate_num_dbs(self.num_dbs)

    @property
    def unset(self) -> bool:
        """Nothing given: a delta or compaction takes the base's sharding."""
        return (self.strategy == "hash" and self.num_dbs is None and self.max_keys_per_shard is None
                and self.cel_expr is None)

    def resolved_cel_columns(self, key_column: str) -> dict[str, str | None]:
        return routing.normalize_cel_columns(self.cel_columns if self.cel_columns is not None else [key_column])


@dataclass(frozen=True)
class ShardRetry:
    """Retry policy of the single-db path: whole write retried into a fresh ``attempt=NN``."""

    max_retries: int = 2
    initial_backoff_s: int | float = 1.0
    max_backoff_s: int | float = 30.0

    def validate(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"shard_retry.max_retries {self.max_retries!r} must be an integer >= 0")
        _positive_number("shard_retry.initial_backoff_s", self.initial_backoff_s)
        _positive_number("shard_retry.max_backoff_s", self.max_backoff_s)
        if self.initial_backoff_s > self.max_backoff_s:
            raise ConfigError(
                f"shard_retry.initial_backoff_s {self.initial_backoff_s} must not exceed "
                f"shard_retry.max_backoff_s {self.max_backoff_s}"
            )

    def policy(self) -> RetryPolicy:
        """The schedule for ``core.retry``: ``max_retries`` retries after 1x, 2x, 4x ... the initial backoff."""
        return RetryPolicy(attempts=self.max_retries + 1, base_delay_s=self.initial_backoff_s,
                           max_delay_s=self.max_backoff_s, deadline_s=None, jitter=False)

    @classmethod
    def from_value(cls, value: Any) -> ShardRetry | None:
        """The ``shard_retry`` argument: None, a number of retries, or a mapping of these fields."""
        if value is None or isinstance(value, ShardRetry):
            return value
        if isinstance(value, bool):
            raise ConfigError(f"shard_retry {value!r} must be an integer (max retries) or a mapping")
        if isinstance(value, int):
            return cls(max_retries=value)
        if isinstance(value, Mapping):
            return _SHARD_RETRY_CODEC.from_dict(dict(value))
        raise ConfigError(f"shard_retry {value!r} must be an integer (max retries) or a mapping")


@dataclass(frozen=True)
class WriteOptions:
    """How the job writes (the declared defaults of ``core.model.write_args``)."""

    batch_size: int = _D.batch_size
    verify_routing: bool = _D.verify_routing
    sample_size: int = _D.sample_size
    cache_input: bool = _D.cache_input
    sort_within_partitions: bool = _D.sort_within_partitions
    max_writes_per_second: int | float | None = _D.max_writes_per_second
    max_write_bytes_per_second: int | float | None = _D.max_write_bytes_per_second
    shard_retry: ShardRetry | None = None
    sort_run_rows: int = _D.sort_run_rows
    allow_duplicate_keys: bool = _D.allow_duplicate_keys
    lease_seconds: int | float = _D.lease_seconds
    heartbeat_seconds: int | float = _D.heartbeat_seconds
    # False stages the run (SPEC §8): manifest and a succeeded run record, _CURRENT untouched.
    publish: bool = _D.publish

    def validate(self) -> None:
        _positive_int("batch_size", self.batch_size)
        _positive_int("sample_size", self.sample_size)
        _positive_int("sort_run_rows", self.sort_run_rows)
        _positive_number("max_writes_per_second", self.max_writes_per_second, allow_none=True)
        _positive_number("max_write_bytes_per_second", self.max_write_bytes_per_second, allow_none=True)
        _positive_number("lease_seconds", self.lease_seconds)
        _positive_number("heartbeat_seconds", self.heartbeat_seconds)
        if self.lease_seconds > MAX_LEASE_SECONDS:
            raise ConfigError(f"lease_seconds {self.lease_seconds} must be at most {MAX_LEASE_SECONDS} (7 days)")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigError(
                f"heartbeat_seconds {self.heartbeat_seconds} must be shorter than lease_seconds {self.lease_seconds}"
            )
        for name in ("verify_routing", "cache_input", "sort_within_partitions", "allow_duplicate_keys", "publish"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} {getattr(self, name)!r} must be True or False")
        if self.shard_retry is not None:
            self.shard_retry.validate()


@dataclass(frozen=True)
class DeltaSpec:
    """How a write relates to the live snapshot (SPEC §13): a full table, a change on a base, or a compaction."""

    write_mode: WriteMode = _D.write_mode
    delete_column: str | None = _D.delete_column
    base_run_id: str | None = _D.base_run_id
    max_chain_depth: int = _D.max_chain_depth

    @property
    def chained(self) -> bool:
        return self.write_mode != "full"

    def validate(self) -> None:
        if self.write_mode not in WRITE_MODES:
            raise ConfigError(f"write_mode {show_value(self.write_mode)} must be one of {list(WRITE_MODES)}")
        _positive_int("max_chain_depth", self.max_chain_depth)
        if self.delete_column is not None and (not isinstance(self.delete_column, str) or not self.delete_column):
            raise ConfigError(f"delete_column {show_value(self.delete_column)} must be a column name")
        if self.delete_column is not None and self.write_mode != "delta":
            raise ConfigError(f"delete_column applies to write_mode 'delta', not {self.write_mode!r}")
        if self.base_run_id is not None:
            if self.write_mode == "full":
                raise ConfigError("base_run_id applies to write_mode 'delta' or 'compact', not 'full'")
            layout.validate_run_id(self.base_run_id, what="base_run_id")


@dataclass(frozen=True)
class WriteConfig:
    """The validated configuration of one write, passed to the Spark job inline (never secrets)."""

    run_id: str
    output_uri: str
    input: InputSpec
    key_column: str
    value: ValueSpec
    sharding: ShardingSpec
    key_encoding: KeyEncoding | None = None
    options: WriteOptions = field(default_factory=WriteOptions)
    spark_conf_overrides: dict[str, str] = field(default_factory=dict)
    storage_options: StorageOptions = field(default_factory=StorageOptions)
    airflow_context: dict[str, Any] | None = None
    delta: DeltaSpec = field(default_factory=DeltaSpec)
    format_version: int = CONFIG_FORMAT_VERSION

    def validate(self) -> WriteConfig:
        layout.validate_run_id(self.run_id)
        if layout.normalize_root(self.output_uri) != self.output_uri:
            raise ConfigError(f"output_uri {self.output_uri!r} is not in canonical form; build configs with build_write_config")
        self.delta.validate()
        if self.delta.write_mode == "compact":
            given = [n for n, v in (("input_path", self.input.path), ("input_table", self.input.table),
                                    ("input_sql", self.input.sql)) if v]
            if given:
                raise ConfigError(f"write_mode 'compact' reads no input, but {', '.join(given)} is given")
        else:
            self.input.validate()
        if not isinstance(self.key_column, str) or not self.key_column:
            raise ConfigError(f"key_column {self.key_column!r} must be a non-empty column name")
        if self.delta.write_mode != "compact":
            self.value.validate()
        if self.value.format is None and not self.delta.chained:
            raise ConfigError("value_format is needed for write_mode 'full' (only a chain takes its base's)")
        if self.key_encoding is not None:
            encoding.validate_key_encoding(self.key_encoding)
        # A chain inherits its sharding from the base manifest; what is given is checked against it then.
        if not (self.delta.chained and self.sharding.unset):
            self.sharding.validate(self.key_column)
        self.options.validate()
        self.storage_options.validate()
        if self.format_version != CONFIG_FORMAT_VERSION:
            raise ConfigError(f"config format_version {self.format_version} is not supported (expected {CONFIG_FORMAT_VERSION})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dict(ser.to_plain(self))

    @classmethod
    def from_dict(cls, d: Any) -> WriteConfig:
        """The config as ``to_dict`` wrote it; ``ConfigError`` naming the field at fault (not validated: ``validate``)."""
        return _CODEC.from_dict(d)

    def to_json(self) -> str:
        return ser.dumps(self.to_dict()).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> WriteConfig:
        return _CODEC.from_bytes(text)

    def _decoded(self) -> WriteConfig:
        # Empty is written as null, as build_write_config makes it; so a config reads back to its bytes.
        if self.airflow_context == {} or self.value.columns == ():
            return replace(self, airflow_context=self.airflow_context or None,
                           value=replace(self.value, columns=self.value.columns or None))
        return self

    def fingerprint(self) -> str:
        """Stable over runs of the same write: excludes run_id and Airflow context."""
        data = self.to_dict()
        data.pop("run_id")
        data.pop("airflow_context")
        return "sha256:" + hashlib.sha256(ser.dumps(data)).hexdigest()

    def with_run_id(self, run_id: str) -> WriteConfig:
        return replace(self, run_id=run_id)


# A config travels from the operator to the job of the same release: every field with a default may
# be absent (publish was added later), and a misspelt option is refused rather than ignored.
_REFUSE_UNKNOWN = (WriteOptions, DeltaSpec, StorageOptions, ShardRetry)
_CODEC = ser.Codec(WriteConfig, "write config", ConfigError, supported=CONFIG_FORMAT_VERSION, finish=WriteConfig._decoded,
                   absent_ok=True, refuse_unknown=_REFUSE_UNKNOWN)
_SHARD_RETRY_CODEC = ser.Codec(ShardRetry, "shard_retry", ConfigError, absent_ok=True, refuse_unknown=(ShardRetry,))


def build_write_config(
    *,
    output_uri: str,
    input_path: str | None = _D.input_path,
    input_format: InputFormat = _D.input_format,
    input_options: Mapping[str, Any] | None = _D.input_options,
    input_table: str | None = _D.input_table,
    input_sql: str | None = _D.input_sql,
    key_column: str = _D.key_column,
    value_column: str | None = _D.value_column,
    value_columns: Sequence[str] | None = _D.value_columns,
    value_format: ValueFormat | None = _D.value_format,
    num_dbs: int | None = _D.num_dbs,
    max_keys_per_shard: int | None = _D.max_keys_per_shard,
    cel_expr: str | None = _D.cel_expr,
    cel_columns: Mapping[str, str] | Sequence[str] | None = _D.cel_columns,
    routing_values: Sequence[Any] | None = _D.routing_values,
    infer_routing_values: bool = _D.infer_routing_values,
    key_encoding: KeyEncoding | None = _D.key_encoding,
    run_id: str | None = _D.run_id,
    batch_size: int = _D.batch_size,
    verify_routing: bool = _D.verify_routing,
    sample_size: int = _D.sample_size,
    cache_input: bool = _D.cache_input,
    sort_within_partitions: bool = _D.sort_within_partitions,
    max_writes_per_second: float | None = _D.max_writes_per_second,
    max_write_bytes_per_second: float | None = _D.max_write_bytes_per_second,
    shard_retry: int | Mapping[str, Any] | None = _D.shard_retry,
    allow_duplicate_keys: bool = _D.allow_duplicate_keys,
    publish: bool = _D.publish,
    write_mode: WriteMode = _D.write_mode,
    delete_column: str | None = _D.delete_column,
    base_run_id: str | None = _D.base_run_id,
    max_chain_depth: int = _D.max_chain_depth,
    sort_run_rows: int = _D.sort_run_rows,
    lease_seconds: float = _D.lease_seconds,
    heartbeat_seconds: float = _D.heartbeat_seconds,
    spark_conf_overrides: Mapping[str, Any] | None = _D.spark_conf_overrides,
    storage_options: StorageOptions | Mapping[str, Any] | None = _D.storage_options,
    airflow_context: Mapping[str, Any] | None = _D.airflow_context,
) -> WriteConfig:
    """Flat operator-style arguments → validated ``WriteConfig`` (generates a run id if none).

    The arguments, their defaults and docs are declared once in ``core.model.write_args.WRITE_ARGS``.
    """
    rendered = _read_rendered_text(locals())
    if rendered:
        # Text that is the rendering of the expected type (core.arguments) is read as its value.
        return build_write_config(**{**_write_call_args(locals()), **rendered})
    if isinstance(storage_options, StorageOptions):
        storage = storage_options
    else:
        storage = StorageOptions.from_dict(dict(storage_options or {}))
    if cel_expr is None and (cel_columns is not None or routing_values is not None or infer_routing_values):
        raise ConfigError("cel_columns, routing_values and infer_routing_values need cel_expr")
    if value_columns is not None and not isinstance(value_columns, (list, tuple)):
        raise ConfigError(f"value_columns {value_columns!r} must be a list of column names")
    if routing_values is not None and not isinstance(routing_values, (list, tuple)):
        raise ConfigError(f"routing_values {routing_values!r} must be a list")
    if isinstance(cel_columns, str):  # iterating it would declare one column per character
        raise ConfigError(
            f"cel_columns {show_value(cel_columns)} is a single string; pass a list of column names "
            "(e.g. [\"region\"]) or a mapping column -> CEL type"
        )
    if cel_columns is not None and not isinstance(cel_columns, (Mapping, list, tuple)):
        raise ConfigError(f"cel_columns {show_value(cel_columns)} must be a list of column names or a mapping column -> CEL type")
    config = WriteConfig(
        run_id=run_id if run_id is not None else layout.new_run_id(),
        output_uri=layout.normalize_root(output_uri),
        input=InputSpec(path=input_path, format=input_format, options=_str_map("input_options", input_options),
                        table=input_table, sql=input_sql),
        key_column=key_column,
        key_encoding=key_encoding,
        value=ValueSpec(format=value_format, column=value_column,
                        columns=tuple(value_columns) if value_columns else None).for_mode(write_mode),
        sharding=ShardingSpec(
            strategy="cel" if cel_expr is not None else "hash", num_dbs=num_dbs,
            max_keys_per_shard=max_keys_per_shard, cel_expr=cel_expr,
            cel_columns=dict(cel_columns) if isinstance(cel_columns, Mapping) else (
                {c: None for c in cel_columns} if cel_columns is not None else None),
            routing_values=tuple(routing_values) if routing_values is not None else None,
            infer_routing_values=infer_routing_values,
        ),
        options=WriteOptions(
            batch_size=batch_size, verify_routing=verify_routing, sample_size=sample_size,
            cache_input=cache_input, sort_within_partitions=sort_within_partitions,
            max_writes_per_second=max_writes_per_second, max_write_bytes_per_second=max_write_bytes_per_second,
            shard_retry=ShardRetry.from_value(shard_retry), sort_run_rows=sort_run_rows,
            allow_duplicate_keys=allow_duplicate_keys, lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds, publish=publish,
        ),
        spark_conf_overrides=_str_map("spark_conf_overrides", spark_conf_overrides),
        storage_options=storage,
        airflow_context=dict(airflow_context) if airflow_context else None,
        delta=DeltaSpec(write_mode=write_mode, delete_column=delete_column, base_run_id=base_run_id,
                        max_chain_depth=max_chain_depth),
    )
    return config.validate()


_TEXT_BOOLS = ("infer_routing_values", "verify_routing", "cache_input", "sort_within_partitions",
               "allow_duplicate_keys", "publish")
_TEXT_INTS = ("num_dbs", "max_keys_per_shard", "batch_size", "sample_size", "sort_run_rows", "max_chain_depth")
_TEXT_NUMBERS = ("max_writes_per_second", "max_write_bytes_per_second", "lease_seconds", "heartbeat_seconds")
_TEXT_LISTS = ("value_columns", "routing_values")
# Arguments that take one of several shapes; their text is read as the literal it renders.
_TEXT_LITERALS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("shard_retry", (int, dict), "an integer (max retries) or a mapping"),
    ("cel_columns", (list, tuple, dict), "a list of column names or a mapping of name to CEL type"),
)


def _write_call_args(scope: Mapping[str, Any]) -> dict[str, Any]:
    import inspect

    return {name: scope[name] for name in inspect.signature(build_write_config).parameters}


def _read_rendered_text(scope: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments given as text, read by the ``core.arguments`` rules (refused with the hint if unreadable)."""
    readers = ([(n, as_bool) for n in _TEXT_BOOLS] + [(n, as_int) for n in _TEXT_INTS]
               + [(n, as_number) for n in _TEXT_NUMBERS] + [(n, as_list) for n in _TEXT_LISTS])
    read_text = {name: read(name, scope[name]) for name, read in readers if isinstance(scope[name], str)}
    for name, types, expected in _TEXT_LITERALS:
        if isinstance(scope[name], str):
            read_text[name] = as_literal(name, scope[name], types, expected)
    return read_text
