"""The msgspec codec keeps the rules of the persisted objects (SPEC §17), checked over many documents.

Valid documents (every stored format, with fields their writers may leave out dropped, and keys
a newer writer may add) decode equal to the model they came from; a document with one field of
the wrong type gives exactly one error of the object's kind naming that field's path.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError, RunRecordError
from airflow_provider_shardyfusion.core.model import manifest, pointer, run_record
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardLayer
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import RunError, RunRecord

DATA = Path(__file__).resolve().parents[1] / "data"
T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
RUN = "20260102T030405Z-0a1b2c3d"
ROOT = "s3://my-bucket/snap"


def _documents() -> list[tuple[type, Any, type[Exception]]]:
    """One model of each kind and stored format, with the error type of its kind."""
    v1 = Manifest.from_bytes((DATA / "manifest_v1_pre_delta.json").read_bytes())
    v2 = Manifest.from_bytes((DATA / "manifest_v2_delta.json").read_bytes())
    record = RunRecord(run_id=RUN, status="failed", started_at=T0, updated_at=T0, lease_expires_at=T0 + timedelta(minutes=10),
                       output_uri=ROOT, finished_at=T0, error=RunError("ShardWriteError", "db 3 failed", "Traceback"),
                       num_dbs=4, writer={"spark": "4.1"}, stats={"rows": 3}, validation={"ok": True})
    current = CurrentPointer(manifest_ref=layout.join(ROOT, layout.manifest_key(RUN, T0)), run_id=RUN, updated_at=T0,
                             previous_run_id="older-run", manifest_checksum="xxh3_128:" + "a" * 32, manifest_size=10)
    return [(Manifest, v1, ManifestValidationError), (Manifest, v2, ManifestValidationError),
            (RunRecord, record, RunRecordError), (CurrentPointer, current, ManifestValidationError)]


DOCUMENTS = _documents()
# Fields older writers left out although their default is a value: the model reads them as that default.
ABSENT_OK = {(Manifest, "chain_depth"), (Manifest, "write_mode")}


def _fields(cls: type, doc: dict, path: str):
    """(path, declared type, field, holder class, holder dict) of every field in ``doc``, nested models included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in doc:
            continue
        hint, where = hints[f.name], f"{path}.{f.name}"
        yield where, hint, f, cls, doc
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = hint if dataclasses.is_dataclass(hint) else args[0] if len(args) == 1 else None
        if typing.get_origin(hint) is tuple and dataclasses.is_dataclass(args[0]):
            for i, item in enumerate(doc[f.name]):
                yield from _fields(args[0], item, f"{where}[{i}]")
        elif inner is not None and dataclasses.is_dataclass(inner) and isinstance(doc[f.name], dict):
            yield from _fields(inner, doc[f.name], where)


def _absent_ok(cls: type, f: dataclasses.Field, value: Any) -> bool:
    """The field may be left out: it holds its default, and that default is None, an empty collection or listed."""
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    elif f.default is None or (cls, f.name) in ABSENT_OK:
        default = f.default
    else:
        return False
    return json.loads(json.dumps(manifest.ser.to_plain(default))) == value


def _decode_both(cls: type, doc: dict) -> list[Any]:
    return [cls.from_bytes(json.dumps(doc).encode()), cls.from_dict(json.loads(json.dumps(doc)))]


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(range(len(DOCUMENTS))), data=st.data())
def test_valid_documents_decode_equal(case, data):
    cls, model, _ = DOCUMENTS[case]
    doc = model.to_dict()
    for _path, _hint, f, holder, parent in list(_fields(cls, doc, "$")):
        if f.name in parent and _absent_ok(holder, f, parent[f.name]) and data.draw(st.booleans()):
            del parent[f.name]
        if data.draw(st.booleans()):
            parent["x_added_by_a_newer_writer"] = {"any": [1, "thing"]}
    assert _decode_both(cls, doc) == [model, model]


def _wrong_values(hint: Any) -> list[Any]:
    """Values of the wrong JSON type for a field declared ``hint`` (None only where the field needs a value)."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        wrong = ["no-such-value", 3]
    elif origin is tuple:
        wrong = [5, "x", {"a": 1}]
    elif origin is dict or dataclasses.is_dataclass(base):
        wrong = [[1], "x", 5]
    elif base is datetime:
        wrong = [5, "yesterday", "2026-01-02T03:04:05+02:00", "2026-01-02T03:04:05"]
    elif base is int:
        wrong = ["7", True, 1.5, [7]]
    else:
        wrong = [5, True, ["x"], {"x": 1}]
    return wrong


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(range(len(DOCUMENTS))), data=st.data())
def test_one_wrong_field_gives_one_error_naming_its_path(case, data):
    cls, model, error = DOCUMENTS[case]
    doc = model.to_dict()
    path, hint, f, _, parent = data.draw(st.sampled_from(list(_fields(cls, doc, "$"))))
    parent[f.name] = data.draw(st.sampled_from(_wrong_values(hint)))
    for decode in (lambda: cls.from_bytes(json.dumps(doc).encode()), lambda: cls.from_dict(doc)):
        with pytest.raises(error) as caught:
            decode()
        message = str(caught.value)
        assert type(caught.value) is error, message
        if f.name == "format_version":  # read before anything else, with its own message
            assert message.endswith("has no integer format_version"), message
            continue
        assert message.endswith(f" at {path}") and (repr(f.name) in message or f"{f.name} " in message), (path, message)


@pytest.mark.parametrize("field", ["puts", "deleted_absent", "files"])
def test_a_layer_count_left_out_is_refused_with_its_path(field):
    """Fields whose default is a value must be written: a layer without its counts is not read as zeros."""
    doc = json.loads((DATA / "manifest_v2_delta.json").read_bytes())
    del doc["shards"][1]["layers"][0][field]
    where = rf"\$\.shards\[1\]\.layers\[0\]\.{field}$"
    with pytest.raises(ManifestValidationError, match=rf"field '{field}' is missing .* at {where}"):
        Manifest.from_bytes(json.dumps(doc).encode())
    with pytest.raises(ManifestValidationError, match=rf"at {where}"):
        Manifest.from_dict(doc)
    with pytest.raises(ManifestValidationError, match=rf"manifest shard layer: field '{field}' is missing .* at \$\.{field}$"):
        ShardLayer.from_dict(doc["shards"][1]["layers"][0])


def test_a_newer_format_is_refused_before_its_fields_are_read():
    doc = json.loads((DATA / "manifest_v2_delta.json").read_bytes())
    doc.update(format_version=manifest.MANIFEST_FORMAT_VERSION + 1, shards="a new shape", sharding=None)
    newer = "newer than this provider supports .* upgrade airflow-provider-shardyfusion"
    with pytest.raises(ManifestValidationError, match=newer):
        Manifest.from_bytes(json.dumps(doc).encode())
    with pytest.raises(ManifestValidationError, match=newer):
        Manifest.from_dict(doc)
    with pytest.raises(RunRecordError, match=newer):
        RunRecord.from_bytes(json.dumps({"format_version": run_record.RUN_RECORD_FORMAT_VERSION + 1}).encode())
    with pytest.raises(ManifestValidationError, match=newer):
        CurrentPointer.from_bytes(json.dumps({"format_version": pointer.CURRENT_FORMAT_VERSION + 1}).encode())


def test_timestamps_live_at_the_top_of_each_object():
    """The codec checks that times are UTC on the decoded object's own fields: no model nests one deeper."""
    def nested_times(cls: type, top: bool) -> list[str]:
        found = []
        for name, hint in typing.get_type_hints(cls).items():
            parts = [hint, *typing.get_args(hint)]
            if datetime in parts and not top:
                found.append(f"{cls.__name__}.{name}")
            found += [t for p in parts if dataclasses.is_dataclass(p) for t in nested_times(p, False)]
            found += [t for p in parts for a in typing.get_args(p) if dataclasses.is_dataclass(a)
                      for t in nested_times(a, False)]
        return found

    assert [t for cls in (Manifest, RunRecord, CurrentPointer) for t in nested_times(cls, True)] == []
