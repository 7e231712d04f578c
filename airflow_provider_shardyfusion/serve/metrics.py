"""``GET /metrics``: a small Prometheus text exposition (format 0.0.4) of one worker's counters.

The server's own counters (requests by route and status, keys asked and found) and, read at each
scrape, the reader's state: its health, the served run's age, shards open, the bytes cached and
what the cache downloaded. Each worker process counts its own requests; every series carries the
label ``pid``, so a scrape that lands on one worker of several is labelled as such.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.serve.readiness import unready_reason

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

__all__ = ["ServeMetrics"]

_STATUS = {"healthy": 0, "degraded": 1, "unhealthy": 2}


class ServeMetrics:
    """Counters one worker keeps; ``exposition(reader)`` renders them with the reader's gauges."""

    def __init__(self, *, max_staleness_s: float | None = None) -> None:
        self._max_staleness_s = max_staleness_s
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._keys = 0
        self._found = 0
        self._pid = str(os.getpid())

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self._requests[route, status] = self._requests.get((route, status), 0) + 1

    def keys(self, asked: int, found: int) -> None:
        with self._lock:
            self._keys += asked
            self._found += found

    def exposition(self, reader: ShardedReader | None) -> str:
        pid = f'pid="{self._pid}"'
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{{{labels}}} {_number(value)}" for labels, value in samples)

        with self._lock:
            requests = sorted(self._requests.items())
            asked, found = self._keys, self._found
        family("shardyfusion_serve_requests_total", "counter", "HTTP requests answered, by route and status.",
               [(f'{pid},route="{route}",code="{status}"', n) for (route, status), n in requests])
        family("shardyfusion_serve_keys_total", "counter", "Keys looked up (GET and multi_get).", [(pid, asked)])
        family("shardyfusion_serve_keys_found_total", "counter", "Keys looked up and found.", [(pid, found)])
        if reader is None:
            family("shardyfusion_serve_ready", "gauge", "1 when /readyz answers 200.", [(pid, 0)])
            return "\n".join(lines) + "\n"
        health = reader.health()
        run = f'{pid},run_id="{_escape(health.run_id or "")}"'
        family("shardyfusion_serve_ready", "gauge", "1 when /readyz answers 200.",
               [(pid, int(unready_reason(health, self._max_staleness_s) is None))])
        family("shardyfusion_reader_status", "gauge", "Reader health: 0 healthy, 1 degraded, 2 unhealthy.",
               [(run, _STATUS.get(health.status, 2))])
        family("shardyfusion_reader_snapshot_age_seconds", "gauge", "Seconds since the served run went live.",
               [(run, health.age_s or 0.0)])
        family("shardyfusion_reader_last_check_failed", "gauge", "1 when the last check of _CURRENT failed.",
               [(pid, int(health.last_error is not None))])
        family("shardyfusion_reader_shards_open", "gauge", "Shard databases open.", [(pid, health.shards_open)])
        family("shardyfusion_reader_cache_bytes", "gauge", "Bytes of the served run's shards in the cache.",
               [(pid, health.cache_bytes)])
        for name, value in sorted(reader.cache_stats.items()):
            family(f"shardyfusion_reader_cache_{name}_total", "counter", f"The reader's cache: {name.replace('_', ' ')}.",
                   [(pid, value)])
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
