"""The reader's OpenTelemetry metrics, meter ``shardyfusion.reader`` (SPEC §19; the instruments and
their units are listed in docs/guides/reader.md).

``get`` is the hot path (a few µs), and a synchronous OTel instrument costs about a µs per call
with an SDK. So a ``get`` only advances an ``itertools.count`` (atomic under the GIL, no lock) and
a second one on a miss; the counts reach OTel through observable counters read at collection
time. One ``get`` in ``TIMED_GET_EVERY`` is timed into the ``get.duration`` histogram (a sample:
its count is a 64th of the gets). Refreshes are rare and recorded as they happen.

The instruments are created once per meter provider and shared by every reader using it; the
observable ones add up the readers alive (and those closed, for the counters, so a counter never
goes back), and ``snapshot.age`` reports the oldest snapshot served: the one a staleness alarm
is about.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core.telemetry import meter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_shardyfusion.core.read.loaded_snapshot import LoadedSnapshot

__all__ = ["METER_NAME", "TIMED_GET_EVERY", "ReaderMetrics"]

METER_NAME = "shardyfusion.reader"
TIMED_GET_EVERY = 64
TIMED_GET_MASK = TIMED_GET_EVERY - 1

def _count_of(counter: itertools.count[int]) -> int:
    """How many times ``next()`` was called on a fresh ``itertools.count()`` (its repr is ``count(N)``)."""
    return int(repr(counter)[6:-1])


class ReaderMetrics:
    """One reader's counts and its handle on the shared instruments (None without the OTel API).

    ``gets``/``misses``: advanced by ``get`` (``next()``); ``count_batch`` adds a ``multi_get``.
    ``snapshot()`` and ``bytes_downloaded()`` are asked at collection time only.
    """

    def __init__(self, meter_provider: Any, *, snapshot: Callable[[], LoadedSnapshot | None],
                 bytes_downloaded: Callable[[], int]):
        self.gets = itertools.count()
        self.misses = itertools.count()
        self._lock = threading.Lock()
        self._batch_gets = 0
        self._batch_misses = 0
        self.snapshot = snapshot
        self.bytes_downloaded = bytes_downloaded
        self.closed = False
        self._instruments = _Instruments.of(meter_provider)
        if self._instruments is not None:
            self._instruments.readers.add(self)

    def count_batch(self, keys: int, misses: int) -> None:
        with self._lock:
            self._batch_gets += keys
            self._batch_misses += misses

    def counts(self) -> tuple[int, int]:
        """Look-ups so far (``get`` and ``multi_get`` keys) and how many of them found nothing."""
        with self._lock:
            return _count_of(self.gets) + self._batch_gets, _count_of(self.misses) + self._batch_misses

    def timed_get(self, get: Callable[..., Any], key: Any, routing_context: Any) -> Any:
        start = time.perf_counter()
        value = get(key, routing_context=routing_context)
        if self._instruments is not None:
            self._instruments.get_duration.record(time.perf_counter() - start)
        return value

    def refreshed(self, outcome: str, seconds: float) -> None:
        if self._instruments is not None:
            attributes = {"outcome": outcome}
            self._instruments.refreshes.add(1, attributes)
            self._instruments.refresh_duration.record(seconds, attributes)

    def close(self) -> None:
        """Stop observing this reader; its counts stay in the counters' totals."""
        if self._instruments is not None and not self.closed:
            self._instruments.retire(self)
        self.closed = True


class _Instruments:
    """The instruments of one meter provider, and the readers they observe."""

    _by_provider: dict[int, tuple[Any, _Instruments]] = {}  # noqa: RUF012 - a registry, on purpose class-wide
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, meter_provider: Any) -> _Instruments | None:
        m = meter(METER_NAME, meter_provider)
        if m is None:
            return None
        key = id(meter_provider)
        with cls._registry_lock:
            # The provider is kept with its instruments, so its id cannot be reused by another one.
            entry = cls._by_provider.get(key)
            if entry is None:
                entry = (meter_provider, cls(m))
                cls._by_provider[key] = entry
            return entry[1]

    def __init__(self, m: Any):
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self.readers: weakref.WeakSet[ReaderMetrics] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._retired_gets = 0
        self._retired_misses = 0
        self._retired_bytes = 0
        self.get_duration = m.create_histogram(
            "shardyfusion.reader.get.duration", unit="s",
            description=f"Duration of get(), sampled: one get in {TIMED_GET_EVERY} is timed")
        self.refreshes = m.create_counter(
            "shardyfusion.reader.refreshes", unit="{refresh}",
            description="refresh() calls (the follower's and the user's) by outcome: swapped, unchanged or failed; "
                        "a follower's check that failed before calling refresh() (_CURRENT unreadable) counts as failed")
        self.refresh_duration = m.create_histogram(
            "shardyfusion.reader.refresh.duration", unit="s", description="Duration of refresh(), by outcome")
        m.create_observable_counter(
            "shardyfusion.reader.gets", callbacks=[self._observe_gets], unit="{key}",
            description="Keys looked up by get() and multi_get(), by found (true/false)")
        m.create_observable_counter(
            "shardyfusion.reader.bytes_downloaded", callbacks=[self._observe_bytes], unit="By",
            description="Shard bytes downloaded into the local cache")
        m.create_observable_gauge(
            "shardyfusion.reader.snapshot.age", callbacks=[self._observe_age], unit="s",
            description="Seconds since the served run was published (the oldest, over the readers)")
        m.create_observable_gauge(
            "shardyfusion.reader.shards_open", callbacks=[self._observe_shards], unit="{shard}",
            description="Shard databases open now")

    def retire(self, reader: ReaderMetrics) -> None:
        gets, misses = reader.counts()
        downloaded = reader.bytes_downloaded()
        with self._lock:
            if reader in self.readers:
                self.readers.discard(reader)
                self._retired_gets += gets
                self._retired_misses += misses
                self._retired_bytes += downloaded

    def _live(self) -> list[ReaderMetrics]:
        return [r for r in list(self.readers) if not r.closed]

    def _observe_gets(self, _options: Any) -> Iterable[Any]:
        with self._lock:
            gets, misses = self._retired_gets, self._retired_misses
            for reader in self._live():
                reader_gets, reader_misses = reader.counts()
                gets += reader_gets
                misses += reader_misses
        return [self._observation(gets - misses, {"found": True}), self._observation(misses, {"found": False})]

    def _observe_bytes(self, _options: Any) -> Iterable[Any]:
        with self._lock:
            total = self._retired_bytes + sum(reader.bytes_downloaded() for reader in self._live())
        return [self._observation(total)]

    def _observe_age(self, _options: Any) -> Iterable[Any]:
        now = datetime.now(UTC)
        ages = [(now - s.pointer.updated_at).total_seconds() for s in self._snapshots()]
        return [self._observation(max(0.0, max(ages)))] if ages else []

    def _observe_shards(self, _options: Any) -> Iterable[Any]:
        return [self._observation(sum(len(s.handles) for s in self._snapshots()))]

    def _snapshots(self) -> list[LoadedSnapshot]:
        return [s for s in (reader.snapshot() for reader in self._live()) if s is not None]
