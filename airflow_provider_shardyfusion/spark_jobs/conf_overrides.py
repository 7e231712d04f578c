"""Step 2: runtime Spark conf overrides, restored in reverse order on exit."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "spark_conf_overrides",
]

log = logging.getLogger("shardyfusion.job")
_UNSET = object()


@contextlib.contextmanager
def spark_conf_overrides(spark, overrides: Mapping[str, str]) -> Iterator[None]:
    applied: list[tuple[str, object]] = []
    try:
        for key, value in overrides.items():
            previous = spark.conf.get(key, None)
            try:
                spark.conf.set(key, value)
            except Exception as exc:
                raise ConfigError(f"spark_conf_overrides {key!r} cannot be set at runtime: {exc}") from None
            applied.append((key, _UNSET if previous is None else previous))
            log.info("spark conf %s=%s (was %s)", key, value, previous)
        yield
    finally:
        for key, previous in reversed(applied):
            try:
                if previous is _UNSET:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, previous)
            except Exception as exc:  # restoring is best effort: the write's outcome matters more
                log.warning("could not restore spark conf %s: %s", key, exc)
