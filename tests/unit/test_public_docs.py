"""Every public operator, sensor, trigger and hook is documented: each argument with a ``:param:``
line, each class in the docs site's API reference (generated from those lines) and in a guide."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

PUBLIC = {
    "operators.sharded_write": "ShardedWriteOperator",
    "operators.validate": "ValidateManifestOperator",
    "operators.publish": "PublishSnapshotOperator",
    "operators.cleanup": "DeferredCleanupOperator",
    "operators.streaming_snapshot": "StreamingSnapshotOperator",
    "sensors.run_record": "RunRecordSensor",
    "sensors.current": "CurrentSnapshotSensor",
    "triggers.run_record": "RunRecordTrigger",
    "triggers.current": "CurrentSnapshotTrigger",
    "hooks.shardyfusion": "ShardyfusionHook",
}
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(("module", "name"), sorted(PUBLIC.items()))
def test_every_public_class_is_in_the_api_reference_and_a_guide(module, name):
    api = (DOCS / "api.md").read_text()
    assert f"::: airflow_provider_shardyfusion.{module}.{name}\n" in api, f"{name}: no entry in docs/api.md"
    guides = [p.name for p in (DOCS / "guides").glob("*.md") if f"`{name}`" in p.read_text()]
    assert guides, f"{name}: no guide under docs/guides/ names it"


@pytest.mark.parametrize(("module", "name"), sorted(PUBLIC.items()))
def test_every_argument_has_a_param_doc(module, name):
    cls = getattr(importlib.import_module(f"airflow_provider_shardyfusion.{module}"), name)
    params = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
    assert params, name
    undocumented = [p for p in params if not re.search(rf":param {p}:", cls.__doc__ or "")]
    assert not undocumented, f"{name}: no ':param' line for {undocumented}"


@pytest.mark.parametrize(("module", "name"), sorted(PUBLIC.items()))
def test_no_param_doc_names_an_argument_that_does_not_exist(module, name):
    cls = getattr(importlib.import_module(f"airflow_provider_shardyfusion.{module}"), name)
    params = set(inspect.signature(cls.__init__).parameters)
    documented = re.findall(r":param (\w+):", cls.__doc__ or "")
    assert len(documented) == len(set(documented)), f"{name}: a ':param' line appears twice"
    assert set(documented) <= params, f"{name}: ':param' lines for {sorted(set(documented) - params)}"
