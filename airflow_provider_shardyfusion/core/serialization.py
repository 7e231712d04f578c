"""Shared JSON (de)serialization rules for persisted objects: compact, sorted, versioned."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from . import layout
from .errors import ShardyfusionError, show_value

T = TypeVar("T")


def dumps(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def loads_object(data: bytes | str, what: str, error: type[ShardyfusionError], supported: int) -> dict[str, Any]:
    """Parse a persisted JSON object and check its ``format_version``."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise error(f"{what} must be a JSON object, got {type(obj).__name__}")
    version = obj.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise error(f"{what} has no integer format_version")
    if version > supported:
        raise error(
            f"{what} has format_version {version}, newer than this provider supports ({supported}); "
            "upgrade airflow-provider-shardyfusion to read it"
        )
    if version < 1:
        raise error(f"{what} has invalid format_version {version}")
    return obj


def parse_object(parse: Callable[[dict[str, Any]], T], obj: Any, what: str, error: type[ShardyfusionError]) -> T:
    """``parse(obj)`` for a persisted object; a shape the field checks missed still gives one ``error``."""
    if not isinstance(obj, dict):
        raise error(f"{what} must be a JSON object, got {type(obj).__name__}")
    try:
        return parse(obj)
    except ShardyfusionError:
        raise
    except Exception as exc:
        run = f" of run {show_value(obj['run_id'])}" if "run_id" in obj else ""
        raise error(f"{what}{run} is malformed: {type(exc).__name__}: {exc}") from None


def require(obj: Mapping[str, Any], name: str, types: type | tuple[type, ...], what: str,
            error: type[ShardyfusionError], *, optional: bool = False) -> Any:
    value = obj.get(name)
    if value is None and optional:
        return None
    if value is None or not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise error(f"{what}: field {name!r} is missing or not {_names(types)} (got {value!r})")
    return value


def ts_field(obj: Mapping[str, Any], name: str, what: str, error: type[ShardyfusionError],
             *, optional: bool = False) -> datetime | None:
    value = require(obj, name, str, what, error, optional=optional)
    if value is None:
        return None
    try:
        return layout.parse_ts(value)
    except ValueError:
        raise error(f"{what}: field {name!r} is not a UTC timestamp like 2026-01-31T12:00:00.000000Z (got {value!r})") from None


def ts_str(dt: datetime | None) -> str | None:
    return layout.format_ts(dt) if dt is not None else None


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))
