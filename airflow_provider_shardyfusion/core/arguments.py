"""One rule for operator arguments that may arrive as text.

Airflow renders a templated argument to text unless the DAG sets
``render_template_as_native_obj=True``: ``{{ params.n }}`` gives ``"16"``, a boolean ``"True"``, a
list ``"['a', 'b']"``, a timedelta ``"1:00:00"``. Every operator reads such values through these
functions, so text that is exactly the rendering of a value of the expected type is accepted
everywhere, and anything else is refused with one error that names the argument and the setting.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow_provider_shardyfusion.core.errors import ConfigError, show_value

__all__ = ["MAX_DURATION", "as_bool", "as_duration", "as_int", "as_list", "as_literal", "as_mapping", "as_number"]

_HINT = ("; a templated argument renders as text unless the DAG sets render_template_as_native_obj=True "
         "(or pass a literal value)")
# Durations are measured back from now (the cleanup's cutoff is now - grace_period): a century keeps
# anything a snapshot store holds, and far beyond it the clock arithmetic overflows.
MAX_DURATION = timedelta(days=36500)
# As str(timedelta) renders (at most 999999999 days): longer digit runs would overflow a float sum.
_DURATION = re.compile(r"^(?:(?P<days>-?\d{1,9}) days?, )?(?P<h>\d{1,2}):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)$")


def _refuse(name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{name} {show_value(value)} must be {expected}" + (_HINT if isinstance(value, str) else ""))


def as_bool(name: str, value: Any) -> bool:
    """``True``/``False``, or their rendering (``"True"``, ``"false"``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _refuse(name, value, "True or False")


def as_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """An integer (not a bool), or its rendering; at least ``minimum`` when given."""
    parsed = value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        parsed = int(value)
    if isinstance(parsed, bool) or not isinstance(parsed, int):
        raise _refuse(name, value, "an integer" + (f" >= {minimum}" if minimum is not None else ""))
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name} {parsed!r} must be an integer >= {minimum}")
    return parsed


def as_number(name: str, value: Any, *, minimum: float | None = None) -> float | int:
    """A finite number (not a bool), or its rendering; at least ``minimum`` when given."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = int(value) if re.fullmatch(r"\s*-?\d+\s*", value) else float(value)
        except ValueError:
            raise _refuse(name, value, "a number") from None
    if isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
        raise _refuse(name, value, "a number")
    if isinstance(parsed, float) and not math.isfinite(parsed):  # an int always is (isfinite overflows on a huge one)
        raise ConfigError(f"{name} {value!r} must be a finite number")
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name} {parsed!r} must be >= {minimum}")
    return parsed


def as_duration(name: str, value: Any) -> timedelta:
    """A ``timedelta`` from 0 to ``MAX_DURATION``, seconds, or the rendering of either (``"3600"``, ``"1:00:00"``,
    ``"1 day, 2:00:00"``)."""
    if isinstance(value, timedelta):
        seconds: float = value.total_seconds()
    elif isinstance(value, str) and (m := _DURATION.match(value.strip())):
        seconds = int(m["days"] or 0) * 86400 + int(m["h"]) * 3600 + int(m["m"]) * 60 + float(m["s"])
    else:
        try:
            seconds = as_number(name, value)
        except ConfigError:
            raise _refuse(name, value, "a timedelta or a number of seconds") from None
    # Checked on the number: building a timedelta of it (or subtracting one from now) may overflow.
    if seconds < 0:
        raise ConfigError(f"{name} {value!r} must be a timedelta (or seconds) >= 0")
    if seconds > MAX_DURATION.total_seconds():
        raise ConfigError(f"{name} {show_value(value)} must be at most {MAX_DURATION.days} days (100 years)")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _rendered(name: str, value: Any, expected: str) -> Any:
    """``value``, or the Python literal a text renders (refused, naming ``expected``, if it is none)."""
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        raise _refuse(name, value, expected) from None


def as_list(name: str, value: Any) -> list[Any]:
    """A list or tuple, or its rendering (``"['a', 'b']"``, ``'[1, 2]'``). A bare string is not a list."""
    parsed = _rendered(name, value, "a list")
    if not isinstance(parsed, (list, tuple)):
        raise _refuse(name, value, "a list")
    return list(parsed)


def as_literal(name: str, value: Any, types: tuple[type, ...], expected: str) -> Any:
    """A value of one of ``types`` (never a bool), or its rendering (``"3"``, ``"{'max_retries': 2}"``)."""
    parsed = _rendered(name, value, expected)
    if isinstance(parsed, bool) or not isinstance(parsed, types):
        raise _refuse(name, value, expected)
    return parsed


def as_mapping(name: str, value: Any) -> dict[str, Any] | None:
    """A mapping with string keys, or its rendering (``"{'header': 'true'}"``); ``None`` stays ``None``."""
    if value is None:
        return None
    parsed = _rendered(name, value, "a mapping of string keys")
    if not isinstance(parsed, Mapping) or not all(isinstance(k, str) for k in parsed):
        raise _refuse(name, value, "a mapping of string keys")
    return dict(parsed)
