"""Helpers of the quickstart DAG tests: the example module, a process sampler, a full read-back."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import psutil

from airflow_provider_shardyfusion import ShardedReader

REPO = Path(__file__).resolve().parents[2]


def _load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_example", REPO / "dags_example" / "quickstart.py")
    # The DAG file imports its helper module from the DAGs folder (on sys.path under Airflow).
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quickstart = _load_quickstart()


class ProcessSampler:
    """Collects the command line of every process, every 0.2 s, in a background thread."""

    def __init__(self):
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for proc in psutil.process_iter(["cmdline"]):
                cmdline = proc.info.get("cmdline")
                if cmdline:
                    self.seen.add(" ".join(cmdline))

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def assert_snapshot_matches_input(output_uri: str, rows: int, storage_options=None) -> None:
    keys = [quickstart.key_of(i) for i in range(rows)]
    with ShardedReader(output_uri, storage_options=storage_options) as reader:
        assert reader.manifest.num_dbs == quickstart.NUM_DBS
        assert sum(s.row_count for s in reader.manifest.shards) == rows
        values = reader.multi_get(keys)
        assert reader.multi_get([7, keys[-1] + 1]) == [None, None]
    wrong = [(k, v) for k, v in zip(keys, values, strict=False) if v != quickstart.payload_of(k).encode()]
    assert not wrong, f"{len(wrong)} of {rows} keys read back wrong, e.g. {wrong[:3]}"
