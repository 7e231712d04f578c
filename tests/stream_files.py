"""Change files for streaming tests: upserts and deletes, renamed into a source folder one by one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pathlib import Path


def put_changes(source: Path, n: int, upserts: dict[int, str], deletes: list[int] = ()) -> None:
    """File ``n``: ``id``/``payload``/``deleted`` rows, written aside and renamed in (mtimes increasing,
    so the file source takes the files in order)."""
    keys = [*upserts, *deletes]
    table = pa.table({"id": pa.array(keys, pa.int64()), "payload": [upserts.get(k) for k in keys],
                      "deleted": pa.array([False] * len(upserts) + [True] * len(deletes), pa.bool_())})
    staged = source.parent / f".part-{n:04d}.parquet"
    pq.write_table(table, staged)
    os.utime(staged, (1_700_000_000 + 10 * n,) * 2)
    os.replace(staged, source / f"part-{n:04d}.parquet")
