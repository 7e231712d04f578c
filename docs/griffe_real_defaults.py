"""A Griffe extension of the docs build: the API reference shows each argument's real default.

The write arguments are declared once (``core.model.write_args``), so the signatures spell their
defaults ``_D.key_column``; read statically, the reference would print that expression, and its
"Default" column the bare name ``key_column``. This extension asks the imported function for its
default values and writes them in (``'id'``, ``50000``, ``True``) wherever the source has an
expression instead of a literal. mkdocs.yml loads it for mkdocstrings' Python handler.
"""

from __future__ import annotations

import ast
import inspect
from datetime import timedelta
from typing import Any

import griffe


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


def _shown(value: Any) -> str | None:
    """The value as a reader would type it, or None when it has no such spelling."""
    if isinstance(value, timedelta):
        return f"timedelta(seconds={value.total_seconds():g})"
    text = repr(value)
    return text if _literal(text) else None


class RealDefaults(griffe.Extension):
    """Replaces a non-literal default of a documented signature with the value it evaluates to."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        pending = [p for p in func.parameters if p.default is not None and not _literal(str(p.default))]
        if not pending:
            return
        try:
            runtime = inspect.signature(griffe.dynamic_import(func.path)).parameters
        except (ImportError, AttributeError, ValueError, TypeError):
            return  # not importable here: the source's spelling stays
        for param in pending:
            if param.name in runtime and (shown := _shown(runtime[param.name].default)) is not None:
                param.default = shown
