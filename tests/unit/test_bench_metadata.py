"""benchmarks/bench_metadata.py in its smallest configuration, so it cannot rot: every figure is
produced and every manifest it writes reads back exactly. No timing is asserted (SPEC §10)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.storage import open_store

TESTS = Path(__file__).resolve().parents[1]
BENCH = TESTS.parent / "benchmarks" / "bench_metadata.py"


def load_bench(monkeypatch):
    # As `make bench` runs it: the snapshot factory importable from the tests folder.
    monkeypatch.syspath_prepend(str(TESTS))
    spec = importlib.util.spec_from_file_location("bench_metadata", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_metadata", module)
    spec.loader.exec_module(module)
    return module


def test_smallest_configuration_prints_every_figure(monkeypatch, tmp_path, capsys):
    bench = load_bench(monkeypatch)
    status = bench.main(["--delta-shards", "100,300", "--chain-shards", "100", "--chain-depth", "3", "--runs", "12",
                         "--cleanup-shards", "100", "--repeat", "1", "--workdir", str(tmp_path / "work")])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["correctness"] == {"ok": True, "errors": []}
    assert status == 0

    assert [(f["num_dbs"], f["shards_changed"]) for f in out["delta_manifest"]] == [(100, 1), (300, 3)]
    for f in out["delta_manifest"]:
        # The delta stores its own entries only: far less than its base, more than the entries alone.
        assert 0 < f["entry_bytes"] < f["manifest_bytes"] < f["base_manifest_bytes"] / 10
        assert f["value"] == round(f["manifest_bytes"] / f["entry_bytes"], 3)
    assert out["decode"]["num_dbs"] == 300
    assert out["decode"]["manifest_bytes"] == out["delta_manifest"][1]["base_manifest_bytes"]

    (chain,) = out["chain_refresh"]
    assert chain["depth"] == 3
    assert chain["fresh_manifests_read"] == chain["fresh_manifests_decoded"] == 4  # chain_depth + 1 (SPEC §17)
    assert 1 <= chain["refresh_manifests_read"] < chain["fresh_manifests_read"]
    assert chain["refresh_reads_one_manifest"] == (chain["refresh_manifests_read"] == 1)

    # 12 runs, compacted at depth 3: full, 3 deltas, compaction, 3 deltas, compaction, 3 deltas.
    root = out["runs_root"]
    assert root["manifests"] == {"full": 1, "delta": 9, "compact": 2}
    assert root["live_chain_depth"] == 3
    assert sum(out["cleanup"]["runs_by_rule"].values()) >= 12
    assert out["cleanup"]["peak_rss_bytes"] > 0
    # Each page reads the live chain once (its layers tell which runs are the "base of live"), nothing more.
    assert out["history_pages"]["timeline"]["manifests_read"] == root["live_chain_depth"] + 1
    assert out["history_pages"]["roots"]["manifests_read"] == root["live_chain_depth"] + 1
    assert all(isinstance(t["pass"], bool) for t in out["targets"].values())
    assert len(out["targets"]) == 2 + 2 + 1 + 2 + 2


def test_chain_builder_publishes_runs_that_read_back_exactly(monkeypatch, tmp_path):
    bench = load_bench(monkeypatch)
    failures: list[str] = []
    builder = bench.ChainBuilder(f"file://{tmp_path}/root", 50, max_depth=2, seed=1,
                                 check=lambda ok, what: ok or failures.append(what))
    built = [builder.next_run(read_back=False) for _ in range(5)]
    assert [(m.write_mode, m.chain_depth) for m in built] == [
        ("full", 0), ("delta", 1), ("delta", 2), ("compact", 0), ("delta", 1)]

    fresh = SnapshotRoot(open_store(f"file://{tmp_path}/root"))
    records = {run_id: record for run_id, record, _ in fresh.iter_runs()}
    for manifest in built:
        record = records[manifest.run_id]
        assert record is not None and record.status == "succeeded" and record.published_at is not None
        assert fresh.read_manifest(record.manifest_ref or "") == manifest
    pointer = fresh.current()
    assert pointer is not None and pointer.run_id == built[-1].run_id
    assert fresh.read_manifest(pointer) == built[-1]
    assert not failures
