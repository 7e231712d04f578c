"""Turn a failed Spark action back into the provider error raised inside the task."""

from __future__ import annotations

import re

from airflow_provider_shardyfusion.core.errors import ShardyfusionError, error_type_by_name

_ERROR_LINE = re.compile(r"airflow_provider_shardyfusion\.core\.errors\.(\w+): ([^\n]*)")


def translate(exc: BaseException) -> BaseException:
    """The first provider error named in the Spark failure text, or ``exc`` unchanged."""
    if isinstance(exc, ShardyfusionError):
        return exc
    match = _ERROR_LINE.search(str(exc))
    if not match:
        return exc
    cls = error_type_by_name(match.group(1))
    return cls(match.group(2))
