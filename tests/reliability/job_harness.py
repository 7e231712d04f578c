"""Real Spark jobs under fault, and the checks every fault test repeats.

A job runs as ``spark-submit`` of the real entry script (local mode, its own JVM and Python
processes), so a test can ``kill -9`` the driver or a Python worker without touching pytest. Test
faults travel in the job's environment only (``spark_jobs/faults.py``); a hold point writes the
pid of the process holding it to a marker file.

``Watch`` polls the root while the fault happens: the old snapshot must read back exactly through
a reader opened on it, and ``_CURRENT`` must never name a run whose record is not ``succeeded``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.lifecycle.cleanup import execute_cleanup, make_plan
from airflow_provider_shardyfusion.core.model.config import build_write_config
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.fault_env import fault_env
from tests.polling import wait_for
from tests.snapshot_factory import build_snapshot

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts" / "sharded_write_job.py"


def write_input(directory: Path, keys: range, tag: str) -> tuple[str, dict[int, bytes]]:
    """A parquet input of ``id`` → ``v`` whose values name ``tag`` (so two writers' data never look alike)."""
    expected = {k: f"{tag}-{k}".encode() for k in keys}
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(list(expected), pa.int64()), "v": pa.array(list(expected.values()))}),
                   directory / "part-0.parquet")
    return str(directory), expected


def job_config(root: str, input_path: str, **kwargs: Any):
    return build_write_config(output_uri=root, input_path=input_path, key_column="id", value_column="v", **kwargs)


@dataclass
class Job:
    """One ``spark-submit`` of the write job; its output goes to a file (read with ``output()``)."""

    proc: subprocess.Popen[bytes]
    run_id: str
    log_path: Path

    def wait(self, timeout: float = 180) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        """spark-submit's JVM and every process under it (Python driver, daemon, workers)."""
        try:
            top = psutil.Process(self.proc.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Teardown: kill whatever of this job still runs (only its own processes)."""
        for p in reversed(self.tree()):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def submit(config, log_dir: Path, *, master: str = "local[2]", faults: dict[str, Any] | None = None) -> Job:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SHARDYFUSION_TEST_FAULTS", None)
    if faults:
        env.update(fault_env(faults))
    b64 = base64.urlsafe_b64encode(config.to_json().encode()).decode()
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    log_path = log_dir / f"job-{config.run_id}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [spark_submit, "--master", master, "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2", str(ENTRY), "--config-b64", b64],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    return Job(proc, config.run_id, log_path)


def old_snapshot(root: str) -> tuple[str, dict[int, bytes]]:
    """The snapshot live before the fault (built without Spark): its run id and its exact values."""
    expected = {k: f"old-{k}".encode() for k in range(0, 3000, 3)}
    return build_snapshot(root, expected.items(), num_dbs=3, key_column="id").run_id, expected


def rerun(root: str, work: Path, num_dbs: int = 4) -> tuple[str, dict[int, bytes], int]:
    """After the fault, a new write of new values publishes and reads back exactly.

    Returns its run id, its values and how many keys were read back.
    """
    input_path, expected = write_input(work / "rerun", range(0, 5000, 2), "rerun")
    job = submit(job_config(root, input_path, num_dbs=num_dbs, run_id=layout.new_run_id()), work)
    try:
        assert job.wait() == 0, job.output()[-3000:]
    finally:
        job.stop()
    assert live_run(root) == job.run_id
    return job.run_id, expected, read_exactly(root, expected)


def held_pid(marker: Path, job: Job, timeout: float = 120) -> int:
    """The pid a hold point wrote, once the job reached it (fails fast if the job ended first)."""
    def reached() -> int | None:
        if marker.exists():
            return int(marker.read_text())
        if job.proc.poll() is not None:
            raise AssertionError(f"job ended ({job.proc.returncode}) before its hold point:\n{job.output()[-3000:]}")
        return None

    return wait_for(reached, timeout, f"run {job.run_id} to reach its hold point")


def read_exactly(root: str, expected: dict[int, bytes], storage_options: dict[str, Any] | None = None) -> int:
    """Every key through a fresh reader of what ``_CURRENT`` names, plus keys that must be absent."""
    absent = [max(expected) + 1 + i for i in range(3)]
    with ShardedReader(root, storage_options=storage_options) as reader:
        keys = list(expected)
        assert reader.multi_get(keys) == [expected[k] for k in keys]
        assert reader.multi_get(absent) == [None] * len(absent)
    return len(keys) + len(absent)


def live_run(root: str, storage_options: dict[str, Any] | None = None) -> str | None:
    pointer = SnapshotRoot(open_store(root, storage_options)).current()
    return pointer.run_id if pointer is not None else None


class Watch:
    """Poll a root in a thread while a fault happens; ``stop()`` returns what was checked.

    Each poll reads a slice of the old snapshot through a reader pinned to it (exact values), and
    ``_CURRENT`` with the record of the run it names (must be ``succeeded``, its manifest loadable).
    """

    def __init__(self, root: str, expected: dict[int, bytes], storage_options: dict[str, Any] | None = None,
                 interval: float = 0.2):
        self.root, self.expected, self.interval = root, expected, interval
        self.snapshots = SnapshotRoot(open_store(root, storage_options))
        self.reader = ShardedReader(root, storage_options=storage_options)
        self.polls = self.values_checked = 0
        self.live_runs: list[str] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reliability-watch", daemon=True)
        self._thread.start()

    def _poll(self, offset: int) -> None:
        keys = list(self.expected)[offset::97][:50]
        got = self.reader.multi_get(keys)
        if got != [self.expected[k] for k in keys]:
            self.problems.append(f"poll {self.polls}: the old snapshot read back other values")
        self.values_checked += len(keys)
        pointer = self.snapshots.current()
        if pointer is None:
            self.problems.append(f"poll {self.polls}: _CURRENT disappeared")
            return
        if not self.live_runs or self.live_runs[-1] != pointer.run_id:
            self.live_runs.append(pointer.run_id)
        record = self.snapshots.read_run(pointer.run_id)
        if record is None or record.status != SUCCEEDED or record.manifest_ref != pointer.manifest_ref:
            self.problems.append(f"poll {self.polls}: _CURRENT names run {pointer.run_id} whose record is "
                                 f"{record.status if record else 'missing'} (manifest {pointer.manifest_ref})")
        self.snapshots.read_manifest(pointer)  # checksum and size as the pointer records them

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll(self.polls % 97)
            except Exception as exc:  # a failed poll is a finding, not a reason to stop watching
                self.problems.append(f"poll {self.polls}: {type(exc).__name__}: {exc}")
            self.polls += 1
            self._stop.wait(self.interval)

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join(timeout=30)
        self.reader.close()
        assert not self.problems, self.problems[:5]
        assert self.polls >= 3, f"only {self.polls} polls: the watch did not cover the fault"
        return self


def run_objects(root: str, run_id: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The run's data objects (shards and manifest; its record under runs/ always stays)."""
    store = open_store(root, storage_options)
    return [o.key for o in store.list("") if f"run_id={run_id}/" in o.key
            and not o.key.startswith(layout.RUNS_DIR + "/")]


def reclaim(root: str, run_id: str, category: str, storage_options: dict[str, Any] | None = None,
            keep: tuple[str, ...] = ()) -> int:
    """The lifecycle cleanup, run now with no grace period, reclaims exactly ``run_id``'s leftovers.

    Returns the objects deleted; the runs in ``keep`` (live and older snapshots) lose nothing.
    """
    snapshots = SnapshotRoot(open_store(root, storage_options))
    left = run_objects(root, run_id, storage_options)
    kept_before = {r: run_objects(root, r, storage_options) for r in keep}
    plan = make_plan(snapshots, keep_runs=len(keep) + 1, grace_period=timedelta(0))
    items = [i for i in plan.items if i.run_id == run_id]
    assert [i.category for i in items] == [category], plan.to_dict()
    assert sorted(o.key for o in items[0].objects) == sorted(left)
    execute_cleanup(snapshots, plan)
    assert run_objects(root, run_id, storage_options) == []
    record = snapshots.read_run(run_id)
    assert record is not None and record.deleted_at is not None and record.status != "running"
    assert {r: run_objects(root, r, storage_options) for r in keep} == kept_before
    return len(left)


def command_line(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # ended (or a zombie) since the tree was listed
        return []


def python_driver(job) -> psutil.Process:
    """The Python process spark-submit started for the entry script (it runs the write)."""
    found = [p for p in job.tree() if any(a.endswith("sharded_write_job.py") for a in command_line(p))
             and "python" in os.path.basename(command_line(p)[0])]
    assert len(found) == 1, [command_line(p) for p in job.tree()]
    return found[0]
