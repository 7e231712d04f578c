"""``make demo``'s last block: the snapshot read again outside Airflow, with nothing else printed.

Real parts: a snapshot written through ``core`` (``build_snapshot``, no Spark: the DAG run before
it is covered by the e2e DAG tests), and ``run_demo.show_read_back`` in a fresh Python process, as
the demo runs it, so Airflow's logging is set up by the import exactly as there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.snapshot_factory import build_snapshot

REPO = Path(__file__).resolve().parents[2]
ROWS = 30  # the demo reads key_of(rows // 3)

pytestmark = pytest.mark.airflow


def key_of(i: int) -> int:
    return i * 7919 + 13  # the example's key_of, restated: the test checks the demo, not itself


def test_the_read_back_prints_its_two_lines_and_no_log_line(tmp_path):
    root = f"file://{tmp_path}/snapshot"
    built = build_snapshot(root, [(key_of(i), f"payload-{key_of(i)}".encode()) for i in range(ROWS)], num_dbs=4)
    code = ("import sys; sys.path.insert(0, 'dags_example'); import run_demo; "
            f"run_demo.show_read_back({root!r}, {built.manifest_ref!r}, {ROWS})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    key = key_of(ROWS // 3)
    assert proc.stdout.splitlines() == [
        "",
        f"ShardedReader({root!r}).get({key}) -> b'payload-{key}'",
        f"snapshot run {built.run_id}: 4 shards, manifest {built.manifest_ref}",
    ]
    # The reader's download lines (INFO, one per shard opened) went to the console before the fix.
    assert "downloaded" not in proc.stderr and "[info" not in proc.stderr, proc.stderr
