"""Docstrings and comments keep rules; measured figures live in docs/benchmarks.md, dated.

A figure in prose ("~40 ms a task", "3× slower", "about 40 % of the time") ages without anyone
noticing: RocksDB, PySpark, the machine and the code around it change. This scans every comment
and docstring of the package for a number followed by a unit of time or a ratio and fails naming
file:line. Numbers that are settings or contracts, not measurements (a retry schedule, a timeout,
a jitter), are allowed one by one below, each with its reason.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_provider_shardyfusion"

# A number (or range) and a unit: µs/us/ms/ns, % or ×/x written against the number, "s" after a space
# (so "1000s of shards", thousands, is not a figure).
_NUMBER = r"(?<![\w.])~?\d+(?:\.\d+)?(?:\s*[-–]\s*\d+(?:\.\d+)?)?"
FIGURE = re.compile(rf"{_NUMBER}(?:\s*(?:µs|us|ms|ns|%)|\s+s|[×x]|\s+×)(?![\w/])")

_SPEC_RETRIES = "SPEC §6: the pointer write is retried after 1 s, 2 s and 4 s (a contract, not a timing)"
# (path under the package, figure as written) → why it is not a measurement.
ALLOWED: dict[tuple[str, str], str] = {
    **{(path, f"{n} s"): _SPEC_RETRIES for path in (
        "core/lifecycle/run_outcome.py", "core/model/snapshot.py", "core/retry.py", "core/write/commit.py")
       for n in (1, 2, 4)},
    **{("core/model/config.py", f"{n}x"): "the backoff schedule, multiples of the initial backoff" for n in (1, 2, 4)},
    ("core/read/follow.py", "10 %"): "the follower's jitter, a setting",
    ("core/read/reader.py", "10 %"): "the follower's jitter, a setting",
    ("core/storage/s3.py", "60 s"): "botocore's default timeouts, which ours replace",
    ("operators/sharded_write.py", "30 s"): "how long a finished run may take to go live (a setting)",
    ("sensors/run_record.py", "30 s"): "how long a finished run may take to go live (a setting)",
    ("triggers/run_record.py", "30 s"): "how long a finished run may take to go live (a setting)",
    ("triggers/_polling.py", "1 s"): "the shortest wait between polls (a setting)",
    ("spark_jobs/connect_session.py", "8 s"): "the reconnect waits' cap (a setting)",
    ("spark_jobs/connect_session.py", "20 s"): "gRPC keep-alive: ping after this long idle (a setting)",
    ("spark_jobs/connect_session.py", "15 s"): "gRPC keep-alive: the ping's answer deadline (a setting)",
    ("ui/plugin.py", "10 s"): "the roots page's deadline (a bound, not a timing)",
    ("ui/plugin.py", "2 s"): "the history's S3 connect timeout (a setting)",
    ("ui/plugin.py", "3 s"): "the history's S3 read timeout (a setting)",
}


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring line of ``path``."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                found.extend((first + i, line) for i, line in enumerate(doc.splitlines()))
    return found


def figures() -> list[tuple[str, int, str, str]]:
    """(path under the package, line, figure, the line's text) of every figure in prose."""
    return [(path.relative_to(PACKAGE).as_posix(), line, match.group(0).lstrip("~"), text.strip())
            for path in sorted(PACKAGE.rglob("*.py")) for line, text in prose(path)
            for match in FIGURE.finditer(text)]


def test_the_pattern_finds_figures_and_leaves_other_numbers():
    found = [m.group(0) for m in FIGURE.finditer(
        "~40 ms a task; 3× slower; about 40 % of it; 5-6× a write; 1.5 µs a run; 2x faster; 70-250 µs; "
        "10 s; at 1000s of shards; SPEC §6; 7/8 of it; 16 shards; 0.5 MB")]
    assert found == ["~40 ms", "3×", "40 %", "5-6×", "1.5 µs", "2x", "70-250 µs", "10 s"]


def test_docstrings_and_comments_hold_no_measured_figure():
    found = figures()
    offending = [f"{PACKAGE.name}/{path}:{line}: {figure!r} in: {text}" for path, line, figure, text in found
                 if (path, figure) not in ALLOWED]
    assert not offending, ("measured figures in docstrings or comments; keep the rule there and move the "
                           "figure, dated, to docs/benchmarks.md (or allow a setting in ALLOWED with its "
                           "reason):\n" + "\n".join(offending))
    stale = sorted(set(ALLOWED) - {(path, figure) for path, _, figure, _ in found})
    assert not stale, f"allowed figures no longer in the code; drop them from ALLOWED: {stale}"
