"""Value schemas for the tests of SPEC §18's schema rules, and factory snapshots that record one."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.model.value_schema import ValueField, ValueSchema, ValueType
from airflow_provider_shardyfusion.core.storage import open_store

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
