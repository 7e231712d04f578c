"""The arguments of a sharded write, declared once (SPEC §8.1).

Each argument has one entry here: name, annotation, default, whether Airflow templates it, where
it goes (``ShardedWriteOperator``, ``build_write_config`` or both) and its one-line doc. The
operator's signature, ``template_fields``, ``template_fields_renderers`` and its static ``:param:``
docs, and ``build_write_config``'s signature, are built from or checked against this table
(``tests/unit/test_write_args.py`` fails when they drift).

Pure Python: core never imports Airflow, so an Airflow-configured default (``deferrable``) is
declared as its ``airflow.cfg`` option plus the fallback, and the operator reads the option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

# Run time, not TYPE_CHECKING: WriteDefaults is a dataclass, and dataclass annotations are resolved
# at run time in this codebase (core.serialization).
from airflow_provider_shardyfusion.core.model.encoding import KeyEncoding, ValueFormat
from airflow_provider_shardyfusion.core.model.manifest import WriteMode
from airflow_provider_shardyfusion.core.storage.base import StorageOptions

__all__ = [
    "BY_NAME", "CONFIG_ARGS", "DEFAULTS", "INPUT_FORMATS", "OPERATOR_ARGS", "OPERATOR_CONFIG_ARGS", "REQUIRED",
    "TEMPLATE_FIELDS", "TEMPLATE_RENDERERS", "WRITE_ARGS", "InputFormat", "WriteArg", "WriteDefaults",
]

# The Spark data sources ``input_format`` takes (closed: core.model.config refuses others).
InputFormat = Literal["parquet", "orc", "json", "csv", "avro", "delta", "text"]
INPUT_FORMATS: Final[tuple[InputFormat, ...]] = get_args(InputFormat)


class _Required:
    """Marker default of an argument the caller must give."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


@dataclass(frozen=True)
class WriteArg:
    """One argument of the write: its contract in the operator and in ``build_write_config``."""

    name: str
    type: str  # the annotation exactly as the signatures spell it
    default: Any
    doc: str
    templated: bool = True
    operator: bool = True  # an argument of ShardedWriteOperator
    config: bool = True  # an argument of build_write_config (ends up in WriteConfig)
    renderer: str | None = None  # template_fields_renderers entry (Airflow UI)
    airflow_option: tuple[str, str] | None = None  # (section, key) whose value replaces ``default``

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _op(name: str, type_: str, default: Any, doc: str, **kw: Any) -> WriteArg:
    """An argument of the operator only (Spark submission, connections, waiting)."""
    return WriteArg(name, type_, default, doc, config=False, **kw)


def _internal(name: str, type_: str, default: Any, doc: str) -> WriteArg:
    """A ``build_write_config`` argument the operator fills in itself or leaves at its default."""
    return WriteArg(name, type_, default, doc, templated=False, operator=False)


WRITE_ARGS: Final[tuple[WriteArg, ...]] = (
    WriteArg("output_uri", "str", REQUIRED,
             "root of the snapshot, ``s3://bucket/prefix`` or ``file:///abs/dir``."),
    WriteArg("input_path", "str | None", None,
             "input files Spark reads (``input_format``, ``input_options``); or give ``input_table`` or "
             "``input_sql``."),
    WriteArg("input_format", "InputFormat", "parquet",
             "Spark data source of ``input_path``: parquet, orc, json, csv, avro, delta or text."),
    WriteArg("input_options", "Mapping[str, Any] | None", None,
             "reader options of ``input_path`` (never credentials).", renderer="json"),
    WriteArg("input_table", "str | None", None, "a table of the Spark catalog as the input."),
    WriteArg("input_sql", "str | None", None, "a Spark SQL query as the input.", renderer="sql"),
    WriteArg("key_column", "str", "id", "the lookup key column (integer, string or binary)."),
    WriteArg("value_column", "str | None", None,
             "the value column (binary or string) with ``value_format='binary'``."),
    WriteArg("value_columns", "Sequence[str] | None", None,
             "the columns stored as one JSON object per key with ``value_format='json'``."),
    WriteArg("value_format", "ValueFormat | None", None,
             "``binary`` (``value_column``) or ``json`` (``value_columns``); ``None``: ``binary``, and a delta "
             "takes its base's format and columns."),
    WriteArg("num_dbs", "int | None", None, "number of shards (hash sharding, or CEL direct routing)."),
    WriteArg("max_keys_per_shard", "int | None", None,
             "hash sharding sized from the row count instead of ``num_dbs``."),
    WriteArg("cel_expr", "str | None", None, "CEL expression routing each row to a shard (CEL sharding)."),
    WriteArg("cel_columns", "Mapping[str, str] | Sequence[str] | None", None,
             "columns the CEL expression reads (names, or name -> CEL type); default ``[key_column]``.",
             renderer="json"),
    WriteArg("routing_values", "Sequence[Any] | None", None,
             "categorical CEL routing: the expression's values, one shard each, in this order.",
             renderer="json"),
    WriteArg("infer_routing_values", "bool", False,
             "categorical CEL routing with the distinct values found in the input."),
    WriteArg("key_encoding", "KeyEncoding | None", None, "how keys are encoded; ``None`` chooses by the key type (SPEC §5)."),
    WriteArg("run_id", "str | None", None,
             "the run id; ``None`` generates one per try. A fixed id is retried as ``<run_id>-try<N>`` when "
             "an earlier try's run failed, and re-attached to while that run is still running."),
    WriteArg("batch_size", "int", 50_000, "rows per RocksDB write batch."),
    WriteArg("verify_routing", "bool", True, "re-check a sample of keys against the routing rule after writing."),
    WriteArg("sample_size", "int", 20, "keys per shard checked by ``verify_routing``."),
    WriteArg("cache_input", "bool", False, "persist the input in Spark before writing (inputs read twice)."),
    WriteArg("sort_within_partitions", "bool", True, "write each shard's keys in sorted order."),
    WriteArg("max_writes_per_second", "float | None", None, "per-task cap on rows written per second."),
    WriteArg("max_write_bytes_per_second", "float | None", None, "per-task cap on bytes written per second."),
    WriteArg("shard_retry", "int | Mapping[str, Any] | None", None,
             "retries of a single-shard write: max retries, or a mapping with ``max_retries``, "
             "``initial_backoff_s``, ``max_backoff_s``.", renderer="json"),
    WriteArg("allow_duplicate_keys", "bool", False, "keep the last row of a repeated key instead of failing."),
    WriteArg("publish", "bool", True,
             "move ``_CURRENT`` to the run when it succeeds; ``False`` stages it (manifest and a succeeded run "
             "record, no asset event) for ``ValidateManifestOperator`` / ``PublishSnapshotOperator``."),
    WriteArg("write_mode", "WriteMode", "full",
             "``full`` writes the whole table; ``delta`` writes only the changed rows of the input on a base "
             "run (SPEC §13); ``compact`` merges the live chain into one full layer per shard (no input)."),
    WriteArg("delete_column", "str | None", None,
             "with ``write_mode='delta'``: a boolean column, true for rows that delete their key, false for "
             "upserts; a null fails the run."),
    WriteArg("base_run_id", "str | None", None,
             "the run a delta or compaction is written on; ``None``: the run ``_CURRENT`` names when the job starts."),
    WriteArg("max_chain_depth", "int", 16,
             "a delta whose base already has this many delta runs on its last full layer is written compacted."),
    _op("spark_conn_id", "str", "spark_default", "apache-spark connection (master, deploy mode, spark-submit binary)."),
    _op("spark_conf", "Mapping[str, Any] | None", None, "extra ``--conf`` settings of spark-submit.",
        renderer="json"),
    _op("spark_env_vars", "Mapping[str, Any] | None", None,
        "environment of the Spark driver (``env_vars`` of the spark provider).", renderer="json"),
    _op("python_env_archive", "str | None", None,
        "``path#alias`` of a packed Python environment shipped with ``--archives`` and used as the "
        "executors' interpreter on clusters."),
    _op("aws_conn_id", "str | None", "aws_default",
        "AWS connection for ``s3://`` outputs; its credentials reach the driver only as environment "
        "variables of the spark-submit process (never argv, logs, XCom or stored objects)."),
    _op("driver_memory", "str | None", None, "``--driver-memory`` of spark-submit."),
    _op("executor_memory", "str | None", None, "``--executor-memory`` of spark-submit."),
    _op("executor_cores", "int | None", None, "``--executor-cores`` of spark-submit."),
    _op("num_executors", "int | None", None, "``--num-executors`` of spark-submit."),
    _op("total_executor_cores", "int | None", None, "``--total-executor-cores`` of spark-submit."),
    _op("deferrable", "bool", False,
        "in a cluster deploy mode, submit without waiting and wait on the run record in the triggerer; "
        "default ``[operators] default_deferrable``.",
        templated=False, airflow_option=("operators", "default_deferrable")),
    _op("poll_interval", "float", 30.0, "seconds between run-record reads while waiting.", templated=False),
    _op("deferral_timeout", "timedelta | float | None", None,
        "longest wait (seconds or timedelta) on the run record after submitting or re-attaching; "
        "``None``: ``execution_timeout`` if set, else 24 hours.", templated=False),
    _internal("sort_run_rows", "int", 1_000_000, "rows one writer sorts in memory before spilling to Spark's sort."),
    _internal("lease_seconds", "float", 600.0, "lease of the run record; a writer silent this long is lost."),
    _internal("heartbeat_seconds", "float", 60.0, "how often the writer renews its lease."),
    _internal("spark_conf_overrides", "Mapping[str, Any] | None", None,
              "Spark SQL settings the job applies for the write."),
    _internal("storage_options", "StorageOptions | Mapping[str, Any] | None", None,
              "non-secret storage settings (endpoint, region, …)."),
    _internal("airflow_context", "Mapping[str, Any] | None", None,
              "the task instance that runs the write (recorded in the run record)."),
)

BY_NAME: Final[Mapping[str, WriteArg]] = MappingProxyType({a.name: a for a in WRITE_ARGS})
OPERATOR_ARGS: Final[tuple[WriteArg, ...]] = tuple(a for a in WRITE_ARGS if a.operator)
CONFIG_ARGS: Final[tuple[WriteArg, ...]] = tuple(a for a in WRITE_ARGS if a.config)
# What the operator hands to build_write_config from its own (rendered) attributes.
OPERATOR_CONFIG_ARGS: Final[tuple[str, ...]] = tuple(a.name for a in WRITE_ARGS if a.operator and a.config)
TEMPLATE_FIELDS: Final[tuple[str, ...]] = tuple(a.name for a in OPERATOR_ARGS if a.templated)
TEMPLATE_RENDERERS: Final[Mapping[str, str]] = MappingProxyType(
    {a.name: a.renderer for a in OPERATOR_ARGS if a.templated and a.renderer}
)


@dataclass(frozen=True)
class WriteDefaults:
    """The declared defaults, typed: ``DEFAULTS.batch_size`` is an ``int`` to mypy, so signatures and
    dataclasses name the default instead of restating it. One field per optional argument, annotated
    exactly as its ``WriteArg.type`` (``tests/unit/test_write_args.py`` checks both)."""

    input_path: str | None
    input_format: InputFormat
    input_options: Mapping[str, Any] | None
    input_table: str | None
    input_sql: str | None
    key_column: str
    value_column: str | None
    value_columns: Sequence[str] | None
    value_format: ValueFormat | None
    num_dbs: int | None
    max_keys_per_shard: int | None
    cel_expr: str | None
    cel_columns: Mapping[str, str] | Sequence[str] | None
    routing_values: Sequence[Any] | None
    infer_routing_values: bool
    key_encoding: KeyEncoding | None
    run_id: str | None
    batch_size: int
    verify_routing: bool
    sample_size: int
    cache_input: bool
    sort_within_partitions: bool
    max_writes_per_second: float | None
    max_write_bytes_per_second: float | None
    shard_retry: int | Mapping[str, Any] | None
    allow_duplicate_keys: bool
    publish: bool
    write_mode: WriteMode
    delete_column: str | None
    base_run_id: str | None
    max_chain_depth: int
    spark_conn_id: str
    spark_conf: Mapping[str, Any] | None
    spark_env_vars: Mapping[str, Any] | None
    python_env_archive: str | None
    aws_conn_id: str | None
    driver_memory: str | None
    executor_memory: str | None
    executor_cores: int | None
    num_executors: int | None
    total_executor_cores: int | None
    deferrable: bool
    poll_interval: float
    deferral_timeout: timedelta | float | None
    sort_run_rows: int
    lease_seconds: float
    heartbeat_seconds: float
    spark_conf_overrides: Mapping[str, Any] | None
    storage_options: StorageOptions | Mapping[str, Any] | None
    airflow_context: Mapping[str, Any] | None


DEFAULTS: Final[WriteDefaults] = WriteDefaults(**{a.name: a.default for a in WRITE_ARGS if not a.required})
