"""The workers of one ``serve`` sharing their metrics through a folder (``serve.worker_metrics``).

Real files and real processes: the "other worker" is a child process, so its pid is alive until
the test ends it. The HTTP side (``--workers 2``) is in tests/integration/test_serve.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from airflow_provider_shardyfusion.serve.metrics import ServeMetrics, render
from airflow_provider_shardyfusion.serve.worker_metrics import STALE_S, SharedMetrics


def _worker(folder: str, pid: int, reads: int) -> tuple[ServeMetrics, SharedMetrics]:
    metrics = ServeMetrics()
    metrics.pid = pid
    for _ in range(reads):
        metrics.request("multi_get", 200)
    return metrics, SharedMetrics(folder, pid, lambda: metrics.snapshot(None))


def test_a_scrape_shows_every_live_worker_and_drops_the_gone(tmp_path):
    folder = str(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _, mine = _worker(folder, os.getpid(), 3)
        theirs_metrics, theirs = _worker(folder, other.pid, 5)
        theirs.start()
        mine.start()
        text = render(mine.scrape())
        assert f'shardyfusion_serve_requests_total{{pid="{os.getpid()}",route="multi_get",code="200"}} 3' in text
        assert f'shardyfusion_serve_requests_total{{pid="{other.pid}",route="multi_get",code="200"}} 5' in text
        assert text.count("# TYPE shardyfusion_serve_requests_total counter") == 1, text
        theirs_metrics.request("multi_get", 200)
        theirs.close()  # a worker stopping removes its file: its series ends
        assert [w.pid for w in mine.scrape()] == [os.getpid()]

        _, theirs = _worker(folder, other.pid, 1)
        theirs._publish()  # written, then its process dies without removing the file
        assert [w.pid for w in mine.scrape()] == sorted([os.getpid(), other.pid])
        other.kill()
        other.wait()
        assert [w.pid for w in mine.scrape()] == [os.getpid()]
        assert sorted(os.listdir(folder)) == [f"worker-{os.getpid()}.json"]  # the dead worker's file removed
        mine.close()
    finally:
        other.kill()
        other.wait()


def test_a_file_not_rewritten_for_stale_s_is_dropped(tmp_path):
    """A worker's pid taken by another process after it died: its file ages out."""
    folder = str(tmp_path)
    _, mine = _worker(folder, os.getpid(), 1)
    _, ghost = _worker(folder, os.getppid(), 1)  # a live pid, but nobody rewrites its file
    ghost._publish()
    path = os.path.join(folder, f"worker-{os.getppid()}.json")
    assert [w.pid for w in mine.scrape()] == sorted([os.getpid(), os.getppid()])
    old = time.time() - STALE_S - 5
    os.utime(path, (old, old))
    assert [w.pid for w in mine.scrape()] == [os.getpid()]
    assert not os.path.exists(path)
    mine.close()
    assert os.listdir(folder) == []
