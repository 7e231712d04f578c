"""Test faults stay out of production: a no-op default, the environment only behind a second switch."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.spark_jobs.chain_write import ChainPlan
from airflow_provider_shardyfusion.spark_jobs.faults import (
    ENABLE_VAR,
    ENV_VAR,
    NO_FAULTS,
    Faults,
    InjectedFault,
    from_environment,
)
from airflow_provider_shardyfusion.spark_jobs.routing_task import RoutingPlan
from airflow_provider_shardyfusion.spark_jobs.shard_task import WritePlan

SPEC = {"fail_shard_attempt": {"db_id": 1, "attempt": 0}, "wrong_router": True}


def test_the_fault_variable_alone_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="shardyfusion.faults"):
        assert from_environment({ENV_VAR: json.dumps(SPEC)}) is NO_FAULTS
        assert from_environment({ENV_VAR: json.dumps(SPEC), ENABLE_VAR: "true"}) is NO_FAULTS  # "1" only
    assert len(caplog.records) == 2 and ENABLE_VAR in caplog.records[0].getMessage()


def test_both_variables_give_the_faults():
    faults = from_environment({ENV_VAR: json.dumps(SPEC), ENABLE_VAR: "1"})
    assert faults == Faults(SPEC) and faults.route_shift == 1
    with pytest.raises(InjectedFault, match="shard 1 attempt 0"):
        faults.before_shard_write(1, 0)
    faults.before_shard_write(1, 1)  # another attempt is left alone
    assert from_environment({ENABLE_VAR: "1"}) is NO_FAULTS


def test_no_faults_does_nothing():
    assert NO_FAULTS.route_shift == 0 and NO_FAULTS.clock() is layout.utc_now
    NO_FAULTS.before_shard_write(0, 0)
    NO_FAULTS.after_shard_write(0, 0, "run")
    NO_FAULTS.before_single_db_attempt(0)
    NO_FAULTS.hold_point("hold_before_publish", "run")


@pytest.mark.parametrize("plan", [RoutingPlan, WritePlan, ChainPlan])
def test_no_plan_carries_faults(plan):
    names = {f.name for f in dataclasses.fields(plan)}
    assert not names & {"faults", "wrong_router"}, names
