"""Longest file first for ``pytest -n 2 --dist loadfile`` (``make test``).

xdist hands out whole files, by default the files with the most tests first; here the slowest files
are the one-test DAG, deployment and kill scenarios, so they came last, where one worker could still
have minutes of them queued while the other had nothing left. Handing out the longest file first (by
the seconds each file took in the last green full run, kept in ``.pytest_cache``, else by
``tests/file_seconds.json``) leaves the short unit files for the end, where they even the workers out.

Refresh the committed table after a full ``make test`` with
``python -m tests.scheduling`` (it copies the last run's figures over the table).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

TABLE = Path(__file__).with_name("file_seconds.json")
CACHE_KEY = "shardyfusion/file_seconds"


def known_seconds(config: pytest.Config | None) -> dict[str, float]:
    seconds = json.loads(TABLE.read_text())
    cache = getattr(config, "cache", None)
    if cache is not None:
        seconds.update(cache.get(CACHE_KEY, {}))
    return seconds


class LongestFileFirst(LoadFileScheduling):
    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.seconds = known_seconds(config)
        # A file the table does not know yet (new) counts as a typical one.
        self.unknown = statistics.median(self.seconds.values()) if self.seconds else 0.0

    def _assign_work_unit(self, node: Any) -> None:
        longest = max(self.workqueue, key=lambda scope: self.seconds.get(scope, self.unknown))
        self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)


class FileSeconds:
    """Adds up each file's setup, call and teardown seconds in the controller; kept in the cache."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        cache = getattr(config, "cache", None)
        if cache is None or exitstatus != 0:
            return
        # Only a run of the whole suite: a partial one would make its files look cheap next time.
        if config.args_source is not pytest.Config.ArgsSource.TESTPATHS or (
                config.option.keyword or config.option.markexpr or config.option.lf):
            return
        cache.set(CACHE_KEY, {**cache.get(CACHE_KEY, {}), **{k: round(v, 1) for k, v in self.seconds.items()}})


if __name__ == "__main__":
    last = json.loads((TABLE.parents[1] / ".pytest_cache" / "v" / CACHE_KEY).read_text())
    TABLE.write_text(json.dumps({**json.loads(TABLE.read_text()), **last}, indent=1, sort_keys=True) + "\n")
