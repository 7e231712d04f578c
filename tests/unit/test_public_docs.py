"""Every argument of every public operator, sensor, trigger and hook is documented with ``:param:``."""

from __future__ import annotations

import importlib
import inspect
import re

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
