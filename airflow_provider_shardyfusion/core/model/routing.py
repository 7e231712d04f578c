"""Routing contract shared bit for bit by the writer and the reader (SPEC §4).

Hash strategy: ``xxh3_64(canonical_bytes(key), seed=0) mod num_dbs``.
CEL strategy: an expression over typed columns with the helper ``shard_hash``, in three modes
(direct, categorical, inferred categorical). CEL programs are not picklable, so a ``CelRouter``
is rebuilt from its source wherever it is needed (driver and each executor).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import xxhash

from airflow_provider_shardyfusion.core.errors import (
    ConfigError,
    InputDataError,
    ShardAssignmentError,
    show_value,
    text_number_hint,
)

__all__ = [
    "CEL_MODES", "CEL_TYPES", "HASH_ALGORITHM", "MAX_NUM_DBS", "STRATEGIES", "CelMode", "CelRouter", "CelSpec", "CelType",
    "Strategy", "canonical_bytes", "compile_cel", "hash64", "normalize_cel_columns", "pack_int_key", "route_key", "shard_hash",
    "validate_cel_result_range", "validate_num_dbs", "validate_routing_values",
]

HASH_ALGORITHM = "xxh3_64"
Strategy = Literal["hash", "cel"]
CelMode = Literal["direct", "categorical"]
CelType = Literal["int", "uint", "string", "bytes", "double", "bool"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
CEL_TYPES: tuple[str, ...] = get_args(CelType)
CEL_MODES: tuple[str, ...] = get_args(CelMode)
_INT64 = struct.Struct("<q")
# The two primitives of the hash contract, exported for hot loops (the reader's multi_get) that
# must not redefine them: canonical bytes of an int (raises struct.error out of range) and the hash.
pack_int_key = _INT64.pack
hash64 = xxhash.xxh3_64_intdigest
_xxh3 = hash64



def canonical_bytes(key: Any) -> bytes:
    """int → 8-byte signed little-endian; str → UTF-8; bytes → as is."""
    if isinstance(key, bool):
        raise InputDataError(f"key {key!r} is a bool (rule: routing keys are int, str or bytes)")
    if isinstance(key, int):
        try:
            return _INT64.pack(key)
        except struct.error:
            raise InputDataError(
                f"key {show_value(key)} is outside the signed 64-bit range -2**63..2**63-1 (rule: integer routing keys)"
            ) from None
    if isinstance(key, str):
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputDataError(
                f"key {show_value(key)} is not valid Unicode text ({exc.reason}; rule: str keys route as UTF-8)"
            ) from None
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    if key is None:
        raise InputDataError("null key (rule: keys must not be null)")
    raise InputDataError(f"key {show_value(key)} of type {type(key).__name__} cannot be routed (rule: int, str or bytes)")


def shard_hash(key: Any) -> int:
    """Unsigned 64-bit xxh3 of the canonical bytes of ``key``."""
    return _xxh3(canonical_bytes(key))


def route_key(key: Any, num_dbs: int) -> int:
    return _xxh3(canonical_bytes(key)) % num_dbs


# Shard folders are ``db=<id:05d>`` and readers parse exactly five digits (core.layout).
MAX_NUM_DBS = 99_999


def validate_num_dbs(num_dbs: object, *, what: str = "num_dbs") -> int:
    if isinstance(num_dbs, bool) or not isinstance(num_dbs, int) or num_dbs < 1:
        raise ConfigError(f"{what} {show_value(num_dbs)} must be an integer >= 1{text_number_hint(num_dbs)}")
    if num_dbs > MAX_NUM_DBS:
        raise ConfigError(
            f"{what} {num_dbs} is above the maximum {MAX_NUM_DBS}: the snapshot layout names shard folders "
            "with five digits (db=00000..db=99999)"
        )
    return num_dbs


# ---- CEL -------------------------------------------------------------------------------------


def validate_routing_values(values: object) -> tuple[Any, ...]:
    """Unique, non-null, all str or all int (SPEC §4)."""
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(f"routing_values {show_value(values)} must be a non-empty list")
    if any(v is None for v in values):
        raise ConfigError("routing_values must not contain null")
    kinds = {
        "int" if isinstance(v, int) and not isinstance(v, bool) else "str" if isinstance(v, str) else "other"
        for v in values
    }
    if "other" in kinds or len(kinds) != 1:
        raise ConfigError(f"routing_values {show_value(values)} must be all strings or all integers")
    seen: set[Any] = set()
    dupes = [v for v in values if v in seen or seen.add(v)]  # type: ignore[func-returns-value]
    if dupes:
        raise ConfigError(f"routing_values must be unique; repeated: {show_value(dupes)}")
    return tuple(values)


def normalize_cel_columns(columns: object) -> dict[str, str | None]:
    """Mapping column → CEL type, or a list of names (types filled in later from the Spark schema)."""
    if isinstance(columns, Mapping):
        out: dict[str, str | None] = {}
        for name, typ in columns.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"cel_columns: column name {name!r} must be a non-empty string")
            if typ is not None and typ not in CEL_TYPES:
                raise ConfigError(f"cel_columns: type {typ!r} of column {name!r} is not one of {list(CEL_TYPES)}")
            out[name] = typ
        if not out:
            raise ConfigError("cel_columns must name at least one column")
        return out
    if isinstance(columns, (list, tuple)) and columns and all(isinstance(c, str) and c for c in columns):
        return {c: None for c in columns}
    raise ConfigError(f"cel_columns {show_value(columns)} must be a mapping column → CEL type or a non-empty list of names")


_CEL_RANGES = {"int": ", int is -2**63..2**63-1", "uint": ", uint is 0..2**64-1"}


def _cel_type(name: str) -> Any:
    from celpy import celtypes

    return {
        "int": celtypes.IntType, "uint": celtypes.UintType, "string": celtypes.StringType,
        "bytes": celtypes.BytesType, "double": celtypes.DoubleType, "bool": celtypes.BoolType,
    }[name]


def _cel_shard_hash(value: Any) -> Any:
    from celpy import celtypes

    if isinstance(value, celtypes.UintType):
        value = int(value)
        if value >= 1 << 63:
            raise InputDataError(f"shard_hash: uint {value} exceeds the signed 64-bit routing range")
    return celtypes.UintType(shard_hash(value if not isinstance(value, bytes) else bytes(value)))


def _plain(value: Any) -> Any:
    """CEL result → plain Python value (bool before int: BoolType subclasses int)."""
    from celpy import celtypes

    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, float):
        return float(value)
    return value


@dataclass(frozen=True)
class CelSpec:
    """Everything needed to rebuild a CEL router (plain data: picklable, JSON-able)."""

    expr: str
    columns: dict[str, str]  # column → CEL type, fully resolved
    mode: CelMode
    num_dbs: int
    routing_values: tuple[Any, ...] | None = None


class CelRouter:
    """Compiled CEL routing. Build one per process from a ``CelSpec``; never pickle it."""

    def __init__(self, spec: CelSpec):
        self.spec = spec
        self._program = compile_cel(spec.expr, spec.columns)
        self._converters = {name: _cel_type(typ) for name, typ in spec.columns.items()}
        self._positions = (
            {v: i for i, v in enumerate(spec.routing_values)} if spec.routing_values is not None else None
        )

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        """The raw (plain Python) result of the expression for ``row``."""
        activation = {}
        for name, conv in self._converters.items():
            value = row.get(name)
            if value is None:
                raise InputDataError(f"column {name!r}: null value in CEL routing column (rule: CEL inputs must not be null)")
            try:
                activation[name] = conv(value)
            except Exception as exc:
                typ = self.spec.columns[name]
                raise InputDataError(
                    f"column {name!r}: value {show_value(value)} of type {type(value).__name__} does not convert to "
                    f"its declared CEL type {typ} ({exc}; rule: CEL routing inputs must fit their declared type"
                    f"{_CEL_RANGES.get(typ, '')})"
                ) from None
        try:
            result = self._program.evaluate(activation)
        except InputDataError:
            raise
        except Exception as exc:
            raise ShardAssignmentError(f"CEL expression {self.spec.expr!r} failed on {show_value(dict(row))}: {exc}") from None
        from celpy.evaluation import CELEvalError

        if isinstance(result, CELEvalError):
            raise ShardAssignmentError(f"CEL expression {self.spec.expr!r} failed on {show_value(dict(row))}: {result}")
        return _plain(result)

    def shard_for_token(self, token: Any) -> int:
        assert self._positions is not None
        try:
            return self._positions[token]
        except (KeyError, TypeError):
            raise ShardAssignmentError(
                f"CEL expression {self.spec.expr!r} produced token {show_value(token)} which is not in routing_values "
                f"(rule: categorical routing; known tokens: {show_value(list(self.spec.routing_values or ()))})"
            ) from None

    def route(self, row: Mapping[str, Any]) -> int:
        result = self.evaluate(row)
        if self.spec.mode == "categorical":
            return self.shard_for_token(result)
        if isinstance(result, bool) or not isinstance(result, int):
            raise ShardAssignmentError(
                f"CEL expression {self.spec.expr!r} returned {show_value(result)} for {show_value(dict(row))}; "
                "direct mode needs an integer shard id"
            )
        if not 0 <= result < self.spec.num_dbs:
            raise ShardAssignmentError(
                f"CEL expression {self.spec.expr!r} returned shard id {result} for {show_value(dict(row))}, "
                f"outside [0, {self.spec.num_dbs}) (rule: direct mode)"
            )
        return result


def compile_cel(expr: str, columns: Mapping[str, str | None]) -> Any:
    """Compile ``expr`` and fail fast on syntax errors and undeclared names."""
    try:
        import celpy
        from celpy import celtypes
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise ConfigError(f"CEL routing needs cel-python: {exc}") from None
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(f"cel_expr {expr!r} must be a non-empty string")
    annotations: dict[str, Any] = {name: _cel_type(typ or "string") for name, typ in columns.items()}
    annotations["shard_hash"] = celtypes.FunctionType
    env = celpy.Environment(annotations=annotations)
    try:
        ast = env.compile(expr)
    except Exception as exc:
        raise ConfigError(f"cel_expr {expr!r} does not compile: {exc}") from None
    _check_identifiers(expr, ast, set(columns))
    return env.program(ast, functions={"shard_hash": _cel_shard_hash})


# Macros whose first argument binds a loop variable visible only in the remaining arguments.
_BINDING_MACROS = frozenset({"exists", "all", "exists_one", "map", "filter"})


def _check_identifiers(expr: str, ast: Any, allowed: set[str]) -> None:
    """Refuse names that are neither declared columns nor CEL built-ins (cel-python only finds them at run time)."""
    import lark

    builtins = {"shard_hash", "true", "false", "null", "int", "uint", "string", "bytes", "double", "bool",
                "size", "type", "has", "dyn", "list", "map", "timestamp", "duration"}
    unknown: set[str] = set()
    # Explicit stack, not recursion: the parse tree is ~10 levels deep per CEL nesting level.
    stack: list[tuple[Any, frozenset[str]]] = [(ast, frozenset())]
    while stack:
        node, bound = stack.pop()
        if not isinstance(node, lark.Tree):
            continue  # tokens: function names, field names, literals
        if node.data == "ident":
            name = str(node.children[0])
            if name not in allowed and name not in builtins and name not in bound:
                unknown.add(name)
            continue
        if node.data == "member_dot_arg" and len(node.children) == 3 and str(node.children[1]) in _BINDING_MACROS:
            target, _, args = node.children
            var = _macro_variable(args)
            if var is not None:
                stack.append((target, bound))
                stack.extend((arg, bound | {var}) for arg in args.children[1:])
                continue
        stack.extend((child, bound) for child in node.children)
    if unknown:
        raise ConfigError(
            f"cel_expr {expr!r} refers to {sorted(unknown)}, which are not in cel_columns {sorted(allowed)}"
        )


def _macro_variable(args: Any) -> str | None:
    """The loop variable of ``target.macro(var, body)``: the first argument when it is a bare name."""
    import lark

    if not isinstance(args, lark.Tree) or args.data != "exprlist" or len(args.children) < 2:
        return None
    node = args.children[0]
    while isinstance(node, lark.Tree) and node.data != "ident" and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def validate_cel_result_range(db_ids: Sequence[int], num_dbs: int) -> None:
    for db_id in db_ids:
        if not 0 <= db_id < num_dbs:
            raise ShardAssignmentError(f"shard id {db_id} is outside [0, {num_dbs})")
