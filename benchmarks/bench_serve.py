"""Serving benchmark (SPEC §19): look-ups as a service makes them, from many concurrent callers.

Builds (untimed, without Spark, as ``bench_read`` does) a snapshot of ``--keys`` int keys with
~``--value-bytes`` values in ``--shards`` shards on a local ``file://`` root, opens every shard
once (warm), then measures with 1, 8 and 32 concurrent callers, each over ``--lookups`` random
existing keys in all:

- ``get``: in-process ``ShardedReader.get`` from that many threads;
- ``async_get``: ``await AsyncShardedReader.get`` from that many coroutines on one event loop
  (the reader's pool of ``--max-workers`` threads does the reads);
- ``multi_get``: in-process ``ShardedReader.multi_get`` of ``BATCH`` keys from that many threads,
  measured in turn with ``http_multi_get`` (``PAIRED_ROUNDS`` rounds each; the median round's figures,
  all rounds' keys/s in ``keys_per_s_rounds``) so that their ratio is taken under the same load;
- ``http_get`` / ``http_multi_get``: the same look-ups through ``shardyfusion serve --workers 2`` on
  loopback (``GET /v1/keys/{key}``; ``POST /v1/multi_get`` of ``BATCH`` keys), one keep-alive
  connection per client thread, the requests encoded before the clock starts, each answer parsed
  (httptools) and checked; ``http_multi_get_over_in_process`` is the keys/s ratio (target
  ≥ ``HTTP_RATIO_TARGET``). The clients are Python threads on the same host as the server: their
  own cost (kept small, see ``_Connection``) is in the figures;
- ``follow_latency``: a follower (``follow_interval_s``) over ``--follow-shards`` shards (1000 by
  default) with every shard open, as a busy service has them; a run is published (``_CURRENT``
  moved) and the time until the follower serves it is measured, with no call from the user but
  reads, for a delta changing a few keys (``delta``) and for a full run (``full``: every shard is
  built again). Target: ≤ interval + 2 s.

Each gives keys/s (keys looked up over the wall time of the round) and the p50/p99 latency of one
call in µs (a call of ``BATCH`` keys for the multi_gets). One function per measurement; ``main()``
prints ONE JSON line on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import httptools
import msgspec
from processes import free_port, stop_process
from snapshot_factory import build_delta, build_snapshot, keys_by_shard, publish_current

from airflow_provider_shardyfusion.core.read.async_reader import DEFAULT_MAX_WORKERS, AsyncShardedReader
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store

if TYPE_CHECKING:
    from collections.abc import Callable

CONCURRENCY = (1, 8, 32)
FOLLOW_SLACK_S = 2.0  # SPEC §19: publish → served within the interval + 2 s
BATCH = 100  # keys per multi_get
HTTP_WORKERS = 2
HTTP_RATIO_TARGET = 0.3  # SPEC §19: HTTP multi_get keys/s ≥ 0.3 × in-process multi_get
PAIRED_ROUNDS = 3  # in-process and HTTP multi_get rounds taken in turn, per concurrency

_encode_json = msgspec.json.encode
_decode_answer = msgspec.json.decode


def _log(msg: str) -> None:
    print(f"[bench_serve] {msg}", file=sys.stderr, flush=True)


def _value(key: int, size: int) -> bytes:
    head = b"%020d|" % key
    return (head * (size // len(head) + 1))[:size]


def _figures(latencies_ns: list[int], wall_s: float, keys_per_call: int = 1) -> dict[str, float]:
    ordered = sorted(latencies_ns)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1000.0, 3)

    return {"keys_per_s": round(len(ordered) * keys_per_call / wall_s), "p50_us": pct(0.50), "p99_us": pct(0.99)}


def _threads(work: Callable[[list[Any], list[int]], None], items: list[Any], callers: int) -> tuple[list[int], float]:
    """Run ``work(part, latencies)`` in ``callers`` threads started together: all latencies, wall seconds."""
    parts = _split(items, callers)
    latencies: list[list[int]] = [[] for _ in parts]
    start_line = threading.Barrier(callers + 1)

    def caller(mine: list[Any], out: list[int]) -> None:
        start_line.wait()
        work(mine, out)

    threads = [threading.Thread(target=caller, args=(p, out)) for p, out in zip(parts, latencies, strict=True)]
    for t in threads:
        t.start()
    start_line.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return [ns for out in latencies for ns in out], time.perf_counter() - t0


def _batches(keys: list[int]) -> list[list[int]]:
    return [keys[i:i + BATCH] for i in range(0, len(keys) - BATCH + 1, BATCH)]


def _split(keys: list[int], callers: int) -> list[list[int]]:
    return [keys[i::callers] for i in range(callers)]


def measure_get(reader: ShardedReader, keys: list[int], callers: int) -> dict[str, float]:
    """In-process ``get`` from ``callers`` threads, each timing its own calls."""

    def work(mine: list[int], out: list[int]) -> None:
        clock, get = time.perf_counter_ns, reader.get
        for key in mine:
            t0 = clock()
            get(key)
            out.append(clock() - t0)

    return _figures(*_threads(work, keys, callers))


def measure_multi_get(reader: ShardedReader, keys: list[int], callers: int) -> dict[str, float]:
    """In-process ``multi_get`` of ``BATCH`` keys from ``callers`` threads."""

    def work(mine: list[list[int]], out: list[int]) -> None:
        clock, multi_get = time.perf_counter_ns, reader.multi_get
        for batch in mine:
            t0 = clock()
            multi_get(batch)
            out.append(clock() - t0)

    latencies, wall = _threads(work, _batches(keys), callers)
    return _figures(latencies, wall, BATCH)


class _Answer:
    """httptools' callbacks for one response: its body, and whether it is complete."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    """One keep-alive HTTP/1.1 connection to the server, sending requests prepared beforehand.

    A socket and httptools' C parser rather than ``http.client``: its header parsing (``email``)
    and buffered reads cost the client ~250 µs of CPU per call against ~60 µs here, more than the
    server's read of 100 keys, on cores the clients share with the server. What a service's client
    in Java or Go pays is nearer the latter; the server's work is what is measured.
    """

    def __init__(self, port: int):
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request`` (whole, as ``_request`` gives it); the answer's status and body."""
        self._sock.sendall(request)
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        while not answer.complete:
            data = self._sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection mid-answer")
            parser.feed_data(data)
        return parser.get_status_code(), b"".join(answer.body)

    def close(self) -> None:
        self._sock.close()


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _http_round(port: int, requests: list[bytes], callers: int, check: Callable[[int, bytes], None]) -> tuple[list[int], float]:
    """``requests`` from ``callers`` threads, one keep-alive connection each (opened before the clock
    starts), every answer checked by ``check`` after its latency is taken."""
    connections = [_Connection(port) for _ in range(callers)]
    free = list(connections)

    def work(mine: list[bytes], out: list[int]) -> None:
        conn, clock = free.pop(), time.perf_counter_ns  # list.pop is atomic: one connection per thread
        for request in mine:
            t0 = clock()
            status, body = conn.call(request)
            out.append(clock() - t0)
            check(status, body)

    try:
        return _threads(work, requests, callers)
    finally:
        for conn in connections:
            conn.close()


def measure_http_get(port: int, keys: list[int], callers: int) -> dict[str, float]:
    """``GET /v1/keys/{key}`` from ``callers`` threads, one keep-alive connection each."""

    def check(status: int, body: bytes) -> None:
        if status != 200:
            raise RuntimeError(f"GET /v1/keys/...: HTTP {status}: {body[:200]!r}")

    return _figures(*_http_round(port, [_request("GET", f"/v1/keys/{key}") for key in keys], callers, check))


def measure_http_multi_get(port: int, keys: list[int], callers: int) -> dict[str, float]:
    """``POST /v1/multi_get`` of ``BATCH`` keys from ``callers`` threads, one keep-alive connection each."""

    def check(status: int, body: bytes) -> None:
        if status != 200 or len(_decode_answer(body)["values"]) != BATCH:
            raise RuntimeError(f"POST /v1/multi_get: HTTP {status}: {body[:200]!r}")

    requests = [_request("POST", "/v1/multi_get", _encode_json({"keys": batch})) for batch in _batches(keys)]
    return _figures(*_http_round(port, requests, callers, check), BATCH)


def start_server(root: str, cache: str, log_path: str, workers: int = HTTP_WORKERS) -> tuple[subprocess.Popen, int]:
    """``shardyfusion serve ROOT --workers N`` on a free loopback port, once ``/readyz`` says 200."""
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115  # the child's output, closed with the file by the OS at exit
    proc = subprocess.Popen([sys.executable, "-m", "airflow_provider_shardyfusion", "serve", root, "--port", str(port),
                             "--workers", str(workers), "--cache-dir", cache, "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log_path}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    stop_process(proc)
    raise RuntimeError(f"the server was not ready within 120 s; see {log_path}")


def measure_async_get(reader: AsyncShardedReader, keys: list[int], callers: int) -> dict[str, float]:
    """``await AsyncShardedReader.get`` from ``callers`` coroutines on one event loop."""
    parts = _split(keys, callers)

    async def caller(mine: list[int], out: list[int]) -> None:
        clock, get = time.perf_counter_ns, reader.get
        for key in mine:
            t0 = clock()
            await get(key)
            out.append(clock() - t0)

    async def round_() -> tuple[list[int], float]:
        latencies: list[list[int]] = [[] for _ in parts]
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(p, out) for p, out in zip(parts, latencies, strict=True)))
        return [ns for out in latencies for ns in out], time.perf_counter() - t0

    latencies, wall = asyncio.run(round_())
    return _figures(latencies, wall)


def _by_concurrency(measure: Callable[[Any, list[int], int], dict[str, float]], reader: Any,
                    keys: list[int]) -> dict[str, dict[str, float]]:
    out = {}
    for callers in CONCURRENCY:
        _log(f"{measure.__name__}: {callers} caller(s), {len(keys)} look-ups")
        measure(reader, keys[:max(1000, BATCH * callers)], callers)  # warm the threads, the loop, the workers
        out[str(callers)] = measure(reader, keys, callers)
    return out


def multi_get_side_by_side(reader: ShardedReader, port: int, keys: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """In-process and HTTP ``multi_get`` at each concurrency, ``PAIRED_ROUNDS`` rounds of each taken in
    turn; each side's round of median keys/s. Taken apart (minutes apart, as the other measurements
    are), a change in the shared machine's load moved the ratio more than the server did."""
    in_process: dict[str, Any] = {}
    over_http: dict[str, Any] = {}
    for callers in CONCURRENCY:
        _log(f"multi_get in-process and over HTTP, side by side: {callers} caller(s), {len(keys)} look-ups")
        warm = keys[:max(1000, BATCH * callers)]  # the threads, the connections, the workers
        measure_multi_get(reader, warm, callers)
        measure_http_multi_get(port, warm, callers)
        rounds: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
        for _ in range(PAIRED_ROUNDS):
            rounds[0].append(measure_multi_get(reader, keys, callers))
            rounds[1].append(measure_http_multi_get(port, keys, callers))
        in_process[str(callers)], over_http[str(callers)] = (_median_round(r) for r in rounds)
    return in_process, over_http


def _median_round(rounds: list[dict[str, float]]) -> dict[str, Any]:
    ordered = sorted(rounds, key=lambda r: r["keys_per_s"])
    return {**ordered[len(ordered) // 2], "keys_per_s_rounds": [r["keys_per_s"] for r in rounds]}


def _served_after(reader: ShardedReader, key: int, value: bytes, since: float, deadline_s: float) -> float:
    """Seconds from ``since`` until ``reader.get(key) == value``, reading as a service would (no refresh)."""
    while time.monotonic() - since < deadline_s:
        if reader.get(key) == value:
            return time.monotonic() - since
        time.sleep(0.005)
    raise TimeoutError(f"the follower did not serve the new run within {deadline_s}s")


def follow_latency(shards: int, interval_s: float, rounds: int) -> dict[str, Any]:
    """Publish → served, for deltas and full runs on a follower holding every shard open."""
    keys = keys_by_shard(shards, 2)
    probe = [shard_keys[0] for shard_keys in keys.values()]  # one key a shard: opens every shard
    out: dict[str, Any] = {"shards": shards, "follow_interval_s": interval_s, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = f"file://{tmp}/root"
        rows = [(k, b"v0") for shard_keys in keys.values() for k in shard_keys]
        started = time.monotonic()
        build_snapshot(root, rows, num_dbs=shards, run_id="r000", shard_layout="sst")
        out["build_s"] = round(time.monotonic() - started, 1)
        store = open_store(root)
        latencies: dict[str, list[float]] = {"delta": [], "full": []}
        with ShardedReader(root, follow_interval_s=interval_s, cache_dir=f"{tmp}/cache") as reader:
            reader.multi_get(probe)
            for n in range(1, rounds + 1):
                for kind in ("delta", "full"):
                    run_id = f"r{n:02d}{kind[0]}"
                    value = run_id.encode()
                    if kind == "delta":
                        built = build_delta(root, {probe[n % shards]: run_id}, run_id=run_id, publish=False)
                        key = probe[n % shards]
                    else:
                        built = build_snapshot(root, [(k, value) for k, _ in rows], num_dbs=shards, run_id=run_id,
                                               shard_layout="sst", publish=False)
                        key = probe[-1]
                    since = time.monotonic()
                    publish_current(store, built.manifest_key, run_id)
                    latencies[kind].append(_served_after(reader, key, value, since, deadline_s=120))
                    reader.multi_get(probe)  # every shard open again, as before the next publish
                    _log(f"{kind} {run_id}: served after {latencies[kind][-1]:.2f}s")
    target = interval_s + FOLLOW_SLACK_S
    for kind, values in latencies.items():
        out[f"{kind}_served_after_s"] = {"median": round(statistics.median(values), 3), "max": round(max(values), 3),
                                         "all": [round(v, 3) for v in values]}
        out[f"{kind}_within_interval_plus_2s"] = max(values) <= target
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--lookups", type=int, default=50_000, help="look-ups per round (split between callers)")
    parser.add_argument("--max-workers", type=int, default=DEFAULT_MAX_WORKERS, help="AsyncShardedReader's pool")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--follow-shards", type=int, default=1000)
    parser.add_argument("--follow-interval-s", type=float, default=1.0)
    parser.add_argument("--follow-rounds", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = f"file://{tmp}/snap"
        _log(f"building {args.keys} keys in {args.shards} shards")
        t0 = time.perf_counter()
        build_snapshot(root, ((k, _value(k, args.value_bytes)) for k in range(args.keys)), num_dbs=args.shards,
                       work_dir=os.path.join(tmp, "work"))
        build_s = time.perf_counter() - t0
        rng = random.Random(args.seed)
        keys = [rng.randrange(args.keys) for _ in range(args.lookups)]
        cache = os.path.join(tmp, "cache")
        with ShardedReader(root, cache_dir=cache) as reader:
            reader.multi_get(list(range(min(args.keys, 10 * args.shards))))  # every shard open: warm
            assert all(reader.get(k) == _value(k, args.value_bytes) for k in keys[:100])
            sync = _by_concurrency(measure_get, reader, keys)

        async def open_async() -> AsyncShardedReader:
            return await AsyncShardedReader.open(root, cache_dir=cache, max_workers=args.max_workers)

        areader = asyncio.run(open_async())
        try:
            areader.reader.multi_get(list(range(min(args.keys, 10 * args.shards))))
            asynchronous = _by_concurrency(measure_async_get, areader, keys)
        finally:
            asyncio.run(areader.aclose())

        _log(f"serve --workers {HTTP_WORKERS} (shared cache {cache})")
        server, port = start_server(root, cache, os.path.join(tmp, "serve.log"))
        try:
            http_get = _by_concurrency(measure_http_get, port, keys)
            with ShardedReader(root, cache_dir=cache) as reader:  # the server's shared cache: nothing to build
                reader.multi_get(list(range(min(args.keys, 10 * args.shards))))
                in_process_multi, http_multi = multi_get_side_by_side(reader, port, keys)
        finally:
            stop_process(server, timeout=60)

    _log(f"follow latency on {args.follow_shards} shards, interval {args.follow_interval_s}s, "
         f"{args.follow_rounds} rounds")
    follow = follow_latency(args.follow_shards, args.follow_interval_s, args.follow_rounds)
    ratios = {c: round(http_multi[c]["keys_per_s"] / in_process_multi[c]["keys_per_s"], 3) for c in http_multi}
    result = {
        "benchmark": "serve",
        "keys": args.keys, "num_dbs": args.shards, "value_bytes": args.value_bytes, "lookups": args.lookups,
        "async_max_workers": args.max_workers,
        "get": sync,
        "async_get": asynchronous,
        "async_over_sync_keys_per_s": {c: round(asynchronous[c]["keys_per_s"] / sync[c]["keys_per_s"], 3) for c in sync},
        "batch": BATCH,
        "multi_get": in_process_multi,
        "http_workers": HTTP_WORKERS,
        "http_get": http_get,
        "http_multi_get": http_multi,
        "http_multi_get_over_in_process": ratios,
        "http_multi_get_ratio_target": HTTP_RATIO_TARGET,
        "http_multi_get_ratio_met": {c: r >= HTTP_RATIO_TARGET for c, r in ratios.items()},
        "follow": follow,
        "build_s": round(build_s, 1),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()
