"""Metadata benchmark (SPEC §17): a delta costs its change in metadata too. Pure core, no Spark.

Synthetic roots on the local file store (``file://`` under a temp dir), built through the writer's
own model (``tests/snapshot_factory.py``): full manifests of ``ShardEntry`` / ``ShardFile``, deltas
from ``LayerResult`` through ``core.write.delta.chain_shards`` as format-3 chain documents, compactions as
the driver writes them, each published in the writer's order (run record, manifest, record
succeeded, ``_CURRENT`` moved, ``published_at``) through core. Shard entries name SST files that
are never written: nothing measured here opens a shard.

1. A delta touching 1 % of the shards, on a full base of 1k, 10k and 99,999 shards (the most a
   root can hold: shard folders have five digits; "100k" below): stored manifest
   bytes / the bytes of its own shard entries (each entry in the stored encoding) ≤ 2.
2. A chain of depth 16 on 1k and 10k shards: ``ShardedReader.refresh()`` from depth 15 to 16 versus
   a fresh ``ShardedReader`` on depth 16 (median of ``--repeat`` readers each): manifests read
   (every ``get`` of a ``manifests/`` object by any ``LocalStore``) and decoded (every
   ``parse_manifest_bytes``), and time: refresh ≤ 0.05× the fresh open, reading one manifest.
3. The 100k-shard full manifest: bytes → validated ``Manifest`` (``Manifest.from_bytes``) versus
   ``json.loads`` of the same bytes (in turns, best of ``max(--repeat, 9)`` each) ≤ 2×.
4. A root of ``--runs`` runs on ``--cleanup-shards`` shards: a full run, then deltas touching 1 % of
   the shards each, compacted whenever the live chain is ``--chain-depth`` deep (what
   ``max_chain_depth`` does). ``core.lifecycle.cleanup.make_plan`` over it (keep_runs 3, one day later, so
   every older run is a candidate) in a child process doing nothing else: its time ≤ 30 s and its
   peak RSS (``VmHWM`` of the whole child, interpreter and imports included) ≤ 2 GiB.
5. On that root, the history app's roots and timeline pages (``ui.app.HistorySource`` data +
   ``ui.render``, the routes' bodies, without Airflow or HTTP), each on a fresh ``SnapshotRoot`` as
   a request opens it (median of ``--repeat``): ≤ 2 s each.

Every manifest written is read back and compared with the one the writer built (exact equality);
a mismatch is a correctness error. Prints ONE JSON line on stdout; progress on stderr. Exit status
1 if a correctness check failed (the JSON line is printed all the same). ``--quick``: 1k and 10k
shards, decode at 10k, chains on 1k, 200 runs on 1k shards.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import snapshot_factory
from snapshot_factory import metadata_chain_manifest, metadata_full_manifest, publish_metadata_run

import airflow_provider_shardyfusion
from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model import chain as chain_module
from airflow_provider_shardyfusion.core.model import routing
from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum
from airflow_provider_shardyfusion.core.model.manifest import Manifest
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot, forget_decoded_manifests
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.core.storage.local import LocalStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_shardyfusion.core.model.snapshot import ManifestRef

# SPEC §17 targets
DELTA_MANIFEST_MAX = 2.0  # stored manifest bytes / bytes of its own shard entries
REFRESH_MAX = 0.05  # refresh() along the chain / fresh open
DECODE_MAX = 2.0  # Manifest.from_bytes / json.loads, 100k shards
CLEANUP_S_MAX = 30.0
CLEANUP_RSS_MAX = 2 << 30
PAGE_S_MAX = 2.0
DELTA_PCT = 1.0
DECODE_TURNS = 9  # figure 3: turns of json.loads / from_bytes, best of each


def _log(msg: str) -> None:
    print(f"[bench_metadata] {msg}", file=sys.stderr, flush=True)


def _target(value: float, limit: float, digits: int = 3) -> dict[str, Any]:
    return {"value": round(value, digits), "max": limit, "pass": value <= limit}


@contextlib.contextmanager
def counting_manifest_io() -> Iterator[dict[str, int]]:
    """Count, for every ``LocalStore`` (a reader opens its own), gets of ``manifests/`` objects and
    manifest documents decoded (``core.model.chain.parse_manifest_bytes``, which every read path calls)."""
    counts = {"read": 0, "decoded": 0}
    get, parse = LocalStore.get, chain_module.parse_manifest_bytes

    def counted_get(self: LocalStore, key: str) -> Any:
        if key.startswith(layout.MANIFESTS_DIR + "/"):
            counts["read"] += 1
        return get(self, key)

    def counted_parse(where: str, data: bytes) -> Manifest:
        counts["decoded"] += 1
        return parse(where, data)

    LocalStore.get = counted_get  # type: ignore[method-assign]
    chain_module.parse_manifest_bytes = counted_parse
    try:
        yield counts
    finally:
        LocalStore.get = get  # type: ignore[method-assign]
        chain_module.parse_manifest_bytes = parse


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


class ChainBuilder:
    """One root: a full run, then runs on the live one (deltas of 1 % of the shards, compacted at
    ``max_depth``), each published and read back; run ``i`` started ``i`` minutes after the first."""

    def __init__(self, root: str, num_dbs: int, *, max_depth: int, seed: int, check: Callable[[bool, str], None]):
        self.snapshots = SnapshotRoot(open_store(root))
        self.num_dbs, self.max_depth, self.check = num_dbs, max_depth, check
        self.rng = random.Random(seed)
        self.t0 = layout.utc_now() - timedelta(days=30)
        self.runs = 0
        self.live: Manifest | None = None
        self.live_ref: ManifestRef | None = None
        self.live_checksum = ""

    def next_run(self, *, read_back: bool = True) -> Manifest:
        store, i = self.snapshots.store, self.runs
        started = self.t0 + timedelta(minutes=i)
        run_id = f"{started:%Y%m%dT%H%M%SZ}-{i:08x}"
        if self.live is None or self.live_ref is None:
            manifest = metadata_full_manifest(store, run_id, self.num_dbs, started_at=started)
        else:
            compact = self.live.chain_depth >= self.max_depth
            changed = [] if compact else self.rng.sample(range(self.num_dbs), max(1, round(self.num_dbs * DELTA_PCT / 100)))
            manifest = metadata_chain_manifest(store, self.live, self.live_ref.uri, self.live_checksum, run_id, changed,
                                               compact=compact, started_at=started)
        ref = publish_metadata_run(self.snapshots, manifest)
        self.live, self.live_ref, self.runs = manifest, ref, i + 1
        self.live_checksum = bytes_checksum(store.get(ref.key).data)
        if read_back:
            self.check(self.snapshots.read_manifest(ref) == manifest, f"run {run_id}: manifest read back differs")
        return manifest


def entry_bytes(manifest: Manifest) -> int:
    """Bytes of the shard entries a manifest stores, each in the stored encoding (compact, sorted keys)."""
    return sum(len(json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":")))
               for s in manifest.stored_document().shards)


def delta_manifest_figure(work: Path, num_dbs: int, check: Callable[[bool, str], None]) -> tuple[dict[str, Any], bytes]:
    """Figure 1 on a full base of ``num_dbs`` shards; also returns the base manifest's bytes (figure 3)."""
    builder = ChainBuilder(f"file://{work}/delta-{num_dbs}", num_dbs, max_depth=16, seed=num_dbs, check=check)
    base_s, _ = timed(lambda: builder.next_run(read_back=False))
    base_bytes = builder.snapshots.store.get(builder.live_ref.key).data  # type: ignore[union-attr]
    delta_s, delta = timed(builder.next_run)
    data = builder.snapshots.store.get(builder.live_ref.key).data  # type: ignore[union-attr]
    check(Manifest.from_bytes(data) == delta.stored_document(), f"{num_dbs} shards: stored chain document differs")
    entries = entry_bytes(delta)
    _log(f"delta on {num_dbs} shards: manifest {len(data)} bytes, entries {entries} bytes "
         f"(base written in {base_s:.1f}s, delta in {delta_s:.1f}s)")
    figure = {"num_dbs": num_dbs, "shards_changed": len(delta.stored_document().shards),
              "base_manifest_bytes": len(base_bytes), "manifest_bytes": len(data), "entry_bytes": entries,
              **_target(len(data) / entries, DELTA_MANIFEST_MAX)}
    return figure, base_bytes


def decode_figure(data: bytes, repeat: int, check: Callable[[bool, str], None]) -> dict[str, Any]:
    """Figure 3, timed fairly to both sides: in turns (``json.loads``, then ``from_bytes``, each
    turn under the same machine load, which a shared runner varies from second to second), each
    call after a ``gc.collect()`` with its result dropped (so neither pays a full collection of the
    other's garbage or of the roots this process built before: a collection's cost grows with the
    whole heap, not with the document), best of ``max(--repeat, DECODE_TURNS)`` turns each."""
    manifest = Manifest.from_bytes(data)
    check(manifest.to_bytes() == data, "decoded full manifest does not encode back to its bytes")
    num_dbs, shards = manifest.num_dbs, len(manifest.shards)
    del manifest
    json_s = decode_s = float("inf")
    for _ in range(max(repeat, DECODE_TURNS)):
        gc.collect()
        json_s = min(json_s, timed(lambda: json.loads(data))[0])
        gc.collect()
        decode_s = min(decode_s, timed(lambda: Manifest.from_bytes(data))[0])
    _log(f"decode {shards} shards ({len(data)} bytes): {decode_s:.3f}s vs json.loads {json_s:.3f}s")
    return {"num_dbs": num_dbs, "manifest_bytes": len(data), "from_bytes_s": round(decode_s, 3),
            "json_loads_s": round(json_s, 3), **_target(decode_s / json_s, DECODE_MAX)}


def chain_figure(work: Path, num_dbs: int, depth: int, repeat: int, check: Callable[[bool, str], None]) -> dict[str, Any]:
    """Figure 2: readers on depth ``depth - 1`` refresh to ``depth``, versus fresh readers on ``depth``."""
    root = f"file://{work}/chain-{num_dbs}"
    builder = ChainBuilder(root, num_dbs, max_depth=depth, seed=num_dbs + 1, check=check)
    build_s, _ = timed(lambda: [builder.next_run() for _ in range(depth)])
    followers = [ShardedReader(root) for _ in range(repeat)]
    newest = builder.next_run()
    check(newest.chain_depth == depth, f"chain on {num_dbs} shards is {newest.chain_depth} deep, not {depth}")
    refreshes = []
    for reader in followers:
        with counting_manifest_io() as counts:
            s, swapped = timed(reader.refresh)
        check(swapped and reader.manifest == newest, f"{num_dbs} shards: refresh did not load the new run exactly")
        refreshes.append((s, dict(counts)))
        reader.close()
    opens = []
    for _ in range(repeat):
        forget_decoded_manifests()  # a fresh process: nothing of the chain decoded yet
        with counting_manifest_io() as counts:
            s, reader = timed(lambda: ShardedReader(root))
        check(reader.manifest == newest, f"{num_dbs} shards: fresh reader's manifest differs")
        reader.close()
        opens.append((s, dict(counts)))
    refresh_s = statistics.median(s for s, _ in refreshes)
    open_s = statistics.median(s for s, _ in opens)
    _log(f"chain depth {depth} on {num_dbs} shards (built in {build_s:.1f}s): refresh {refresh_s:.3f}s "
         f"{refreshes[0][1]}, fresh open {open_s:.3f}s {opens[0][1]}")
    return {"num_dbs": num_dbs, "depth": depth, "refresh_s": round(refresh_s, 4), "fresh_open_s": round(open_s, 4),
            "refresh_manifests_read": refreshes[0][1]["read"], "refresh_manifests_decoded": refreshes[0][1]["decoded"],
            "fresh_manifests_read": opens[0][1]["read"], "fresh_manifests_decoded": opens[0][1]["decoded"],
            # decoded 0: the builder, in this same process, decoded the new run already when it published it.
            "refresh_reads_one_manifest": all(c["read"] == 1 and c["decoded"] <= 1 for _, c in refreshes),
            **_target(refresh_s / open_s, REFRESH_MAX)}


def peak_rss_bytes() -> int:
    """This process's peak RSS: ``VmHWM``, which an exec resets (Linux's ``ru_maxrss`` keeps the
    parent's high-water mark across fork and exec); ``ru_maxrss`` where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cleanup_child(root: str, now: str) -> int:
    """``make_plan`` alone in this process: its time and this process's peak RSS."""
    from airflow_provider_shardyfusion.core.lifecycle.cleanup import make_plan

    rss_before = peak_rss_bytes()
    plan_s, plan = timed(lambda: make_plan(SnapshotRoot(open_store(root)), now=layout.parse_ts(now), keep_runs=3))
    rules: dict[str, int] = {}
    for rule in plan.decided_by.values():
        rules[rule] = rules.get(rule, 0) + 1
    print(json.dumps({"plan_s": round(plan_s, 3), "peak_rss_bytes": peak_rss_bytes(),
                      "peak_rss_before_plan_bytes": rss_before, "runs_by_rule": rules, "totals": plan.totals()}))
    return 0


def cleanup_figure(root: str) -> dict[str, Any]:
    here = [str(Path(snapshot_factory.__file__).parent), str(Path(airflow_provider_shardyfusion.__file__).parent.parent)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*here, os.environ.get("PYTHONPATH", "")]))
    now = layout.format_ts(layout.utc_now() + timedelta(days=1))
    out = subprocess.run([sys.executable, __file__, "--cleanup-child", root, now], env=env, check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    _log(f"cleanup plan: {result['plan_s']}s, peak RSS {result['peak_rss_bytes'] >> 20} MiB, {result['runs_by_rule']}")
    return result


def history_figure(root: str, repeat: int) -> dict[str, Any]:
    from airflow_provider_shardyfusion.ui import render
    from airflow_provider_shardyfusion.ui.app import HistorySource

    def no_reader(uri: str, ref: str) -> Any:
        raise AssertionError("the roots and timeline pages open no shard")

    source = HistorySource(roots=lambda: [root], open_root=lambda uri: SnapshotRoot(open_store(uri)), open_reader=no_reader)
    pages = {
        "roots": lambda: render.roots_page(source.roots_data()),
        "timeline": lambda: render.timeline_page(source.history(source.known(root)).to_dict()),
    }
    out: dict[str, Any] = {}
    for name, page in pages.items():
        times, html = [], ""
        for _ in range(repeat):
            forget_decoded_manifests()  # each page as the first request of a new API server
            with counting_manifest_io() as counts:
                s, html = timed(page)
            times.append(s)
        out[name] = {"s": round(statistics.median(times), 3), "html_bytes": len(html), "manifests_read": counts["read"]}
        _log(f"{name} page: {out[name]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delta-shards", default=f"1000,10000,{routing.MAX_NUM_DBS}",
                    help="figure 1: base sizes, comma-separated (the largest stands for 100k: shard folders have "
                         "five digits)")
    ap.add_argument("--decode-shards", type=int, default=None,
                    help="figure 3: a base of figure 1 (default: the largest)")
    ap.add_argument("--chain-shards", default="1000,10000", help="figure 2: shard counts, comma-separated")
    ap.add_argument("--chain-depth", type=int, default=16, help="figure 2's depth and the compaction depth of figure 4")
    ap.add_argument("--runs", type=int, default=1000, help="figures 4 and 5: runs in the root")
    ap.add_argument("--cleanup-shards", type=int, default=10_000, help="figures 4 and 5: shards per run")
    ap.add_argument("--repeat", type=int, default=3, help="readers / decodes / page loads timed per figure")
    ap.add_argument("--quick", action="store_true", help="1k and 10k shards, chains on 1k, 200 runs on 1k shards")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--cleanup-child", nargs=2, metavar=("ROOT", "NOW"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cleanup_child:
        return cleanup_child(*args.cleanup_child)
    if args.quick:
        args.delta_shards, args.chain_shards, args.runs, args.cleanup_shards = "1000,10000", "1000", 200, 1000
    delta_sizes = [int(n) for n in args.delta_shards.split(",")]
    decode_at = args.decode_shards or max(delta_sizes)
    if decode_at not in delta_sizes:
        ap.error("--decode-shards must be one of --delta-shards")

    started = time.perf_counter()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardyfusion-bench-metadata-"))
    work.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            errors.append(what)
            _log(f"CHECK FAILED: {what}")

    phases: dict[str, float] = {}
    t = time.perf_counter()
    deltas, decode = [], None
    for n in delta_sizes:
        figure, base_bytes = delta_manifest_figure(work, n, check)
        deltas.append(figure)
        if n == decode_at:
            decode = decode_figure(base_bytes, args.repeat, check)
        del base_bytes
    phases["delta_manifests_and_decode_s"] = time.perf_counter() - t

    t = time.perf_counter()
    chains = [chain_figure(work, int(n), args.chain_depth, args.repeat, check) for n in args.chain_shards.split(",")]
    phases["chains_s"] = time.perf_counter() - t

    t = time.perf_counter()
    big = ChainBuilder(f"file://{work}/runs", args.cleanup_shards, max_depth=args.chain_depth, seed=7, check=check)
    for i in range(args.runs):
        # Read back every run near the end and a sample before: the build, not the figure, pays for it.
        big.next_run(read_back=i % 50 == 0 or i >= args.runs - args.chain_depth)
        if i % 100 == 99:
            _log(f"root of {args.runs} runs: {i + 1} published ({time.perf_counter() - t:.0f}s)")
    phases["build_runs_root_s"] = time.perf_counter() - t
    live = big.live
    assert live is not None
    kinds = {"full": 0, "delta": 0, "compact": 0}
    for ref in big.snapshots.list_manifests():
        kinds[Manifest.from_bytes(big.snapshots.store.get(ref.key).data).write_mode] += 1
    manifests_bytes = sum(o.size for o in big.snapshots.store.list(layout.MANIFESTS_DIR + "/"))
    t = time.perf_counter()
    cleanup = cleanup_figure(big.snapshots.root)
    history = history_figure(big.snapshots.root, args.repeat)
    phases["cleanup_and_pages_s"] = time.perf_counter() - t
    shutil.rmtree(work, ignore_errors=True)

    targets: dict[str, Any] = {}
    for f in deltas:
        targets[f"delta_manifest_le_{DELTA_MANIFEST_MAX:g}x_entries_{f['num_dbs']}"] = \
            {k: f[k] for k in ("value", "max", "pass")}
    for f in chains:
        targets[f"refresh_depth{f['depth']}_le_{REFRESH_MAX:g}x_fresh_open_{f['num_dbs']}"] = \
            {k: f[k] for k in ("value", "max", "pass")}
        targets[f"refresh_depth{f['depth']}_reads_one_manifest_{f['num_dbs']}"] = \
            {"value": f["refresh_manifests_read"], "max": 1, "pass": f["refresh_reads_one_manifest"]}
    if decode is not None:
        targets[f"decode_le_{DECODE_MAX:g}x_json_loads_{decode['num_dbs']}"] = \
            {k: decode[k] for k in ("value", "max", "pass")}
    runs_root = f"{args.runs}_runs_x_{args.cleanup_shards}"
    targets[f"cleanup_plan_le_{CLEANUP_S_MAX:g}s_{runs_root}"] = _target(cleanup["plan_s"], CLEANUP_S_MAX)
    targets[f"cleanup_plan_peak_rss_le_2GiB_{runs_root}"] = {
        "value": cleanup["peak_rss_bytes"], "max": CLEANUP_RSS_MAX, "pass": cleanup["peak_rss_bytes"] <= CLEANUP_RSS_MAX}
    for name in ("roots", "timeline"):
        targets[f"{name}_page_le_{PAGE_S_MAX:g}s_{args.runs}_runs"] = _target(history[name]["s"], PAGE_S_MAX)

    result = {
        "benchmark": "metadata", "quick": args.quick,
        "shard_files": "absent: shard entries name SST files never written; nothing measured opens a shard, and "
                       "cleanup's listing of shards/ is empty (it lists run records and manifests only)",
        "delta_manifest": deltas, "chain_refresh": chains, "decode": decode,
        "runs_root": {
            "runs": args.runs, "num_dbs": args.cleanup_shards, "delta_pct_of_shards": DELTA_PCT,
            "compacted_at_depth": args.chain_depth, "manifests": kinds, "manifests_bytes": manifests_bytes,
            "live_run": live.run_id, "live_chain_depth": live.chain_depth,
        },
        "cleanup": {**cleanup, "how": "core.lifecycle.cleanup.make_plan(keep_runs=3, now=+1 day) in a child process; peak RSS "
                                      "is that process's VmHWM (interpreter and imports included)"},
        "history_pages": {**history, "how": "ui.app.HistorySource data + ui.render HTML on a fresh SnapshotRoot, "
                                            "no Airflow, no HTTP; median of --repeat"},
        "targets": targets,
        "correctness": {"ok": not errors, "errors": errors[:10]},
        "phases_s": {k: round(v, 1) for k, v in phases.items()}, "elapsed_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return 0 if not errors else 1

if __name__ == "__main__":
    raise SystemExit(main())
