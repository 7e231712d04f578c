"""The one JSON codec of what crosses a boundary: persisted objects, the job's config and results.

Writing is ``to_plain`` + ``dumps``: sorted keys and our own UTC timestamp format, byte for byte
what every earlier release wrote. Reading is msgspec's: it decodes JSON bytes straight into the
frozen dataclasses, checking each field against its type hint in one pass (strictly: no bool for
an int, no string for a number; absent fields take their defaults; unknown keys are ignored, so
minor additions stay readable by older readers). ``Codec`` adds what msgspec does not know
(``format_version``, UTC-only timestamps, each model's own checks) and restates its errors in our
terms: the object, the field, the offending value and its path (``$.shards[3].row_count``).

Two other answers to an unknown key, per model: ``Codec(refuse_unknown=...)`` refuses one (a
config, where a misspelt option must not pass silently), and a field declared ``kept_keys()``
keeps every key the model does not know, with any known key whose value is not of its type, and
writes them back as found (a run's ``stats`` and ``writer``, read across provider versions).
A field declared ``secret_field()`` is read but never written.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ShardyfusionError, show_value

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["TS_EXAMPLE", "Codec", "dumps", "kept_keys", "secret_field", "to_plain", "ts_field"]

T = TypeVar("T")

TS_EXAMPLE = "2026-01-31T12:00:00.000000Z"
_ABSENT = object()
_JSON_TYPES = {"array": "list", "object": "dict", "null": "NoneType"}
_AT = re.compile(r"(?P<msg>.*?)(?: - at `(?P<path>[^`]*)`)?", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`")
_GOT = re.compile(r"got `(?P<type>[^`]+)`")
_STEP = re.compile(r"\.(?P<name>[^.\[]+)|\[(?P<index>\d+)\]|\[\.\.\.\]")


def dumps(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


_SCALARS = (str, int, float, type(None))


def kept_keys() -> Any:
    """The field of a model that keeps, as found, every key the model does not type (see the module doc)."""
    return dataclasses.field(default_factory=dict, metadata={"kept": True})


def secret_field() -> Any:
    """A field read like any other but never written by ``to_plain`` (nor shown by ``repr``): a credential."""
    return dataclasses.field(default=None, repr=False, metadata={"secret": True})


_PLAIN_FIELDS: dict[type, tuple[tuple[tuple[str, bool], ...], str | None] | None] = {}


def _plain_fields(cls: type) -> tuple[tuple[tuple[str, bool], ...], str | None] | None:
    """A dataclass's written fields, each with whether it is omitted when None, and its kept-keys field; None for other types."""
    try:
        return _PLAIN_FIELDS[cls]
    except KeyError:
        found = None
        if dataclasses.is_dataclass(cls):
            fields = dataclasses.fields(cls)
            found = (tuple((f.name, bool(f.metadata.get("omit_none"))) for f in fields
                           if not f.metadata.get("secret") and not f.metadata.get("kept")),
                     _kept_name(cls))
        _PLAIN_FIELDS[cls] = found
        return found


def _kept_name(cls: type) -> str | None:
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get("kept")), None)


def to_plain(obj: Any) -> Any:
    """A dataclass (nested dataclasses, tuples, dicts, datetimes) as JSON-ready values."""
    # Field lists are looked up once per class: a manifest of 1000s of shards is ~30 objects a
    # shard, and asking dataclasses for each one's fields was most of the time encoding it took.
    if isinstance(obj, _SCALARS):
        return obj
    found = _plain_fields(type(obj))
    if found is not None:
        fields, kept = found
        # A field added later with metadata omit_none is written only when set: objects without it
        # keep the bytes every earlier release wrote (and their checksums).
        out = {name: to_plain(value) for name, omit_none in fields
               if (value := getattr(obj, name)) is not None or not omit_none}
        if kept is not None:
            # A kept key was not of its field's type, so the field is None: written as found instead.
            for key, value in getattr(obj, kept).items():
                if out.get(key) is None:
                    out[key] = to_plain(value)
        return out
    if isinstance(obj, datetime):
        return layout.format_ts(obj)
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _not_utc(name: str, value: Any) -> str:
    return f"field {name!r} is not a UTC timestamp like {TS_EXAMPLE} (got {show_value(value)})"


def ts_field(value: str, name: str, what: str, error: type[ShardyfusionError]) -> datetime:
    """``value`` in our exact timestamp format (for timestamps kept in free-form dicts such as stats)."""
    try:
        return layout.parse_ts(value)
    except ValueError:
        raise error(f"{what}: {_not_utc(name, value)}") from None


class _Head(msgspec.Struct):
    format_version: Any = None


_HEAD = msgspec.json.Decoder(_Head)  # skips every other field: a small fraction of the full decode


class Codec(Generic[T]):
    """How one persisted model is read: JSON bytes or a plain dict to the typed, checked model.

    ``supported``: the newest ``format_version`` this provider reads (None for a part of an object,
    which has none); ``finish``: the model's own checks, run on the decoded value; ``absent_ok``:
    the fields with a value default that older writers left out (True: any field with a default,
    at any depth, ``format_version`` too: an object whose writer declares the defaults);
    ``refuse_unknown``: ``cls`` or models it holds whose objects may carry no key they do not
    declare. Build it after ``cls`` is defined (module level, below the class): it resolves the
    type hints once.
    """

    def __init__(self, cls: type[T], what: str, error: type[ShardyfusionError], *, supported: int | None = None,
                 finish: Callable[[T], T] | None = None, absent_ok: tuple[str, ...] | bool = (),
                 refuse_unknown: tuple[type, ...] = ()) -> None:
        self.cls, self.what, self.error, self.supported, self.finish = cls, what, error, supported, finish
        self._version_optional = absent_ok is True or "format_version" in (absent_ok or ())
        self._decoder = msgspec.json.Decoder(cls)
        # msgspec fills an absent field from its default; ours must be there when the default is a
        # value (hash_algorithm, a layer's counts): a second, skimming pass over the same bytes
        # checks they are, and that a model of refuse_unknown has no other key.
        rules = _Rules(absent_ok, refuse_unknown)
        self._present_json = msgspec.json.Decoder(_presence(cls, msgspec.Raw, rules))
        self._present_any = _presence(cls, Any, rules)
        self._times = tuple(name for name, hint in _hints(cls).items() if _optional(hint)[0] is datetime)
        self._kept = _kept_name(cls) is not None

    def from_bytes(self, data: bytes | str) -> T:
        if self._kept:
            try:
                return self.from_dict(json.loads(data))
            except ValueError as exc:
                raise self.error(f"{self.what} is not valid JSON: {exc}") from None
        try:
            head = self._present_json.decode(data)
        except msgspec.ValidationError as exc:
            self._check_version(self._head(data))  # a newer version first: its fields may have changed
            raise self._restate(exc, lambda: json.loads(data)) from None
        except msgspec.DecodeError as exc:
            raise self.error(f"{self.what} is not valid JSON: {exc}") from None
        self._check_version(getattr(head, "format_version", None))
        try:
            value = self._decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise self._restate(exc, lambda: json.loads(data)) from None
        return self._finish(value)

    def _head(self, data: bytes | str) -> Any:
        try:
            return _HEAD.decode(data).format_version
        except msgspec.ValidationError as exc:  # valid JSON, but not an object
            got = _GOT.search(str(exc))
            kind = got["type"] if got else "?"
            raise self.error(f"{self.what} must be a JSON object, got {_JSON_TYPES.get(kind, kind)}") from None

    def from_dict(self, obj: Any) -> T:
        if not isinstance(obj, dict):
            raise self.error(f"{self.what} must be a JSON object, got {type(obj).__name__}")
        if self._kept:
            return self._finish(_keep(self.cls, obj))
        self._check_version(obj.get("format_version"))
        try:
            msgspec.convert(obj, self._present_any)
            value = msgspec.convert(obj, self.cls)
        except msgspec.ValidationError as exc:
            raise self._restate(exc, lambda: obj) from None
        return self._finish(value)

    def _check_version(self, version: Any) -> None:
        if self.supported is None or (version is None and self._version_optional):
            return
        if not isinstance(version, int) or isinstance(version, bool):
            raise self.error(f"{self.what} has no integer format_version")
        if version > self.supported:
            raise self.error(
                f"{self.what} has format_version {version}, newer than this provider supports ({self.supported}); "
                "upgrade airflow-provider-shardyfusion to read it"
            )
        if version < 1:
            raise self.error(f"{self.what} has invalid format_version {version}")

    def _finish(self, value: T) -> T:
        for name in self._times:
            # msgspec takes any RFC 3339 time; a naive or shifted one would compare wrongly with ours.
            stamp = getattr(value, name)
            if stamp is not None and stamp.utcoffset() != timedelta(0):
                raise self.error(f"{self.what}: {_not_utc(name, stamp.isoformat())} at $.{name}")
        if self.finish is None:
            return value
        try:
            return self.finish(value)
        except ShardyfusionError:
            raise
        except Exception as exc:  # a shape the checks missed still gives one error of the object's kind
            run_id = getattr(value, "run_id", None)
            run = f" of run {show_value(run_id)}" if run_id is not None else ""
            raise self.error(f"{self.what}{run} is malformed: {type(exc).__name__}: {exc}") from None

    def _restate(self, exc: msgspec.ValidationError, source: Callable[[], Any]) -> ShardyfusionError:
        """msgspec's error as ours, with the offending value read back from the document (errors only)."""
        match = _AT.fullmatch(str(exc))
        assert match is not None  # the pattern matches any text
        msg, path = match["msg"], match["path"] or "$"
        missing = _MISSING.fullmatch(msg)
        if missing:
            path = f"{path}.{missing['name']}"
        steps = [_step(m) for m in _STEP.finditer(path)]
        try:
            doc = source()
        except ValueError:
            doc = _ABSENT
        if _UNKNOWN.fullmatch(msg):
            return self.error(f"{self.what}: {_unknown_keys(self.cls, steps, _value_at(doc, steps), msg, path)}")
        place = _field_at(self.cls, steps)
        if place is None:
            return self.error(f"{self.what}: {msg} at {path}")
        hint, name, entry = place
        return self.error(f"{self.what}: {_describe(hint, name, entry, _value_at(doc, steps))} at {path}")


class _Rules(typing.NamedTuple):
    """What the skimming pass checks: which absent fields are fine, which models refuse unknown keys."""

    absent_ok: tuple[str, ...] | bool
    refuse: tuple[type, ...]

    def nested(self) -> _Rules:
        return self if self.absent_ok is True else self._replace(absent_ok=())


def _presence(cls: type, leaf: Any, rules: _Rules, *, top: bool = True) -> Any:
    """A msgspec Struct type that requires each field of ``cls`` (and of the models it holds) with a value default.

    ``leaf`` types such a field: ``msgspec.Raw`` for JSON (not even parsed), ``Any`` for a dict.
    Other fields are left out, so decoding with it skims; ``format_version`` is kept (any value).
    A model of ``rules.refuse`` declares all its fields and forbids any other.
    """
    refuse = cls in rules.refuse
    names = {f.name for f in dataclasses.fields(cls)}
    spec: list[tuple[Any, ...]] = [("format_version", Any, None)] if top or "format_version" in names else []
    for f in dataclasses.fields(cls):
        hint, optional = _optional(_hints(cls)[f.name])
        inner = _inner_presence(hint, leaf, rules.nested())
        absent_ok = rules.absent_ok is True or f.name in (rules.absent_ok or ())
        if f.default is not dataclasses.MISSING and f.default is not None and not absent_ok:
            if f.name != "format_version":
                spec.append((f.name, inner or leaf))
        elif inner is not None:
            spec.append((f.name, inner | None if optional else inner, None))
        elif refuse and f.name != "format_version":
            spec.append((f.name, leaf, None))
    return msgspec.defstruct(f"{cls.__name__}Present", spec, kw_only=True, forbid_unknown_fields=refuse)


def _inner_presence(hint: Any, leaf: Any, rules: _Rules) -> Any:
    """The presence type of a model field or a tuple of models, if that model requires any field or refuses unknown keys."""
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint
    if not dataclasses.is_dataclass(item) or not isinstance(item, type):
        return None
    inner = _presence(item, leaf, rules, top=False)
    if item not in rules.refuse and not [name for name in inner.__struct_fields__ if name != "format_version"]:
        return None
    return tuple[inner, ...] if item is not hint else inner  # type: ignore[valid-type]


def _unknown_keys(cls: type, steps: list[str | int], obj: Any, fallback: str, path: str) -> str:
    """Every key of ``obj`` that the model at ``steps`` does not declare, and what it declares."""
    model: Any = cls
    if steps:
        place = _field_at(cls, steps)
        model = _optional(place[0])[0] if place is not None else None
    if not isinstance(obj, dict) or not dataclasses.is_dataclass(model):
        return f"{fallback} at {path}"
    declared = [f.name for f in dataclasses.fields(model) if f.name != "format_version"]
    return f"unknown keys {sorted(set(obj) - set(declared) - {'format_version'})} at {path} (allowed: {declared})"


def _keep(cls: type, obj: Mapping[str, Any]) -> Any:
    """``obj`` as ``cls``: each key it types with a value of its type, every other key kept as found.

    A null for a field written only when set (``omit_none``) is kept too, so it is written back.
    """
    known: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    declared = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("kept")}
    for key, value in obj.items():
        f = declared.get(key)
        if f is None or (value is None and f.metadata.get("omit_none")):
            kept[key] = value
            continue
        hint = _hints(cls)[key]
        model = _optional(hint)[0]
        if isinstance(value, dict) and isinstance(model, type) and dataclasses.is_dataclass(model) and _kept_name(model):
            known[key] = _keep(model, value)
            continue
        try:
            known[key] = msgspec.convert(value, hint)
        except msgspec.ValidationError:
            kept[key] = value
    return cls(**known, **{str(_kept_name(cls)): kept})


def _step(match: re.Match[str]) -> str | int:
    """One step of a msgspec path: a field name, a list index, or ``...`` (a value in a dict)."""
    if match["index"] is not None:
        return int(match["index"])
    return match["name"] or "..."


def _describe(hint: Any, name: str, entry: str | None, value: Any) -> str:
    """What is wrong with ``value`` for a field (or a list entry) declared ``hint``, in the wording of our errors."""
    shown = show_value(value)
    if entry is not None:
        kind = "a string" if hint is str else "an object" if dataclasses.is_dataclass(hint) else _hint_name(hint)
        return f"{entry} entry {shown} is not {kind}"
    if typing.get_origin(hint) is typing.Literal:
        if value is None:
            return f"field {name!r} is missing or not one of {list(typing.get_args(hint))}"
        return f"{name} {shown} is not one of {list(typing.get_args(hint))}"
    if hint is datetime and isinstance(value, str):
        return _not_utc(name, value)
    return f"field {name!r} is missing or not {_hint_name(hint)} (got {shown})"


def _field_at(cls: type, steps: list[str | int]) -> tuple[Any, str, str | None] | None:
    """The declared type at a path of ``cls``, the field's name, and the entry label when the path ends in a list."""
    hint: Any = cls
    name, label, entry = "", "", None
    for step in steps:
        hint = _optional(hint)[0]
        if isinstance(step, int):
            if typing.get_origin(hint) is not tuple:
                return None
            hint, entry = typing.get_args(hint)[0], label
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint) and step in _hints(hint):
            declared = {f.name: f for f in dataclasses.fields(hint)}[step]
            hint, name, label, entry = _hints(hint)[step], step, declared.metadata.get("entry", step), None
        else:
            return None
    return (hint, name, entry) if name else None


def _value_at(doc: Any, steps: list[str | int]) -> Any:
    for step in steps:
        if isinstance(step, int) and isinstance(doc, list) and step < len(doc):
            doc = doc[step]
        elif isinstance(step, str) and isinstance(doc, dict):
            doc = doc.get(step)
        else:
            return None
    return doc


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _optional(hint: Any) -> tuple[Any, bool]:
    """``X`` of ``X | None``, and whether None was allowed."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007 - a runtime union
    return hint, False


def _hint_name(hint: Any) -> str:
    hint = _optional(hint)[0]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_hint_name(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "list"
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint):
        return "dict"
    if hint is datetime:
        return "timestamp"
    return getattr(hint, "__name__", str(hint))
