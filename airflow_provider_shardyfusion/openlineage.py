"""OpenLineage for the shardyfusion operators (issue 13): what a write read and wrote, what a
publish made live, what a cleanup deleted.

The operators' ``get_openlineage_facets_on_complete`` methods are thin: they hand what their
``execute`` kept (the XCom summary, the publish result, the cleanup report) to the functions here,
which build the Airflow OpenLineage provider's ``OperatorLineage`` from the ``openlineage.client``
types. This module is imported only by those methods, never at DAG-parse time, and the provider is
optional: without ``apache-airflow-providers-openlineage`` every builder returns ``None``.

Dataset naming follows the OpenLineage naming spec (as the provider's own asset converters do):

- a storage location ``s3://bucket/key`` (or ``s3a://`` / ``s3n://``, which Spark uses for the same
  objects) → namespace ``s3://bucket``, name ``key`` (``/`` for the bucket itself); ``gs://`` alike;
- ``file:///abs/dir`` or a bare absolute path → namespace ``file``, name ``/abs/dir``;
  ``file://host/dir`` → ``file://host``; other schemes (``hdfs://nn:8020/x``) → ``scheme://authority``;
- a table → namespace ``hive://host:port`` when ``spark_conf`` names a Hive metastore, else
  ``spark_catalog`` (the Spark session's own catalog, whose location the operator cannot know);
  name ``database.table`` (``default.`` added to an unqualified name, as Spark resolves it).

The snapshot itself (the output root) is one dataset; every run written to it is a version of it
(``version`` facet = run id). A run's data lives under ``shards/run_id=<id>/`` and is named that way
only when a cleanup drops it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model import encoding

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_shardyfusion.core.model.manifest import Manifest

__all__ = [
    "PUBLISH_FACET", "PUBLISH_FACET_SCHEMA_URL", "TABLE_FALLBACK_NAMESPACE", "SnapshotSchema", "cleanup_lineage",
    "location_dataset", "publish_lineage", "run_data_dataset", "snapshot_dataset", "table_dataset", "write_lineage",
]

# Custom facet key: OpenLineage asks custom facets to carry a producer-specific prefix.
PUBLISH_FACET = "shardyfusion_publish"
# Where the custom facet's fields are described (README "OpenLineage"); the project's placeholder
# home until it is published under its final name (pyproject [project.urls]).
PUBLISH_FACET_SCHEMA_URL = "https://github.com/shardyfusion/airflow-provider-shardyfusion#openlineage"
TABLE_FALLBACK_NAMESPACE = "spark_catalog"
_METASTORE_KEYS = ("spark.hadoop.hive.metastore.uris", "spark.hive.metastore.uris", "hive.metastore.uris")
_GLOB_CHARS = frozenset("*?[{")


# ---- naming (no OpenLineage import needed) ----------------------------------------------------


def location_dataset(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a storage location (file, S3, GCS, HDFS, …); see the module doc.

    A glob in the path (``/data/day=*/``) names the folder Spark lists, not a pattern: lineage
    tools match datasets by name, and the OpenLineage Spark integration reports the folder too.
    """
    text = uri.strip()
    if text.startswith("/"):
        return "file", _clean_path(text)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    # Never user info (credentials) in a namespace, whatever the caller let through.
    host = parts.netloc.rpartition("@")[2]
    if not scheme:  # a relative path: resolved by Spark against its default file system
        return "file", _clean_path(text)
    if scheme in ("s3", "s3a", "s3n", "gs"):
        key = _clean_path(parts.path).lstrip("/")
        return f"{'gs' if scheme == 'gs' else 's3'}://{host}", key or "/"
    if scheme == "file":
        return (f"file://{host}" if host else "file"), _clean_path(parts.path or "/")
    return f"{scheme}://{host}", _clean_path(parts.path or "/")


def table_dataset(table: str, spark_conf: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """``(namespace, name)`` of a table read by Spark; see the module doc."""
    parts = [p.strip("`") for p in table.strip().split(".")]
    name = ".".join(["default", *parts] if len(parts) == 1 else parts)
    metastore = _metastore_authority(spark_conf)
    if metastore and len(parts) <= 2:  # a three-part name is another catalog's, not the metastore's
        return f"hive://{metastore}", name
    return TABLE_FALLBACK_NAMESPACE, name


def snapshot_dataset(output_uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of the snapshot under ``output_uri`` (normalized as the writer does)."""
    return location_dataset(layout.normalize_root(output_uri))


def run_data_dataset(output_uri: str, run_id: str) -> tuple[str, str]:
    """``(namespace, name)`` of one run's data: its shard folder under the snapshot root."""
    return location_dataset(layout.join(layout.normalize_root(output_uri), layout.shards_prefix(run_id)))


def _clean_path(path: str) -> str:
    segments = path.split("/")
    for n, seg in enumerate(segments):
        if _GLOB_CHARS & set(seg):
            segments = segments[:n]
            break
    cleaned = "/".join(segments).rstrip("/")
    return cleaned or ("/" if path.startswith("/") else cleaned)


def _metastore_authority(spark_conf: Mapping[str, Any] | None) -> str | None:
    if not isinstance(spark_conf, Mapping):
        return None
    for key in _METASTORE_KEYS:
        value = spark_conf.get(key)
        if isinstance(value, str) and value.strip():
            first = urlsplit(value.split(",")[0].strip())
            if first.hostname:
                return f"{first.hostname}:{first.port or 9083}"
    return None


# ---- the snapshot's schema ---------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotSchema:
    """What a snapshot stores per row: the lookup key and the value's columns.

    ``key_encoding`` is ``None`` when it was left to the key column's type and the manifest could
    not be read: the key's type is then unknown and reported as such.
    """

    key_column: str
    key_encoding: str | None
    value_format: str
    value_columns: tuple[str, ...]

    @classmethod
    def of_manifest(cls, manifest: Manifest) -> SnapshotSchema:
        return cls(key_column=manifest.sharding.key_column, key_encoding=manifest.key_encoding,
                   value_format=manifest.value_format, value_columns=tuple(manifest.value_columns))

    @classmethod
    def of_arguments(cls, key_column: str, key_encoding: str | None, value_format: str | None,
                     value_column: str | None, value_columns: Sequence[str] | None) -> SnapshotSchema:
        """From the operator's (rendered) arguments, when the manifest is not at hand (an unset
        ``value_format`` read by the columns given: a delta's base is not at hand either)."""
        cols = tuple(value_columns) if value_columns else ((value_column,) if value_column else ())
        fmt = value_format or ("json" if value_columns else "binary")
        return cls(key_column=key_column, key_encoding=key_encoding, value_format=fmt, value_columns=cols)

    def fields(self) -> list[tuple[str, str | None, str]]:
        """``(name, type, description)`` per field; types are the key's kind and the value's form."""
        kind = encoding.key_kind_of_encoding(self.key_encoding) if self.key_encoding in encoding.KEY_ENCODINGS else None
        stored = f", stored as {self.key_encoding} bytes" if self.key_encoding else ""
        out: list[tuple[str, str | None, str]] = [(self.key_column, kind, f"lookup key{stored}")]
        if self.value_format == "binary":
            out += [(c, "binary", "the value, stored as its bytes (value_format=binary)") for c in self.value_columns]
        else:
            out += [(c, None, f"member of the JSON value object (value_format={self.value_format})")
                    for c in self.value_columns]
        return out


# ---- OperatorLineage builders ----------------------------------------------------------------


def write_lineage(
    summary: Mapping[str, Any] | None,
    *,
    input_path: str | None = None,
    input_table: str | None = None,
    input_sql: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    schema: SnapshotSchema | None = None,
) -> OperatorLineage | None:
    """Lineage of a ``ShardedWriteOperator`` try: the input (path or table) → the snapshot.

    ``summary`` is the operator's XCom summary; without one (the write failed) nothing was
    written, so there are no datasets. An ``input_sql`` query has no input dataset here (its
    tables are the query's business); the query goes into the ``sql`` job facet instead.
    The snapshot carries its schema, the run id as its version and, as output statistics, the
    rows and bytes the run wrote (a staged run, ``publish=False``, wrote them too).
    """
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset, OutputDataset
        from openlineage.client.facet_v2 import dataset_version_dataset, output_statistics_output_dataset, sql_job
    except ImportError:
        return None
    if not summary:
        return OperatorLineage()
    inputs = []
    if input_path:
        inputs.append(Dataset(*location_dataset(input_path)))
    elif input_table:
        inputs.append(Dataset(*table_dataset(input_table, spark_conf)))
    version = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(summary["run_id"]))
    facets: dict[str, Any] = {"version": version}
    if schema is not None:
        facets["schema"] = _schema_facet(schema)
    stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
        rowCount=_int_or_none(summary.get("rows")), size=_int_or_none(summary.get("bytes")))
    output = OutputDataset(*snapshot_dataset(str(summary["output_uri"])), facets=facets,
                           outputFacets={"outputStatistics": stats})
    job_facets = {"sql": sql_job.SQLJobFacet(query=input_sql)} if input_sql and not (input_path or input_table) else {}
    return OperatorLineage(inputs=inputs, outputs=[output], job_facets=job_facets)


def publish_lineage(result: Mapping[str, Any] | None, output_uri: str) -> OperatorLineage | None:
    """Lineage of a ``PublishSnapshotOperator`` try: the snapshot, now serving another run.

    ``result`` is the operator's XCom (``PublishResult.to_dict()``). The output dataset is the
    snapshot with the live run as its ``version`` and the ``shardyfusion_publish`` facet naming
    the live run, the run it replaced, the manifest and whether it was a rollback. When the
    pointer moved, ``lifecycleStateChange`` says how: ``CREATE`` when nothing was live before
    (readers see the snapshot for the first time), else ``OVERWRITE`` (every reader's content is
    replaced at once: the closest standard value for an atomic pointer swap, rollbacks included).
    A no-op publish (the run was already live) changed nothing and carries no lifecycle change.
    """
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import OutputDataset
        from openlineage.client.facet_v2 import dataset_version_dataset
        from openlineage.client.facet_v2 import lifecycle_state_change_dataset as lsc
    except ImportError:
        return None
    if not result:
        return OperatorLineage()
    pointer = result.get("pointer") or {}
    run_id = str(pointer.get("run_id"))
    previous = result.get("previous_run_id")
    facets: dict[str, Any] = {
        "version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=run_id),
        PUBLISH_FACET: _publish_facet_class()(
            liveRunId=run_id, previousRunId=previous, manifestRef=pointer.get("manifest_ref"),
            rollback=bool(result.get("rollback")), moved=bool(result.get("moved")),
        ),
    }
    if result.get("moved"):
        change = lsc.LifecycleStateChange.OVERWRITE if previous else lsc.LifecycleStateChange.CREATE
        facets["lifecycleStateChange"] = lsc.LifecycleStateChangeDatasetFacet(lifecycleStateChange=change)
    return OperatorLineage(outputs=[OutputDataset(*snapshot_dataset(output_uri), facets=facets)])


def cleanup_lineage(report: Mapping[str, Any] | None) -> OperatorLineage | None:
    """Lineage of a ``DeferredCleanupOperator`` try: the runs whose data it deleted, as dropped.

    ``report`` is the operator's XCom (``CleanupReport.to_dict()``). Each run whose data is gone
    as a whole is one output dataset (its shard folder, see ``run_data_dataset``) with
    ``lifecycleStateChange: DROP``: the data and the manifest are deleted and no reader can open
    that run again. ``TRUNCATE`` would promise that the dataset lives on, empty, which is not
    so; the snapshot itself is never dropped (its live run is never touched). The datasets are
    outputs, as the OpenLineage Spark integration reports ``DROP TABLE``: the deletion is what
    this job did to them.

    A run counts as dropped when its record got ``deleted_at`` (all its data went), or, for a
    shard folder without a run record, when the cleanup ran to the end without an error under
    that folder. Losing attempts of kept runs, partly kept runs, dry runs and runs left alone by
    an abandoned cleanup are not reported: nothing a reader sees changed.
    """
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import OutputDataset
        from openlineage.client.facet_v2 import lifecycle_state_change_dataset as lsc
    except ImportError:
        return None
    if not report or report.get("dry_run"):
        return OperatorLineage()
    plan = report.get("plan") or {}
    root = plan.get("output_uri")
    if not root:
        return OperatorLineage()
    dropped: list[str] = list(report.get("marked_deleted") or [])
    if not report.get("abandoned"):
        failed_targets = [str(e.get("target", "")) for e in report.get("errors") or []]
        for item in plan.get("items") or []:
            run_id = item.get("run_id")
            if item.get("category") != "orphans" or run_id in dropped:
                continue
            folder = layout.shards_prefix(run_id)
            if not any(t.startswith(folder) or t == run_id for t in failed_targets):
                dropped.append(run_id)
    drop = lsc.LifecycleStateChangeDatasetFacet(lifecycleStateChange=lsc.LifecycleStateChange.DROP)
    return OperatorLineage(outputs=[
        OutputDataset(*run_data_dataset(root, run_id), facets={"lifecycleStateChange": drop}) for run_id in dropped
    ])


def _schema_facet(schema: SnapshotSchema) -> Any:
    from openlineage.client.facet_v2 import schema_dataset

    return schema_dataset.SchemaDatasetFacet(fields=[
        schema_dataset.SchemaDatasetFacetFields(name=name, type=kind, description=desc, ordinal_position=n)
        for n, (name, kind, desc) in enumerate(schema.fields(), start=1)
    ])


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@functools.cache
def _publish_facet_class() -> type:
    """The custom ``shardyfusion_publish`` dataset facet (built on first use: openlineage is optional)."""
    import attr
    from openlineage.client.generated.base import DatasetFacet

    @attr.define
    class ShardyfusionPublishDatasetFacet(DatasetFacet):
        """Which run a snapshot serves after a publish, and which it replaced."""

        liveRunId: str  # OpenLineage facets use camelCase field names
        previousRunId: str | None = attr.field(default=None)
        manifestRef: str | None = attr.field(default=None)
        rollback: bool = attr.field(default=False)
        moved: bool = attr.field(default=True)

        @staticmethod
        def _get_schema() -> str:
            return PUBLISH_FACET_SCHEMA_URL

    ShardyfusionPublishDatasetFacet.__module__ = __name__
    ShardyfusionPublishDatasetFacet.__qualname__ = "ShardyfusionPublishDatasetFacet"
    return ShardyfusionPublishDatasetFacet
