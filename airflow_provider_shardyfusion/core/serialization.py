"""Shared JSON (de)serialization rules for persisted objects: compact, sorted, versioned."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
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


# ---- dataclass <-> JSON, derived from the fields ------------------------------------------------
#
# Persisted objects declare their fields once, with types; these two functions turn them into
# plain JSON values and back, checking every field against its declared type, so each model's
# codec is its field list rather than a page of hand-written checks.


def to_plain(obj: Any) -> Any:
    """A dataclass (nested dataclasses, tuples, dicts, datetimes) as JSON-ready values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, datetime):
        return layout.format_ts(obj)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(cls: type[T], obj: Mapping[str, Any], what: str, error: type[ShardyfusionError]) -> T:
    """Build dataclass ``cls`` from ``obj``, checking each field against its type hint.

    Absent (or null) is fine for an optional field (older writers) and gives the empty default of
    a collection field; a field with a scalar default (``format_version``, ``hash_algorithm``) must
    be there. Unknown keys are ignored, so minor additions stay readable by older readers.
    """
    if not isinstance(obj, Mapping):
        raise error(f"{what} must be a JSON object, got {type(obj).__name__}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints[f.name]
        value = obj.get(f.name)
        if value is None:
            if _allows_none(hint):
                values[f.name] = None
                continue
            if f.default_factory is not dataclasses.MISSING:
                continue
            raise error(f"{what}: field {f.name!r} is missing or not {_hint_name(hint)} (got None)")
        values[f.name] = _coerce(value, hint, what, f.name, f.metadata.get("entry", f.name), error)
    return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _allows_none(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _hint_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_hint_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin is tuple:
        return "list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "dict"
    if hint is datetime:
        return "timestamp"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint: Any, what: str, name: str, entry: str, error: type[ShardyfusionError]) -> Any:  # noqa: C901 - one branch per supported field type; the dispatch reads best in one place
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    wrong = f"{what}: field {name!r} is missing or not {_hint_name(hint)} (got {show_value(value)})"
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return _coerce(value, option, what, name, entry, error)
            except error:
                continue
        return _coerce(value, options[-1], what, name, entry, error)
    if hint is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise error(f"{what}: {name} {show_value(value)} is not one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise error(wrong)
        item = args[0] if args else Any
        return tuple(_entry(v, item, what, entry, error) for v in value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise error(wrong)
        return dict(value) if len(args) < 2 or args[1] is Any else {
            k: _coerce(v, args[1], what, f"{name}[{k!r}]", entry, error) for k, v in value.items()}
    if hint is datetime:
        return ts_field({name: value}, name, what, error)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise error(wrong)
        nested = getattr(hint, "from_dict", None)
        return nested(value) if nested is not None else from_plain(hint, value, what, error)  # type: ignore[arg-type]
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(wrong)
        return float(value)
    if isinstance(hint, type):
        if not isinstance(value, hint) or (isinstance(value, bool) and hint is not bool):
            raise error(wrong)
        return value
    raise error(f"{what}: field {name!r} has an unsupported type {hint!r}")  # a model bug; the model tests catch it


def _entry(value: Any, hint: Any, what: str, entry: str, error: type[ShardyfusionError]) -> Any:
    """One element of a list field, with an error that names the entry."""
    if hint is str and not isinstance(value, str):
        raise error(f"{what}: {entry} entry {show_value(value)} is not a string")
    if dataclasses.is_dataclass(hint) and not isinstance(value, dict):
        raise error(f"{what}: {entry} entry {show_value(value)} is not an object")
    return _coerce(value, hint, what, entry, entry, error)
