"""``make bench``: run every benchmark; each prints one JSON line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = 0
    for script in ("bench_write.py", "bench_scale.py", "bench_read.py", "bench_connect.py", "bench_delta.py",
                   "bench_stream.py", "bench_decode.py", "bench_metadata.py", "bench_serve.py"):
        failed |= subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]]).returncode != 0
    sys.exit(1 if failed else 0)
