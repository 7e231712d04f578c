"""One declaration of the write arguments (core.model.write_args): everything that restates it must agree.

Fails when the operator's signature, ``template_fields``, renderers or ``:param:`` docs, or
``build_write_config``'s signature, or ``WriteOptions``' defaults drift from the declaration.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core.model import write_args
from airflow_provider_shardyfusion.core.model.config import WriteOptions, build_write_config
from airflow_provider_shardyfusion.core.model.write_args import REQUIRED, WRITE_ARGS
from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator
from airflow_provider_shardyfusion.operators.streaming_snapshot import StreamingSnapshotOperator

ROOT = Path(__file__).resolve().parents[2]


def keyword_params(func):
    return [p for p in inspect.signature(func).parameters.values() if p.kind is p.KEYWORD_ONLY]


def expected_default(arg):
    if arg.required:
        return inspect.Parameter.empty
    if arg.airflow_option:
        from airflow.sdk.configuration import conf

        return conf.getboolean(*arg.airflow_option, fallback=arg.default)
    return arg.default


@pytest.mark.parametrize(
    ("func", "args"),
    [(ShardedWriteOperator.__init__, write_args.OPERATOR_ARGS), (build_write_config, write_args.CONFIG_ARGS)],
    ids=["ShardedWriteOperator", "build_write_config"],
)
def test_signature_follows_the_declaration(func, args):
    params = keyword_params(func)
    assert [p.name for p in params] == [a.name for a in args]  # same names, same order
    for param, arg in zip(params, args, strict=False):
        assert param.annotation == arg.type, param.name
        assert param.default == expected_default(arg), param.name


def test_template_fields_and_renderers_follow_the_declaration():
    assert tuple(ShardedWriteOperator.template_fields) == tuple(
        a.name for a in WRITE_ARGS if a.operator and a.templated)
    assert ShardedWriteOperator.template_fields_renderers == {
        a.name: a.renderer for a in WRITE_ARGS if a.operator and a.templated and a.renderer}
    # A renderer on an argument Airflow never renders would be a silent no-op.
    assert all(a.templated and a.operator for a in WRITE_ARGS if a.renderer)


def param_docs(cls) -> list[tuple[str, str]]:
    """``(name, text)`` of each ``:param:`` of the class docstring, continuation lines joined."""
    doc = inspect.getdoc(cls) or ""
    return [(m[1], " ".join(m[2].split()))
            for m in re.finditer(r"^:param (\w+): (.*(?:\n[ \t]+\S.*)*)", doc, flags=re.MULTILINE)]


def test_the_static_param_docs_are_the_declared_ones():
    """The docstring is written out (Sphinx, the registry and IDEs read it statically); it must say
    exactly what the table declares: every operator argument once, in order, nothing else."""
    documented = param_docs(ShardedWriteOperator)
    assert [name for name, _ in documented] == [a.name for a in write_args.OPERATOR_ARGS]
    for (name, text), arg in zip(documented, write_args.OPERATOR_ARGS, strict=True):
        suffix = " (templated)" if arg.templated else ""
        assert text == f"{arg.doc}{suffix}", name


# The streaming operator's own wording of two shared arguments (what they mean for a stream's batches).
STREAM_REWORDED = {"delete_column", "max_chain_depth"}


def test_the_streaming_operator_restates_its_write_arguments_as_declared():
    from airflow_provider_shardyfusion.operators.streaming_snapshot import _WRITE_FIELDS

    shared = [a for a in write_args.OPERATOR_ARGS if a.name in _WRITE_FIELDS]
    assert [a.name for a in shared] == list(_WRITE_FIELDS) and "key_column" in _WRITE_FIELDS
    params = [p for p in keyword_params(StreamingSnapshotOperator.__init__) if p.name in _WRITE_FIELDS]
    assert [p.name for p in params] == list(_WRITE_FIELDS)  # same order as the declaration
    for param, arg in zip(params, shared, strict=True):
        assert (param.annotation, param.default) == (arg.type, expected_default(arg)), param.name
    assert set(_WRITE_FIELDS) <= set(StreamingSnapshotOperator.template_fields)
    documented = dict(param_docs(StreamingSnapshotOperator))
    assert set(_WRITE_FIELDS) <= set(documented)
    for arg in shared:
        if arg.name not in STREAM_REWORDED:
            assert documented[arg.name] == f"{arg.doc} (templated)", arg.name
    assert set(_WRITE_FIELDS) >= STREAM_REWORDED


def test_the_operator_hands_every_shared_argument_to_build_write_config():
    config_params = {p.name for p in keyword_params(build_write_config)}
    assert set(write_args.OPERATOR_CONFIG_ARGS) <= config_params
    assert set(write_args.OPERATOR_CONFIG_ARGS) == {a.name for a in WRITE_ARGS if a.operator and a.config}


def test_write_options_defaults_are_the_declared_ones():
    for field in dataclasses.fields(WriteOptions):
        if field.name in write_args.BY_NAME:
            assert field.default == write_args.BY_NAME[field.name].default, field.name


def test_declaration_is_well_formed():
    names = [a.name for a in WRITE_ARGS]
    assert len(set(names)) == len(names)
    assert all(a.operator or a.config for a in WRITE_ARGS)
    assert all(a.doc.strip() and a.doc.rstrip().endswith(".") for a in WRITE_ARGS)
    assert [a.name for a in WRITE_ARGS if a.required] == ["output_uri"]
    assert all(not a.templated for a in WRITE_ARGS if not a.operator)  # Airflow renders operator fields only
    assert repr(REQUIRED) == "REQUIRED"


def test_write_defaults_are_typed_as_declared_and_frozen():
    """``DEFAULTS`` is a frozen ``WriteDefaults``: one field per optional argument, annotated exactly as the
    declaration spells the type, holding the declared default; a required argument has none."""
    fields = dataclasses.fields(write_args.WriteDefaults)
    optional = [a for a in WRITE_ARGS if not a.required]
    assert [(f.name, f.type) for f in fields] == [(a.name, a.type) for a in optional]
    assert all(getattr(write_args.DEFAULTS, a.name) == a.default for a in optional)
    assert not hasattr(write_args.DEFAULTS, "output_uri")
    with pytest.raises(dataclasses.FrozenInstanceError):
        write_args.DEFAULTS.batch_size = 1  # type: ignore[misc]


def test_deferrable_defaults_to_the_airflow_option():
    code = (
        "import inspect, json\n"
        "from airflow_provider_shardyfusion.operators.sharded_write import ShardedWriteOperator as Op\n"
        "print(json.dumps(inspect.signature(Op.__init__).parameters['deferrable'].default))\n"
    )
    answers = {}
    for value in ("True", "False"):
        env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": value}
        proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        answers[value] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answers == {"True": True, "False": False}
