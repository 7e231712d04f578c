"""Value schemas for the tests of SPEC §18's schema rules, and factory snapshots that record one."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.value_schema import ValueField, ValueSchema, ValueType
from airflow_provider_shardyfusion.core.storage import open_store
from tests.snapshot_factory import build_snapshot

if TYPE_CHECKING:
    from tests.snapshot_factory import BuiltSnapshot


def leaf_schema(columns: dict[str, str], not_null: tuple[str, ...] = ()) -> ValueSchema:
    """Columns of leaf types by name (``{"name": "string", "score": "int64"}``), in that order."""
    return ValueSchema(tuple(ValueField(name, ValueType(kind), name not in not_null)  # type: ignore[arg-type]
                             for name, kind in columns.items()))


def with_value_schema(built: BuiltSnapshot, schema: ValueSchema, storage_options: dict[str, Any] | None) -> BuiltSnapshot:
    """``built`` as a writer recording ``schema`` writes it: the manifest put again in its place. The
    factory's run records and ``_CURRENT`` carry no manifest checksum, so nothing else changes."""
    manifest = dataclasses.replace(built.manifest, value_schema=schema).validate()
    open_store(built.root, storage_options).put(built.manifest_key, manifest.to_bytes())
    return dataclasses.replace(built, manifest=manifest)


def build_schema_root(root: str, storage_options: dict[str, Any] | None) -> dict[str, BuiltSnapshot]:
    """Three runs, each an hour after the other: ``old`` (no value schema, as written before SPEC §18),
    ``v1`` (name string not null, score int64) and ``v2`` (score now string, city added), live."""
    t0 = layout.utc_now() - timedelta(hours=3)
    schemas = {"old": None, "v1": leaf_schema({"name": "string", "score": "int64"}, not_null=("name",)),
               "v2": leaf_schema({"name": "string", "score": "string", "city": "string"}, not_null=("name",))}
    runs = {}
    for i, (name, schema) in enumerate(schemas.items()):
        rows = [(k, {"name": f"{name}-{k}", "score": k}) for k in range(6)]
        built = build_snapshot(root, rows, num_dbs=2, storage_options=storage_options, value_format="json",
                               run_id=f"2026020{i + 1}T000000Z-{name:0>8}", published_at=t0 + timedelta(hours=i))
        runs[name] = with_value_schema(built, schema, storage_options) if schema is not None else built
    return runs
