"""An asset event of a task whose class is merely named like one of our operators never makes a root
known to the history UI (issue 42 item 12).

Real Airflow (``dag.test()`` on a SQLite metadata DB): a DAG defines its own ``ShardedWriteOperator``
(a ``BaseOperator`` in the DAG file's module) and emits two events with it: one on another team's
real snapshot, its claim true (the root's own run record names the manifest: only the module check
refuses it), one on a root whose claim its records refute (the run-record check refuses it too).
The plugin's ``event_claims``/``event_roots`` are then asked in a child process with that metadata
DB: only our real ``PublishSnapshotOperator``'s root is listed. The child asks once more with the
module check switched off (the name-only check, as before): the run-record check alone still refuses
the refuted claim, and the true claim is listed, which is why both checks are kept.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.airflow_env import REPO_ROOT, airflow_env, run_dag  # noqa: F401 - fixtures: real Airflow, SQLite metadata DB
from tests.snapshot_factory import build_snapshot

DAG_FILE = '''
import json
import os
from datetime import datetime

from airflow.sdk import DAG, Asset, BaseOperator

from airflow_provider_shardyfusion.operators.publish import PublishSnapshotOperator


class ShardedWriteOperator(BaseOperator):
    """Not ours: only its name is."""

    def __init__(self, *, claim, **kwargs):
        super().__init__(**kwargs)
        self.claim = claim

    def execute(self, context):
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = self.claim


with DAG("history_forged_operator", schedule=None, start_date=datetime(2026, 1, 1)):
    PublishSnapshotOperator(task_id="publish", output_uri=os.environ["HF_OURS"], run_id=os.environ["HF_OURS_RUN"],
                            aws_conn_id=None, outlets=[Asset(os.environ["HF_OURS"])])
    ShardedWriteOperator(task_id="forged_true", claim=json.loads(os.environ["HF_THEIRS_CLAIM"]),
                         outlets=[Asset(os.environ["HF_THEIRS"])])
    ShardedWriteOperator(task_id="forged_refuted", claim=json.loads(os.environ["HF_REFUTED_CLAIM"]),
                         outlets=[Asset(os.environ["HF_REFUTED"])])
'''

# Asked in a child: Airflow reads the test's configuration at import (tests/airflow_env.py).
ASK = '''
import importlib, json
from airflow_provider_shardyfusion.ui import plugin

# getattr and the dict check: this ran before the module check existed, to see the test fail.
table = plugin.SNAPSHOT_OPERATORS
for name, module in (table.items() if isinstance(table, dict) else ()):  # the table names the real classes
    assert getattr(importlib.import_module(module), name).__module__ == module, (name, module)
seen = {"claims": sorted(plugin.event_claims()), "roots": plugin.event_roots(),
        "modules": sorted({m for m in getattr(plugin, "_task_modules", {}).values() if m})}
plugin._ours = lambda *args: True  # the module check off: the class name alone, as before
plugin._checked_claims.clear()
seen["name_only_claims"] = sorted(plugin.event_claims())
seen["name_only_roots"] = plugin.event_roots()
print("@@SEEN@@ " + json.dumps(seen))
'''


@pytest.mark.airflow
def test_an_operator_merely_named_like_ours_adds_no_root(airflow_env, run_dag, tmp_path, figure):  # noqa: F811
    ours = f"file://{tmp_path}/ours/snap"
    theirs = f"file://{tmp_path}/other-team/snap"
    refuted = f"file://{tmp_path}/refuted/snap"
    ours_run = build_snapshot(ours, [(1, b"ours")], num_dbs=1, publish=False).run_id
    their = build_snapshot(theirs, [(1, b"other-team-value")], num_dbs=1)
    refuted_built = build_snapshot(refuted, [(1, b"refuted-value")], num_dbs=1)
    true_claim = {"run_id": their.run_id, "manifest_ref": their.manifest_ref, "published": True, "output_uri": theirs}
    # A run the root never had, with a manifest it has: the root's records refute it.
    refuted_claim = {"run_id": "20260101T000000Z-forged", "manifest_ref": refuted_built.manifest_ref,
                     "published": True, "output_uri": refuted}
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "history_forged_operator.py").write_text(DAG_FILE)
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "HF_OURS": ours, "HF_OURS_RUN": ours_run,
           "HF_THEIRS": theirs, "HF_THEIRS_CLAIM": json.dumps(true_claim),
           "HF_REFUTED": refuted, "HF_REFUTED_CLAIM": json.dumps(refuted_claim)}
    result = run_dag("history_forged_operator", extra_env=env)
    assert result.tasks == {"publish": "success", "forged_true": "success", "forged_refuted": "success"}, result.tasks

    proc = subprocess.run([sys.executable, "-c", ASK], env={**airflow_env.env, **env}, cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@SEEN@@ "))[len("@@SEEN@@ "):])
    # Both checks on: only our operator's event counts.
    assert seen["claims"] == [ours] and seen["roots"] == [ours], seen
    assert "airflow_provider_shardyfusion.operators.publish" in seen["modules"], seen
    forged_modules = [m for m in seen["modules"] if not m.startswith("airflow_provider_shardyfusion.")]
    assert forged_modules, seen  # the forged class's module, as Airflow recorded it
    # The class name alone lets both forged events claim; the run records refute one of them.
    assert seen["name_only_claims"] == sorted([ours, theirs, refuted]), seen
    assert seen["name_only_roots"] == sorted([ours, theirs]), seen
    figure(forged_events=2, claims_counted=len(seen["claims"]), roots_listed=len(seen["roots"]),
           forged_module=re.sub(r"^unusual_prefix_[0-9a-f]+_", "", forged_modules[0]),
           name_only_claims=len(seen["name_only_claims"]), refuted_by_run_record=1,
           listed_by_name_only=len(seen["name_only_roots"]))
