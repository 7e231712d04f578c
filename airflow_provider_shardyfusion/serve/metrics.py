"""``GET /metrics``: a small Prometheus text exposition (format 0.0.4) of the server's counters.

The server's own counters (requests by route and status, keys asked and found) and, read at each
scrape, the reader's state: its health, the served run's age, shards open, the bytes cached and
what the cache downloaded. Each worker process counts its own requests and every series carries
its label ``pid``: a counter stays monotonic per series, and ``sum()`` over ``pid`` is the
server's. One worker's state is a ``WorkerMetrics``; ``render`` writes those of all workers as one
exposition (with ``--workers N``, ``serve.worker_metrics`` brings the other workers' states).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.serve.readiness import unready_reason

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

__all__ = ["Family", "Sample", "ServeMetrics", "WorkerMetrics", "render"]

_STATUS = {"healthy": 0, "degraded": 1, "unhealthy": 2}


@dataclass(frozen=True)
class Sample:
    """One series of a family: its labels (``pid`` apart, added by ``render``) and its value."""

    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Family:
    """A metric family: name, Prometheus type (``counter``, ``gauge``), help text and samples."""

    name: str
    kind: str
    help: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class WorkerMetrics:
    """What one worker process counted and saw, as of one moment."""

    pid: int
    families: tuple[Family, ...]


def render(workers: Iterable[WorkerMetrics]) -> str:
    """The exposition of ``workers``: each family once (as Prometheus requires), with every worker's
    samples labelled by its ``pid``, in the order the families first appear."""
    families: dict[str, tuple[Family, list[str]]] = {}
    for worker in workers:
        pid = f'pid="{worker.pid}"'
        for family in worker.families:
            _, lines = families.setdefault(family.name, (family, []))
            lines.extend(f"{family.name}{{{_labels(pid, s.labels)}}} {_number(s.value)}" for s in family.samples)
    out: list[str] = []
    for name, (family, lines) in families.items():
        out += [f"# HELP {name} {family.help}", f"# TYPE {name} {family.kind}", *lines]
    return "\n".join(out) + "\n"


class ServeMetrics:
    """Counters one worker keeps; ``snapshot(reader)`` reads them with the reader's gauges (``render``
    writes it out)."""

    def __init__(self, *, max_staleness_s: float | None = None) -> None:
        self._max_staleness_s = max_staleness_s
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._keys = 0
        self._found = 0
        self.pid = os.getpid()

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self._requests[route, status] = self._requests.get((route, status), 0) + 1

    def keys(self, asked: int, found: int) -> None:
        with self._lock:
            self._keys += asked
            self._found += found

    def snapshot(self, reader: ShardedReader | None) -> WorkerMetrics:
        families: list[Family] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
            families.append(Family(name, kind, help_text,
                                   tuple(Sample(tuple(labels.items()), float(value)) for labels, value in samples)))

        with self._lock:
            requests = sorted(self._requests.items())
            asked, found = self._keys, self._found
        family("shardyfusion_serve_requests_total", "counter", "HTTP requests answered, by route and status.",
               [({"route": route, "code": str(status)}, n) for (route, status), n in requests])
        family("shardyfusion_serve_keys_total", "counter", "Keys looked up (GET and multi_get).", [({}, asked)])
        family("shardyfusion_serve_keys_found_total", "counter", "Keys looked up and found.", [({}, found)])
        if reader is None:
            family("shardyfusion_serve_ready", "gauge", "1 when /readyz answers 200.", [({}, 0)])
            return WorkerMetrics(self.pid, tuple(families))
        health = reader.health()
        run = {"run_id": health.run_id or ""}
        family("shardyfusion_serve_ready", "gauge", "1 when /readyz answers 200.",
               [({}, int(unready_reason(health, self._max_staleness_s) is None))])
        family("shardyfusion_reader_status", "gauge", "Reader health: 0 healthy, 1 degraded, 2 unhealthy.",
               [(run, _STATUS.get(health.status, 2))])
        family("shardyfusion_reader_snapshot_age_seconds", "gauge", "Seconds since the served run went live.",
               [(run, health.age_s or 0.0)])
        family("shardyfusion_reader_last_check_failed", "gauge", "1 when the last check of _CURRENT failed.",
               [({}, int(health.last_error is not None))])
        family("shardyfusion_reader_shards_open", "gauge", "Shard databases open.", [({}, health.shards_open)])
        family("shardyfusion_reader_cache_bytes", "gauge", "Bytes of the served run's shards in the cache.",
               [({}, health.cache_bytes)])
        for name, value in sorted(reader.cache_stats.items()):
            family(f"shardyfusion_reader_cache_{name}_total", "counter", f"The reader's cache: {name.replace('_', ' ')}.",
                   [({}, value)])
        return WorkerMetrics(self.pid, tuple(families))


def _labels(pid: str, labels: tuple[tuple[str, str], ...]) -> str:
    return ",".join([pid, *(f'{name}="{_escape(value)}"' for name, value in labels)])


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
