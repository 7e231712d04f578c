"""The getting-started recipe (docs/getting-started.md) run exactly as a reader would paste it.

The page includes ``docs/examples/my_first_snapshot.sh`` and ``my_first_snapshot.py`` verbatim, and
this test runs that script with ``bash -eo pipefail`` from a clone-shaped folder (``.venv`` and ``docs/`` beside each
other), with none of the test suite's Airflow, Spark or PySpark settings in the environment: only
what the script sets itself. Then it reads the whole snapshot back and checks it was validated and
published, so the page cannot drift from what works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_shardyfusion import ShardedReader
from airflow_provider_shardyfusion.core.model.run_record import SUCCEEDED, read_run_record
from airflow_provider_shardyfusion.core.storage import open_store

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "docs" / "examples" / "my_first_snapshot.sh"
ROWS = 1000
# Set by the test harness (tests/conftest.py, the Makefile) and by the recipe itself: the recipe must
# work without them.
_NOT_INHERITED = ("AIRFLOW_", "SPARK_", "PYSPARK_")


def test_the_getting_started_recipe_writes_validates_publishes_and_reads_back(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)  # `make demo` builds .venv in the clone
    (clone / "docs").symlink_to(REPO / "docs")
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    # The provider of this checkout (in a fresh clone it is the editable install of it anyway).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # -e -o pipefail here, not in the recipe: a reader pastes it into their own shell, which
    # `set -e` would close at the first error; the test stops at it instead.
    proc = subprocess.run(["bash", "-eo", "pipefail", str(RECIPE)], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=900)
    output = proc.stdout[-20000:] + proc.stderr[-20000:]
    assert proc.returncode == 0, output

    # The recipe's last command: `shardyfusion get` of the published snapshot.
    got = json.loads(proc.stdout[proc.stdout.rindex("\n{\n") + 1:])
    assert [(r["key"], r["found"], r["value"]) for r in got["results"]] == [
        (42, True, {"name": "user-42", "tier": "basic"}),
        (999, True, {"name": "user-999", "tier": "basic"}),
        (1000, False, None)], output

    root = f"file://{clone}/.airflow/my_first_snapshot/snapshot"
    with ShardedReader(root) as reader:
        run_id = reader.run_id
        assert run_id == got["run_id"]
        values = reader.multi_get(list(range(ROWS + 1)))
    assert values == [{"name": f"user-{i}", "tier": "gold" if i % 10 == 0 else "basic"} for i in range(ROWS)] + [None]
    record = read_run_record(open_store(root), run_id)
    assert record.status == SUCCEEDED and record.published_at is not None
    assert record.validation is not None and record.validation["ok"] is True, record.validation
    assert record.writer["airflow"]["dag_id"] == "my_first_snapshot"
