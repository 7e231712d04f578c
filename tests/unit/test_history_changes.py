"""What the history pages say changed (issue 28): labels, key samples, fields that differ, a key's fate per run."""

from __future__ import annotations

import itertools
import json

from airflow_provider_shardyfusion.core.lifecycle.history import (
    change_label,
    differing_fields,
    key_fates,
    rank_fields,
    sample_changes,
)


def test_change_label_shows_counts_and_a_signed_net_change():
    changes = {"inserted": 200, "updated": 500, "deleted": 300, "deleted_absent": 7}
    assert change_label(changes, -100) == "+200 ~500 \u2212300 (net \u2212100)"
    assert change_label(None, 10) == "net +10" and change_label(None, None) == ""


def test_a_sample_walks_two_states_and_classifies_each_changed_key():
    def rows(d):
        return [(k.to_bytes(8, "big"), json.dumps(v).encode()) for k, v in sorted(d.items())]

    before = {1: {"a": 1, "b": 1}, 2: {"a": 2, "b": 2}, 3: {"a": 3, "b": 3}, 5: {"a": 5, "b": 5}}
    after = {1: {"a": 1, "b": 1}, 2: {"a": 20, "b": 2}, 3: {"a": 30, "b": 30}, 4: {"a": 4, "b": 4}}
    sample = sample_changes(0, rows(before), rows(after), key_encoding="u64be", value_format="json")
    assert [(c["key"], c["kind"], c["fields"]) for c in sample.changes] == [
        (2, "updated", ["a"]), (3, "updated", ["a", "b"]), (4, "inserted", []), (5, "deleted", [])]
    assert sample.changes[0]["before"] == {"a": 2, "b": 2} and sample.changes[0]["after"] == {"a": 20, "b": 2}
    assert sample.complete and sample.scanned == 8
    assert rank_fields(sample.changes) == [{"field": "a", "keys": 2}, {"field": "b", "keys": 1}]
    one_each = sample_changes(0, rows(before), rows(after), key_encoding="u64be", value_format="json", limit=1)
    assert [c["key"] for c in one_each.changes] == [2, 4, 5]  # one of each kind, then it stops
    updates = sample_changes(0, rows(before), rows(after), key_encoding="u64be", value_format="json", limit=2,
                             kinds=("updated",))
    assert [c["key"] for c in updates.changes] == [2, 3] and not updates.complete and updates.last_key == rows(after)[2][0]
    walked = sample_changes(0, rows(before), rows(after), key_encoding="u64be", value_format="json", scan_limit=2)
    assert walked.changes == () and walked.scanned == 2 and not walked.complete  # key 1, same in both


def test_inserts_after_many_updates_are_sampled_and_known_counts_end_the_walk():
    """Issue 41: 500 keys inserted at the end of the key space, after updates all over it, are in the
    sample; a kind the writer counted none of is not walked for; a walk goes on after where one stopped."""
    from airflow_provider_shardyfusion.core.lifecycle.history import spread

    def rows(keys, tag):
        return [(k.to_bytes(8, "big"), json.dumps(f"{tag}-{k}").encode()) for k in keys]

    before = rows(range(2000), "b0")
    after = [(k, v if int.from_bytes(k, "big") % 10 else json.dumps("new").encode()) for k, v in before]
    after += rows(range(2000, 2500), "b1")
    sample = sample_changes(0, before, after, key_encoding="u64be", value_format="json", limit=5)
    kinds = [c["kind"] for c in sample.changes]
    assert kinds.count("updated") == 5 and kinds.count("inserted") == 5, kinds
    assert [c["key"] for c in sample.changes if c["kind"] == "inserted"] == [2000, 2001, 2002, 2003, 2004]
    assert sample.complete  # no deletion: the walk went to the end looking for one
    counted = sample_changes(0, before, after, key_encoding="u64be", value_format="json", limit=5,
                             expected={"inserted": 500, "updated": 200, "deleted": 0})
    assert not counted.complete and counted.scanned < sample.scanned  # stopped at the fifth insert
    assert counted.changes == sample.changes
    # A page after the last key of the one before.
    page2 = sample_changes(0, before, after, key_encoding="u64be", value_format="json", limit=5, kinds=("inserted",),
                           after_key=counted.last_key)
    assert [c["key"] for c in page2.changes] == [2005, 2006, 2007, 2008, 2009]
    assert spread(list(range(64)), 8) == [0, 9, 18, 27, 36, 45, 54, 63] and spread([1, 2], 8) == [1, 2]


def test_differing_fields_of_objects_and_of_plain_values():
    assert differing_fields({"a": 1, "b": 2}, {"a": 1, "c": 2}) == ["b", "c"]
    assert differing_fields("x", "y") == ["(value)"] and differing_fields({"a": 1}, {"a": 1}) == []


def test_a_keys_fate_in_each_run_against_the_run_before_it():
    newest_first = [
        {"run_id": "r5", "found": False, "value": None},
        {"run_id": "r4", "found": True, "value": {"a": 2, "b": 1}},
        {"run_id": "r3", "found": True, "value": {"a": 1, "b": 1}},
        {"run_id": "r2", "found": True, "value": {"a": 1, "b": 1}},
        {"run_id": "r1", "found": False, "value": None},
        {"run_id": "r0", "found": None, "error": "StorageError: x"},
    ]
    fates = key_fates(newest_first)
    assert [(f["run_id"], f["fate"], f["fields"]) for f in fates] == [
        ("r5", "deleted", []), ("r4", "updated", ["a"]), ("r3", "unchanged", []), ("r2", "inserted", []),
        ("r1", "unknown", []), ("r0", "unknown", [])]
    assert fates[1]["before"] == {"a": 1, "b": 1} and fates[1]["compared_with"] == "r3"


def test_raw_keys_in_a_sample_are_shown_as_hex_and_link_to_a_hex_look_up():
    from airflow_provider_shardyfusion.ui.render import key_link

    before = [(b"\xff\x00", b"a")]
    after = [(b"\xff\x00", b"b"), (b"ok", b"c")]
    sample = sample_changes(0, before, after, key_encoding="raw", value_format="binary")
    assert [c["key"] for c in sample.changes] == [{"hex": "ff00"}, {"hex": "6f6b"}]
    assert "key=ff00&amp;key_type=hex" in key_link("file:///r", sample.changes[0]["key"])
    assert "key=7&amp;" not in key_link("file:///r", 7) and key_link("file:///r", 7).endswith(">7</a>")
    # A stored key that does not decode with the key encoding is shown as its bytes.
    odd = sample_changes(0, [], [(b"\x01", b"v")], key_encoding="u64be", value_format="binary")
    assert odd.changes[0]["key"] == {"hex": "01"}


def test_chart_labels_of_run_ids_do_not_overlap():
    """Issue 28: the charts' run labels are readable: no label runs into the next one."""
    import re

    from airflow_provider_shardyfusion.ui.render import bar_chart

    # A label glyph (digits, a space, an ellipsis) at font-size 11 is at most ~6.8 px wide in the
    # sans-serif fonts browsers use (0.62 em).
    glyph_px = 6.8
    for n in (3, 8, 12, 30, 200):
        labels = [f"202601{1 + i % 28:02d}T{i % 24:02d}0000Z-{i:08x}" for i in range(n)]
        svg = bar_chart("rows", labels, list(range(n)), x_axis="run", y_axis="rows")
        shown = re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="11" text-anchor="middle">(.*?)</text>', svg)
        assert shown and len(shown) >= min(n, 6), (n, len(shown))  # a label every few bars at most
        xs = [float(x) for x, _ in shown]
        lines = [re.findall(r"<tspan[^>]*>(.*?)</tspan>", text) for _, text in shown]
        widest = max(len(line) for label in lines for line in label) * glyph_px
        gaps = [b - a for a, b in itertools.pairwise(xs)]
        assert not gaps or min(gaps) > widest, (n, min(gaps), widest, shown[:3])
        # Date and time, then the run id's suffix.
        assert all(len(label) == 2 and label[0][:4] in {lab[4:8] for lab in labels} and label[1][0] == "…"
                   for label in lines), lines[:3]


def test_a_chart_of_zeros_labels_its_zero_once():
    """A chart whose top is 0 (no growth, e.g. net changes of 0 and below) has one "0" on its axis,
    not two drawn over each other."""
    import re

    from airflow_provider_shardyfusion.ui.render import bar_chart

    for values in ([0, None], [0, -3], [4, 0]):
        svg = bar_chart("net", ["a", "b"], values, x_axis="run", y_axis="change")
        assert len(re.findall(r'text-anchor="end" font-size="11">0</text>', svg)) == 1, (values, svg)


def test_values_of_two_encoders_compare_by_their_typed_values():
    """SPEC §18: a chain whose base the Python encoder wrote must not show every key as updated."""
    import datetime as dt

    import pyarrow as pa

    from airflow_provider_shardyfusion.core.lifecycle.history import typed_comparison
    from airflow_provider_shardyfusion.core.model.encoding import encode_json_value
    from airflow_provider_shardyfusion.core.model.value_schema import from_arrow

    schema = from_arrow(pa.schema([("at", pa.timestamp("us", tz="UTC")), ("tags", pa.map_(pa.string(), pa.int64())),
                                   ("n", pa.int64())]), ["at", "tags", "n"])
    at = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    # The Python encoder of earlier versions: isoformat, a map as pairs; the engine's: RFC 3339 Z, an object.
    old = {k: encode_json_value({"at": at + dt.timedelta(days=k), "n": k, "tags": [("b", 2), ("a", 1)]}) for k in (1, 2, 3)}
    new = {k: f'{{"at":"2024-01-0{2 + k}T03:04:05.000000Z","n":{k * (k != 3 or 10)},"tags":{{"a":1,"b":2}}}}'.encode()
           for k in (1, 2, 3)}
    assert old[1] != new[1]

    def rows(d):
        return [(k.to_bytes(8, "big"), v) for k, v in sorted(d.items())]

    typed = typed_comparison("json", schema)
    sample = sample_changes(0, rows(old), rows(new), key_encoding="u64be", value_format="json", typed=typed)
    assert [(c["key"], c["kind"], c["fields"]) for c in sample.changes] == [(3, "updated", ["n"])]
    by_bytes = sample_changes(0, rows(old), rows(new), key_encoding="u64be", value_format="json")
    assert len(by_bytes.changes) == 3  # what the pages showed without the typed comparison
    assert typed_comparison("binary", schema) is None and typed_comparison("json", None) is None

    fates = key_fates([{"run_id": "new", "found": True, "value": json.loads(new[1]), "typed": typed(new[1])},
                       {"run_id": "old", "found": True, "value": json.loads(old[1]), "typed": typed(old[1])}])
    assert [(f["run_id"], f["fate"]) for f in fates] == [("new", "unchanged"), ("old", "inserted")]
    assert all("typed" not in f for f in fates)  # the pages and their JSON twins show values as JSON


def test_runs_compare_typed_whatever_their_encoder_labels_say():
    """A delta on a base the Python encoder wrote carries the engine's label while its base layers
    keep the old bytes, and a run older than SPEC §18 has no schema: both directions compare typed."""
    import datetime as dt

    import pyarrow as pa

    from airflow_provider_shardyfusion.core import layout
    from airflow_provider_shardyfusion.core.lifecycle.history import comparison_between
    from airflow_provider_shardyfusion.core.model.encoding import encode_json_value
    from airflow_provider_shardyfusion.core.model.manifest import Manifest, ShardingInfo
    from airflow_provider_shardyfusion.core.model.value_schema import VALUE_ENCODING_ENGINE, from_arrow

    def manifest(**over) -> Manifest:
        base = dict(run_id=layout.new_run_id(), created_at=dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
                    output_uri="file:///tmp/compare", num_dbs=1, sharding=ShardingInfo(strategy="hash", key_column="id"),
                    key_encoding="u64be", value_format="binary", shards=(), value_columns=("payload",))
        return Manifest(**{**base, **over})

    schema = from_arrow(pa.schema([("at", pa.timestamp("us", tz="UTC")), ("n", pa.int64())]), ["at", "n"])
    at = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    old = encode_json_value({"at": at, "n": 1})  # the Python encoder, as a pre-§18 base layer holds it
    new = b'{"at":1704164645000000,"n":1}'  # the engine: epoch microseconds
    changed = b'{"at":1704164645000000,"n":2}'
    assert old != new
    pre = manifest(value_format="json", value_columns=("at", "n"))
    delta = manifest(value_format="json", value_columns=("at", "n"), value_schema=schema,
                     value_encoding_version=VALUE_ENCODING_ENGINE)
    full = manifest(value_format="json", value_columns=("at", "n"), value_schema=schema,
                    value_encoding_version=VALUE_ENCODING_ENGINE)
    rows_old = [((1).to_bytes(8, "big"), old), ((2).to_bytes(8, "big"), old)]
    rows_new = [((1).to_bytes(8, "big"), new), ((2).to_bytes(8, "big"), changed)]
    for before, after, a, b in ((delta, full, rows_old, rows_new), (full, pre, rows_new, rows_old),
                                (pre, full, rows_old, rows_new)):
        typed = comparison_between(before, after)
        assert typed is not None
        sample = sample_changes(0, a, b, key_encoding="u64be", value_format="json", typed=typed)
        assert [(c["key"], c["kind"], c["fields"]) for c in sample.changes] == [(2, "updated", ["n"])]
    assert comparison_between(pre, pre) is None  # no schema on either side: the bytes decide
    assert comparison_between(manifest(), full) is None  # binary against JSON: nothing to decode both by
