"""The environment that makes a job honour test faults: the faults' JSON and the test-only switch."""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_shardyfusion.spark_jobs.faults import ENABLE_VAR, ENV_VAR


def fault_env(faults: dict[str, Any]) -> dict[str, str]:
    return {ENV_VAR: json.dumps(faults), ENABLE_VAR: "1"}


def set_faults(monkeypatch: Any, faults: dict[str, Any]) -> None:
    for name, value in fault_env(faults).items():
        monkeypatch.setenv(name, value)
