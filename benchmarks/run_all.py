"""``make bench``: run every benchmark; each prints one JSON line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = 0
    runs: list[tuple[str, ...]] = [
        ("bench_write.py",), ("bench_scale.py",), ("bench_read.py",), ("bench_connect.py",), ("bench_delta.py",),
        # JSON values (SPEC §18) on a chain too: the engine encoder and typed reads
        ("bench_delta.py", "--value-format", "json"),
        ("bench_stream.py",), ("bench_stream.py", "--value-format", "json"),
        ("bench_decode.py",), ("bench_metadata.py",), ("bench_serve.py",),
    ]
    for script, *extra in runs:
        failed |= subprocess.run([sys.executable, str(HERE / script), *extra, *sys.argv[1:]]).returncode != 0
    sys.exit(1 if failed else 0)
