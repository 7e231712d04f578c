"""Persisted objects (SPEC §7): _CURRENT pointer, manifest, run record."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ManifestValidationError, RunRecordError
from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardFile, ShardingInfo
from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
from airflow_provider_shardyfusion.core.model.run_record import RunError, RunRecord

T0 = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
ROOT = "s3://my-bucket/snap"
RUN = "20240102T030405Z-0a1b2c3d"


def shard(db_id, *, run_id=RUN, root=ROOT, attempt=0, task=7, url=None):
    return ShardEntry(
        db_id=db_id,
        db_url=url or layout.join(root, layout.attempt_key(run_id, db_id, attempt, task)),
        attempt=attempt, task_attempt_id=task, row_count=10 + db_id, byte_size=1000 + db_id,
        min_key="0000000000000001", max_key="00000000000000ff",
        files=(ShardFile("000001.sst", 900, "xxh3_128:" + "a" * 32), ShardFile("CURRENT", 16, "xxh3_128:" + "b" * 32)),
    )


def manifest(**over):
    base = dict(
        run_id=RUN, created_at=T0, output_uri=ROOT, num_dbs=4,
        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be", value_format="binary",
        shards=(shard(0), shard(2), shard(3, attempt=1, task=None)), value_columns=("payload",),
        storage_engine={"name": "rocksdb", "writer": "rocksdict 0.3.29"},
        stats={"rows": 36, "empty_shards": [1]}, writer={"provider": "0.1.0", "spark": "4.2.0"},
    )
    base.update(over)
    return Manifest(**base)


def manifest_json(**changes):
    data = manifest().to_dict()
    data.update(changes)
    return json.dumps(data).encode()


# ---- _CURRENT -------------------------------------------------------------------------------


def pointer(run_id=RUN, root=ROOT, ref=None):
    return CurrentPointer(manifest_ref=ref or layout.join(root, layout.manifest_key(run_id, T0)), run_id=run_id,
                          updated_at=T0)


def test_pointer_round_trips():
    p = pointer()
    assert CurrentPointer.from_dict(p.to_dict()) == p
    assert CurrentPointer.from_bytes(p.to_bytes()) == p
    assert set(p.to_dict()) == {"format_version", "manifest_ref", "manifest_content_type", "run_id", "updated_at",
                                "previous_run_id", "manifest_checksum", "manifest_size"}
    assert json.loads(p.to_bytes())["updated_at"] == "2024-01-02T03:04:05.123456Z"


def test_pointer_check_root_accepts_own_manifest():
    pointer().check_root(ROOT)


@pytest.mark.parametrize(
    "ref",
    [
        layout.join("s3://my-bucket/other", layout.manifest_key(RUN, T0)),  # another root
        layout.join("s3://my-bucket/snap-2", layout.manifest_key(RUN, T0)),  # root sharing a string prefix
        layout.join("s3://evil-bucket/snap", layout.manifest_key(RUN, T0)),
        layout.join(ROOT, layout.manifest_key("other-run", T0)),  # another run's manifest
        f"{ROOT}/manifests/../runs/run_id={RUN}/manifest.json",
        f"{ROOT}/runs/run_id={RUN}/run.json",  # not a manifest key
        f"{ROOT}/manifests/x_run_id={RUN}/manifest.json",
    ],
)
def test_pointer_check_root_refuses(ref):
    with pytest.raises(ManifestValidationError, match="manifest_ref"):
        pointer(ref=ref).check_root(ROOT)


def test_pointer_future_version():
    data = pointer().to_dict() | {"format_version": 2}
    with pytest.raises(ManifestValidationError, match="format_version 2"):
        CurrentPointer.from_bytes(json.dumps(data).encode())


@pytest.mark.parametrize("field", ["manifest_ref", "run_id", "updated_at", "manifest_content_type"])
def test_pointer_missing_field(field):
    data = pointer().to_dict()
    del data[field]
    with pytest.raises(ManifestValidationError, match=field):
        CurrentPointer.from_bytes(json.dumps(data).encode())


def test_pointer_bad_run_id():
    data = pointer().to_dict() | {"run_id": "../x"}
    with pytest.raises(ManifestValidationError, match="run_id"):
        CurrentPointer.from_bytes(json.dumps(data).encode())


@pytest.mark.parametrize("obj", [[1], "x", None])
def test_pointer_from_dict_not_an_object(obj):
    with pytest.raises(ManifestValidationError, match="_CURRENT pointer must be a JSON object"):
        CurrentPointer.from_dict(obj)


def test_pointer_from_dict_bad_format_version():
    data = pointer().to_dict()
    del data["format_version"]
    with pytest.raises(ManifestValidationError, match="format_version"):
        CurrentPointer.from_dict(data)
    with pytest.raises(ManifestValidationError, match="format_version"):
        CurrentPointer.from_dict(pointer().to_dict() | {"format_version": "1"})


def test_pointer_unexpected_failure_is_still_a_pointer_error(monkeypatch):
    def boom(*args, **kwargs):
        raise AttributeError("unexpected shape")

    data = pointer().to_bytes()
    monkeypatch.setattr(layout, "validate_run_id", boom)  # a check after decoding fails unexpectedly
    malformed = r"_CURRENT pointer of run '.*' is malformed: AttributeError: unexpected shape"
    with pytest.raises(ManifestValidationError, match=malformed):
        CurrentPointer.from_bytes(data)


@pytest.mark.parametrize("data", [b"not json", b"[1]", b"", b"\xff\xfe"])
def test_pointer_not_json(data):
    with pytest.raises(ManifestValidationError, match="_CURRENT"):
        CurrentPointer.from_bytes(data)


# ---- manifest -------------------------------------------------------------------------------


def test_manifest_round_trips():
    m = manifest().validate()
    assert Manifest.from_dict(m.to_dict()) == m
    assert Manifest.from_bytes(m.to_bytes()) == m
    back = Manifest.from_bytes(m.to_bytes())
    assert back.shard(2).files[0] == ShardFile("000001.sst", 900, "xxh3_128:" + "a" * 32)
    assert back.shard(3).task_attempt_id is None and back.shard(1) is None
    assert back.row_count == 10 + 12 + 13 and back.byte_size == 1000 + 1002 + 1003


def test_manifest_cel_round_trip():
    m = manifest(num_dbs=3, sharding=ShardingInfo(strategy="cel", key_column="id", cel_expr="region",
                                                  cel_columns={"region": "string"}, cel_mode="categorical",
                                                  routing_values=("eu", "us", "ap")),
                 shards=(shard(0), shard(2)))
    back = Manifest.from_bytes(m.to_bytes())
    assert back == m and back.sharding.routing_values == ("eu", "us", "ap")


def test_manifest_bytes_are_compact_sorted_json():
    data = manifest().to_bytes()
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    assert json.loads(data)["sharding"]["hash_algorithm"] == "xxh3_64"


def test_manifest_is_encoded_once_and_a_changed_copy_anew():
    """A publish stores the bytes and records their checksum: one encoding (~0.1 s at 1000 shards, a
    tenth of a small delta's write), and a replaced manifest never answers with its original's bytes."""
    m = manifest()
    assert m.to_bytes() is m.to_bytes()
    other = replace(m, run_id="run-2")
    assert json.loads(other.to_bytes())["run_id"] == "run-2" and json.loads(m.to_bytes())["run_id"] != "run-2"


def test_manifest_empty_shard_list_is_valid():
    assert Manifest.from_bytes(manifest(shards=()).to_bytes()).shards == ()


def test_manifest_future_format_version():
    with pytest.raises(ManifestValidationError, match="format_version 3"):
        Manifest.from_bytes(manifest_json(format_version=3))
    with pytest.raises(ManifestValidationError, match="format_version"):
        manifest(format_version=3).validate()


def test_manifest_missing_hash_algorithm():
    data = manifest().to_dict()
    del data["sharding"]["hash_algorithm"]
    with pytest.raises(ManifestValidationError, match="hash_algorithm"):
        Manifest.from_bytes(json.dumps(data).encode())


def test_manifest_unknown_hash_algorithm():
    data = manifest().to_dict()
    data["sharding"]["hash_algorithm"] = "murmur3"
    with pytest.raises(ManifestValidationError, match="'murmur3'"):
        Manifest.from_bytes(json.dumps(data).encode())


def test_manifest_duplicate_shard_ids():
    with pytest.raises(ManifestValidationError, match="db_id 2 appears more than once"):
        Manifest.from_bytes(manifest(shards=(shard(2), shard(2, attempt=1))).to_bytes())


@pytest.mark.parametrize("db_id", [4, -1, 100])
def test_manifest_shard_id_out_of_range(db_id):
    bad = shard(0, url=layout.join(ROOT, f"shards/run_id={RUN}/db=00000/attempt=00"))
    with pytest.raises(ManifestValidationError, match=rf"{db_id} is outside \[0, 4\)"):
        Manifest.from_bytes(manifest(shards=(replace(bad, db_id=db_id),)).to_bytes())


def test_manifest_routing_values_length_mismatch():
    sharding = ShardingInfo(strategy="cel", key_column="id", cel_expr="region", cel_columns={"region": "string"},
                            cel_mode="categorical", routing_values=("eu", "us"))
    with pytest.raises(ManifestValidationError, match="routing_values has 2 values but num_dbs is 4"):
        Manifest.from_bytes(manifest(sharding=sharding).to_bytes())


def test_manifest_categorical_without_routing_values():
    sharding = ShardingInfo(strategy="cel", key_column="id", cel_expr="region", cel_columns={"region": "string"},
                            cel_mode="categorical")
    with pytest.raises(ManifestValidationError, match="routing_values"):
        manifest(sharding=sharding).validate()


@pytest.mark.parametrize(
    "url",
    [
        f"{ROOT}/shards/run_id=other-run/db=00001/attempt=00",  # another run
        f"{ROOT}/shards/run_id={RUN}x/db=00001/attempt=00",  # run id sharing a prefix
        f"s3://my-bucket/elsewhere/shards/run_id={RUN}/db=00001/attempt=00",  # another root
        f"s3://evil-bucket/snap/shards/run_id={RUN}/db=00001/attempt=00",
        f"file:///snap/shards/run_id={RUN}/db=00001/attempt=00",
        f"{ROOT}/shards/run_id={RUN}/../run_id=other-run/db=00001/attempt=00",  # '..' escape
        f"{ROOT}/shards/run_id={RUN}/db=00001/../../../../etc",
        f"{ROOT}/manifests/x",
    ],
)
def test_manifest_db_url_outside_own_shards_folder(url):
    with pytest.raises(ManifestValidationError, match="db_url"):
        Manifest.from_bytes(manifest(shards=(shard(1, url=url),)).to_bytes())


def test_manifest_db_url_on_file_root():
    root = "file:///data/snap"
    ok = manifest(output_uri=root, shards=(shard(0, root=root),))
    assert Manifest.from_bytes(ok.to_bytes()) == ok
    with pytest.raises(ManifestValidationError, match="db_url"):
        manifest(output_uri=root, shards=(shard(0, root="file:///data/other"),)).validate()


def cel_sharding(**over):
    base = dict(strategy="cel", key_column="id", cel_expr="region", cel_columns={"region": "string"},
                cel_mode="categorical", routing_values=("eu", "us", "ap", "sa"))
    base.update(over)
    return ShardingInfo(**base)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        (dict(cel_columns={"region": "float"}), r"type 'float' of column 'region' is not one of"),
        (dict(cel_columns={"region": None}), r"cel_columns \['region'\] have no CEL type"),
        (dict(cel_columns={"": "string"}), "column name"),
        (dict(routing_values=("eu", "us", "eu", "ap")), r"routing_values must be unique; repeated: \['eu'\]"),
        (dict(routing_values=("eu", 1, "us", "ap")), "all strings or all integers"),
        (dict(routing_values=("eu", None, "us", "ap")), "null"),
    ],
)
def test_manifest_cel_columns_and_routing_values_validated(over, match):
    assert manifest(sharding=cel_sharding()).validate()
    bad = manifest(sharding=cel_sharding(**over))
    with pytest.raises(ManifestValidationError, match=match):
        bad.validate()
    with pytest.raises(ManifestValidationError, match=match):
        Manifest.from_bytes(bad.to_bytes())


def test_manifest_num_dbs_beyond_five_digit_folders():
    with pytest.raises(ManifestValidationError, match="99999"):
        Manifest.from_bytes(manifest_json(num_dbs=100_000))


@pytest.mark.parametrize(
    ("path", "bad", "match"),
    [
        (("value_columns",), 5, "'value_columns' is missing or not list"),
        (("value_columns",), [1], "value_columns entry 1 is not a string"),
        (("storage_engine",), ["rocksdb"], "'storage_engine' is missing or not dict"),
        (("stats",), "lots", "'stats' is missing or not dict"),
        (("writer",), [1], "'writer' is missing or not dict"),
        (("sharding", "routing_values"), 5, "'routing_values' is missing or not list"),
        (("sharding", "routing_values"), {"eu": 0}, "'routing_values' is missing or not list"),
        (("shards", 0, "files"), [1], "file entry 1 is not an object"),
        (("shards", 0, "files"), ["a.sst"], "file entry 'a.sst' is not an object"),
    ],
)
def test_manifest_malformed_shapes(path, bad, match):
    data = manifest().to_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    with pytest.raises(ManifestValidationError, match=match):
        Manifest.from_bytes(json.dumps(data).encode())


@pytest.mark.parametrize("obj", [[1], "manifest", None])
def test_manifest_from_dict_not_an_object(obj):
    with pytest.raises(ManifestValidationError, match="manifest must be a JSON object"):
        Manifest.from_dict(obj)


def test_manifest_from_dict_missing_format_version():
    data = manifest().to_dict()
    del data["format_version"]
    with pytest.raises(ManifestValidationError, match="format_version"):
        Manifest.from_dict(data)


def test_manifest_unexpected_failure_is_still_a_manifest_error(monkeypatch):
    def boom(self):
        raise TypeError("unexpected shape")

    monkeypatch.setattr(Manifest, "validate", boom)
    with pytest.raises(ManifestValidationError, match=rf"manifest of run '{RUN}' is malformed: TypeError: unexpected shape"):
        Manifest.from_bytes(manifest().to_bytes())


@pytest.mark.parametrize("data", [b"not json", b"", b"[]", b'"manifest"', b"\xff\x00"])
def test_manifest_not_json(data):
    with pytest.raises(ManifestValidationError, match="manifest"):
        Manifest.from_bytes(data)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(key_encoding="zigzag"), "key_encoding"),
        (dict(value_format="xml"), "value_format"),
        (dict(num_dbs=0), "num_dbs"),
        (dict(run_id="../x"), "run_id"),
        (dict(output_uri="relative/x"), "output_uri"),
        (dict(created_at="yesterday"), "created_at"),
        (dict(num_dbs="4"), "num_dbs"),
        (dict(format_version="1"), "format_version"),
        (dict(shards=[1, 2]), "shard entry"),
    ],
)
def test_manifest_other_bad_fields(change, match):
    with pytest.raises(ManifestValidationError, match=match):
        Manifest.from_bytes(manifest_json(**change))


def test_manifest_shard_file_name_escape():
    data = manifest().to_dict()
    data["shards"][0]["files"][0]["name"] = "../../etc/passwd"
    with pytest.raises(ManifestValidationError, match="name"):
        Manifest.from_bytes(json.dumps(data).encode())


def test_manifest_negative_counts():
    with pytest.raises(ManifestValidationError, match="negative"):
        manifest(shards=(replace(shard(0), row_count=-1),)).validate()


# ---- run record -----------------------------------------------------------------------------


def record(**over):
    base = dict(run_id=RUN, status="running", started_at=T0, updated_at=T0 + timedelta(seconds=5),
                lease_expires_at=T0 + timedelta(minutes=10), output_uri=ROOT, num_dbs=4,
                config_fingerprint="sha256:" + "0" * 64, writer={"spark_app_id": "local-1"})
    base.update(over)
    return RunRecord(**base)


@pytest.mark.parametrize(
    "rec",
    [
        record(),
        record(status="succeeded", finished_at=T0 + timedelta(minutes=2),
               manifest_ref=layout.join(ROOT, layout.manifest_key(RUN, T0)), stats={"rows": 10}),
        record(status="failed", finished_at=T0 + timedelta(minutes=1),
               error=RunError(type="ShardWriteError", message="db 3 failed", traceback_tail="Traceback...")),
    ],
    ids=["running", "succeeded", "failed"],
)
def test_run_record_round_trips(rec):
    rec.validate()
    assert RunRecord.from_dict(rec.to_dict()) == rec
    assert RunRecord.from_bytes(rec.to_bytes()) == rec


def test_run_record_lease_expired():
    rec = record()
    assert not rec.lease_expired(T0 + timedelta(minutes=9))
    assert rec.lease_expired(T0 + timedelta(minutes=10))
    assert not record(status="failed", error=RunError("X", "y")).lease_expired(T0 + timedelta(days=1))
    assert not rec.is_terminal and record(status="failed", error=RunError("X", "y")).is_terminal


def test_run_error_from_exception():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        err = RunError.from_exception(exc)
    assert err.type == "ValueError" and err.message == "boom" and "boom" in err.traceback_tail


def run_record_json(**changes):
    data = record().to_dict()
    data.update(changes)
    return json.dumps(data).encode()


def test_run_record_bad_status():
    with pytest.raises(RunRecordError, match="status 'paused'"):
        RunRecord.from_bytes(run_record_json(status="paused"))


def test_run_record_succeeded_without_manifest_ref():
    with pytest.raises(RunRecordError, match="manifest_ref"):
        RunRecord.from_bytes(run_record_json(status="succeeded"))


def test_run_record_failed_without_error():
    with pytest.raises(RunRecordError, match="error"):
        RunRecord.from_bytes(run_record_json(status="failed"))


def test_run_record_future_version():
    with pytest.raises(RunRecordError, match="format_version 3"):
        RunRecord.from_bytes(run_record_json(format_version=3))


@pytest.mark.parametrize(
    ("change", "match"),
    [(dict(run_id=".."), "run_id"), (dict(started_at="yesterday"), "started_at"),
     (dict(lease_expires_at=None), "lease_expires_at"), (dict(output_uri=None), "output_uri"),
     (dict(format_version=None), "format_version")],
)
def test_run_record_bad_fields(change, match):
    with pytest.raises(RunRecordError, match=match):
        RunRecord.from_bytes(run_record_json(**change))


@pytest.mark.parametrize(
    ("change", "match"),
    [(dict(writer=["spark"]), "'writer' is missing or not dict"), (dict(stats="many"), "'stats' is missing or not dict"),
     (dict(error="boom", status="failed"), "'error' is missing or not dict")],
)
def test_run_record_malformed_shapes(change, match):
    with pytest.raises(RunRecordError, match=match):
        RunRecord.from_bytes(run_record_json(**change))


@pytest.mark.parametrize("obj", [[1], "x", None])
def test_run_record_from_dict_not_an_object(obj):
    with pytest.raises(RunRecordError, match="run record must be a JSON object"):
        RunRecord.from_dict(obj)


def test_run_record_from_dict_missing_format_version():
    data = record().to_dict()
    del data["format_version"]
    with pytest.raises(RunRecordError, match="format_version"):
        RunRecord.from_dict(data)


def test_run_record_unexpected_failure_is_still_a_run_record_error(monkeypatch):
    def boom(self):
        raise ValueError("unexpected shape")

    monkeypatch.setattr(RunRecord, "validate", boom)
    data = record(status="failed", error=RunError("X", "y")).to_dict()
    with pytest.raises(RunRecordError, match=rf"run record of run '{RUN}' is malformed: ValueError: unexpected shape"):
        RunRecord.from_dict(data)


@pytest.mark.parametrize("data", [b"nope", b"[]", b""])
def test_run_record_not_json(data):
    with pytest.raises(RunRecordError, match="run record"):
        RunRecord.from_bytes(data)


def test_manifest_refuses_a_db_url_in_another_shards_folder():
    """A shard entry must point into its own db=<id> folder, not a sibling shard's."""
    import dataclasses

    from airflow_provider_shardyfusion.core import layout
    from airflow_provider_shardyfusion.core.errors import ManifestValidationError
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardEntry, ShardingInfo

    root, run_id = "file:///data/snap", "run-1"

    def entry(db_id: int, folder_db: int) -> ShardEntry:
        url = layout.join(root, layout.attempt_key(run_id, folder_db, 0, 7))
        return ShardEntry(db_id=db_id, db_url=url, attempt=0, task_attempt_id=7, row_count=1, byte_size=1,
                          min_key="00", max_key="00")

    manifest = Manifest(run_id=run_id, created_at=layout.utc_now(), output_uri=root, num_dbs=4,
                        sharding=ShardingInfo(strategy="hash", key_column="id"), key_encoding="u64be",
                        value_format="binary", shards=(entry(1, 1),))
    manifest.validate()
    with pytest.raises(ManifestValidationError, match="in its own folder"):
        dataclasses.replace(manifest, shards=(entry(1, 2),)).validate()


DATA = Path(__file__).resolve().parents[1] / "data"


def test_stored_manifests_of_every_format_still_read():
    """A full manifest as written before chains existed (format 1, no chain fields) and a delta's (format 2)."""
    old = Manifest.from_bytes((DATA / "manifest_v1_pre_delta.json").read_bytes())
    assert old.format_version == 1 and old.chain_depth == 0 and old.write_mode == "full" and old.base_run_id is None
    assert not old.is_chain and old.layer_run_ids() == {old.run_id}
    for shard in old.shards:  # read as one full layer of its own run
        (layer,) = shard.all_layers()
        assert (layer.run_id, layer.db_url, layer.files, layer.kind) == (old.run_id, shard.db_url, shard.files, "full")
    delta = Manifest.from_bytes((DATA / "manifest_v2_delta.json").read_bytes())
    assert delta.format_version == 2 and delta.chain_depth == 1 and delta.base_run_id == old.run_id
    assert delta.layer_run_ids() == {old.run_id, delta.run_id}
    assert delta.row_count == 40 - 1 + 1  # key 2 deleted, key 50 inserted, key 1 updated
    new = [layer for s in delta.shards for layer in s.layers if layer.run_id == delta.run_id]
    assert sum(x.inserted for x in new) == 1 and sum(x.updated for x in new) == 1 and sum(x.deleted for x in new) == 1
    assert all(s.layers[0].files == o.files for s, o in zip(delta.shards, old.shards, strict=True))


def test_a_chain_manifest_needs_format_2_and_consistent_layers():
    data = json.loads((DATA / "manifest_v2_delta.json").read_bytes())
    with pytest.raises(ManifestValidationError, match="need format_version 2"):
        Manifest.from_dict({**data, "format_version": 1})
    broken = json.loads(json.dumps(data))
    broken["shards"][0]["layers"][-1]["inserted"] += 1
    with pytest.raises(ManifestValidationError, match="counts are negative or inconsistent"):
        Manifest.from_dict(broken)
    moved = json.loads(json.dumps(data))
    moved["shards"][0]["layers"][0]["db_url"] = moved["shards"][0]["layers"][0]["db_url"].replace(
        "run_id=20260101T000000Z-0000base", "run_id=20260101T000000Z-elsewhere")
    with pytest.raises(ManifestValidationError, match="is not in that run's folder"):
        Manifest.from_dict(moved)


def test_validation_checks_each_run_id_once_not_once_per_shard(monkeypatch):
    """What keeps a 100k-shard decode within 2x its json.loads (SPEC §17): per-shard checks are string
    tests against a prefix built once per run, however many shards and layers name that run."""
    from airflow_provider_shardyfusion.core.model import manifest as manifest_module

    many = manifest(num_dbs=500, shards=tuple(shard(i) for i in range(500)))
    data = many.to_bytes()
    checked = []
    validate = layout.validate_run_id
    monkeypatch.setattr(manifest_module.layout, "validate_run_id",
                        lambda run_id, **kw: checked.append(run_id) or validate(run_id, **kw))
    assert Manifest.from_bytes(data) == many
    assert len(checked) <= 3 and set(checked) == {RUN}
    # Still each shard in its own folder: one misplaced shard among 500 is found and named.
    moved = many.shards[321].db_url.replace("db=00321", "db=00322")
    with pytest.raises(ManifestValidationError, match=r"db_url .* of shard 321 is not under .* in its own folder"):
        replace(many, shards=(*many.shards[:321], replace(many.shards[321], db_url=moved), *many.shards[322:])).validate()
    dotted = layout.join(ROOT, layout.shard_db_prefix(RUN, 7)) + "attempt=00/../../db=00008/attempt=00"
    with pytest.raises(ManifestValidationError, match="of shard 7 is not under"):
        replace(many, shards=(*many.shards[:7], replace(many.shards[7], db_url=dotted), *many.shards[8:])).validate()


def test_the_root_check_of_shard_urls_validates_each_run_id_once(monkeypatch):
    """Every manifest a read follows is checked against the root it was read from (core.model.snapshot.
    check_shard_urls): once per run, then string tests per shard, as Manifest.validate does."""
    from airflow_provider_shardyfusion.core.model.chain import check_shard_urls

    many = manifest(num_dbs=500, shards=tuple(shard(i) for i in range(500)))
    checked = []
    validate = layout.validate_run_id
    monkeypatch.setattr(layout, "validate_run_id", lambda run_id, **kw: checked.append(run_id) or validate(run_id, **kw))
    check_shard_urls(many, ROOT, "here")
    assert checked == [RUN]
    elsewhere = layout.join("s3://other-bucket/snap", layout.attempt_key(RUN, 9, 0, 1))
    for url in (elsewhere, layout.join(ROOT, layout.shard_db_prefix(RUN, 9)) + "attempt=00/../../db=00010/x"):
        tampered = (*many.shards[:9], replace(many.shards[9], db_url=url), *many.shards[10:])
        with pytest.raises(ManifestValidationError, match=r"here: db_url .* of shard 9 is not under this snapshot's "):
            check_shard_urls(replace(many, shards=tampered), ROOT, "here")


def test_a_key_index_is_stored_only_when_present_and_reads_back():
    """Full shards (format 1) and layers (formats 2 and 3) carry an optional key index; stored
    manifests without one keep their exact shard JSON (no ``key_index: null`` appears)."""
    stored = json.loads((DATA / "manifest_v2_delta.json").read_bytes())
    assert Manifest.from_dict(stored).to_dict()["shards"] == stored["shards"]
    index = ShardFile(name="keys-00000.sst", size=51, checksum="xxh3_128:" + "c" * 32)
    full = manifest(shards=(replace(shard(1), key_index=index),))
    data = json.loads(full.to_bytes())
    assert data["shards"][0]["key_index"] == {"checksum": index.checksum, "name": index.name, "size": 51}
    again = Manifest.from_bytes(full.to_bytes())
    assert again.shards[0].key_index == index and again.shards[0].files == full.shards[0].files
    (layer,) = again.shards[0].all_layers()  # as the one full layer of a chain's shard
    assert layer.key_index == index and layer.stored_files() == (*layer.files, index)
    assert layer.byte_size == sum(f.size for f in layer.files)  # data only
    with pytest.raises(ManifestValidationError, match="must be a relative path"):
        Manifest.from_bytes(full.to_bytes().replace(b'"keys-00000.sst"', b'"../keys.sst"'))
    wrong = r"'size' is missing or not int \(got '51'\) at \$\.shards\[0\]\.key_index\.size"
    with pytest.raises(ManifestValidationError, match=wrong):
        Manifest.from_bytes(full.to_bytes().replace(b'"size":51', b'"size":"51"'))


def test_a_chain_shard_names_its_newest_layers_key_index():
    data = json.loads((DATA / "manifest_v2_delta.json").read_bytes())
    index = {"checksum": "xxh3_128:" + "d" * 32, "name": "keys-00000.sst", "size": 40}
    data["shards"][0]["layers"][-1]["key_index"] = index
    with pytest.raises(ManifestValidationError, match="db_url, files and key_index must be its newest layer's"):
        Manifest.from_dict(data)
    data["shards"][0]["key_index"] = index
    read = Manifest.from_dict(data)
    assert read.shards[0].layers[-1].key_index == read.shards[0].key_index == ShardFile.from_dict(index)
    assert read.shards[0].layers[0].key_index is None  # a base written before key indexes
