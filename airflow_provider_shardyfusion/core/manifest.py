"""The immutable manifest of one published snapshot (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import encoding, layout, routing, serialization as ser
from .errors import ManifestValidationError, show_value

MANIFEST_FORMAT_VERSION = 1
_WHAT = "manifest"
_ERR = ManifestValidationError


@dataclass(frozen=True)
class ShardFile:
    name: str
    size: int
    checksum: str  # "<algorithm>:<hex>", see core.checksum

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "checksum": self.checksum}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardFile:
        what = f"{_WHAT} shard file"
        name = ser.require(obj, "name", str, what, _ERR)
        if any(part in ("", ".", "..") for part in name.split("/")):
            raise _ERR(f"{what}: name {name!r} must be a relative path without '.' or '..'")
        return cls(name=name, size=ser.require(obj, "size", int, what, _ERR),
                   checksum=ser.require(obj, "checksum", str, what, _ERR))


@dataclass(frozen=True)
class ShardEntry:
    db_id: int
    db_url: str
    attempt: int
    task_attempt_id: int | None
    row_count: int
    byte_size: int
    min_key: str  # hex of the encoded key
    max_key: str
    files: tuple[ShardFile, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "db_id": self.db_id, "db_url": self.db_url, "attempt": self.attempt,
            "task_attempt_id": self.task_attempt_id, "row_count": self.row_count, "byte_size": self.byte_size,
            "min_key": self.min_key, "max_key": self.max_key, "files": [f.to_dict() for f in self.files],
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardEntry:
        what = f"{_WHAT} shard"
        files = ser.require(obj, "files", list, what, _ERR)
        for bad in (f for f in files if not isinstance(f, dict)):
            raise _ERR(f"{what}: file entry {show_value(bad)} is not an object")
        return cls(
            db_id=ser.require(obj, "db_id", int, what, _ERR),
            db_url=ser.require(obj, "db_url", str, what, _ERR),
            attempt=ser.require(obj, "attempt", int, what, _ERR),
            task_attempt_id=ser.require(obj, "task_attempt_id", int, what, _ERR, optional=True),
            row_count=ser.require(obj, "row_count", int, what, _ERR),
            byte_size=ser.require(obj, "byte_size", int, what, _ERR),
            min_key=ser.require(obj, "min_key", str, what, _ERR),
            max_key=ser.require(obj, "max_key", str, what, _ERR),
            files=tuple(ShardFile.from_dict(f) for f in files),
        )


@dataclass(frozen=True)
class ShardingInfo:
    strategy: str  # "hash" | "cel"
    key_column: str
    hash_algorithm: str = routing.HASH_ALGORITHM
    cel_expr: str | None = None
    cel_columns: dict[str, str] | None = None
    cel_mode: str | None = None  # "direct" | "categorical"
    routing_values: tuple[Any, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy, "key_column": self.key_column, "hash_algorithm": self.hash_algorithm,
            "cel_expr": self.cel_expr, "cel_columns": self.cel_columns, "cel_mode": self.cel_mode,
            "routing_values": list(self.routing_values) if self.routing_values is not None else None,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardingInfo:
        what = f"{_WHAT} sharding"
        rv = ser.require(obj, "routing_values", list, what, _ERR, optional=True)
        return cls(
            strategy=ser.require(obj, "strategy", str, what, _ERR),
            key_column=ser.require(obj, "key_column", str, what, _ERR),
            hash_algorithm=ser.require(obj, "hash_algorithm", str, what, _ERR),
            cel_expr=ser.require(obj, "cel_expr", str, what, _ERR, optional=True),
            cel_columns=ser.require(obj, "cel_columns", dict, what, _ERR, optional=True),
            cel_mode=ser.require(obj, "cel_mode", str, what, _ERR, optional=True),
            routing_values=tuple(rv) if rv is not None else None,
        )


@dataclass(frozen=True)
class Manifest:
    run_id: str
    created_at: datetime
    output_uri: str
    num_dbs: int
    sharding: ShardingInfo
    key_encoding: str
    value_format: str
    shards: tuple[ShardEntry, ...]
    value_columns: tuple[str, ...] = ()
    storage_engine: dict[str, Any] = field(default_factory=lambda: {"name": "rocksdb"})
    stats: dict[str, Any] = field(default_factory=dict)
    writer: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_FORMAT_VERSION

    def validate(self) -> Manifest:
        """Reject every unsafe or inconsistent manifest (SPEC §7); return self for chaining."""
        if self.format_version > MANIFEST_FORMAT_VERSION or self.format_version < 1:
            raise _ERR(f"{_WHAT}: format_version {self.format_version} is not supported (max {MANIFEST_FORMAT_VERSION})")
        try:
            layout.validate_run_id(self.run_id)
            root = layout.normalize_root(self.output_uri)
            routing.validate_num_dbs(self.num_dbs)
            encoding.validate_key_encoding(self.key_encoding)
            encoding.validate_value_format(self.value_format)
        except Exception as exc:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: {exc}") from None
        if self.sharding.hash_algorithm != routing.HASH_ALGORITHM:
            raise _ERR(f"{_WHAT}: hash_algorithm {self.sharding.hash_algorithm!r} is unknown (expected {routing.HASH_ALGORITHM!r})")
        if self.sharding.strategy not in ("hash", "cel"):
            raise _ERR(f"{_WHAT}: sharding strategy {self.sharding.strategy!r} is unknown")
        if self.sharding.strategy == "cel":
            if not self.sharding.cel_expr or self.sharding.cel_mode not in routing.CEL_MODES or not self.sharding.cel_columns:
                raise _ERR(f"{_WHAT}: CEL sharding needs cel_expr, cel_columns and cel_mode in {list(routing.CEL_MODES)}")
            try:
                columns = routing.normalize_cel_columns(self.sharding.cel_columns)
            except Exception as exc:
                raise _ERR(f"{_WHAT} of run {self.run_id!r}: {exc}") from None
            # The writer resolves every type from the Spark schema; a reader cannot.
            untyped = sorted(name for name, typ in columns.items() if typ is None)
            if untyped:
                raise _ERR(f"{_WHAT}: cel_columns {untyped} have no CEL type (expected one of {list(routing.CEL_TYPES)})")
        if self.sharding.routing_values is not None:
            try:
                routing.validate_routing_values(self.sharding.routing_values)
            except Exception as exc:
                raise _ERR(f"{_WHAT} of run {self.run_id!r}: {exc}") from None
        if self.sharding.routing_values is not None and len(self.sharding.routing_values) != self.num_dbs:
            raise _ERR(
                f"{_WHAT}: routing_values has {len(self.sharding.routing_values)} values but num_dbs is {self.num_dbs}"
            )
        if self.sharding.cel_mode == "categorical" and self.sharding.routing_values is None:
            raise _ERR(f"{_WHAT}: categorical CEL sharding needs routing_values")
        own_prefix = layout.join(root, layout.shards_prefix(self.run_id))
        seen: set[int] = set()
        for shard in self.shards:
            if not 0 <= shard.db_id < self.num_dbs:
                raise _ERR(f"{_WHAT}: shard db_id {shard.db_id} is outside [0, {self.num_dbs})")
            if shard.db_id in seen:
                raise _ERR(f"{_WHAT}: shard db_id {shard.db_id} appears more than once")
            seen.add(shard.db_id)
            own_db = layout.join(root, layout.shard_db_prefix(self.run_id, shard.db_id))
            if not shard.db_url.startswith(own_db) or ".." in shard.db_url.split("/"):
                raise _ERR(
                    f"{_WHAT}: db_url {shard.db_url!r} of shard {shard.db_id} is not under this snapshot's "
                    f"{own_prefix!r} in its own folder {own_db!r}"
                )
            if shard.row_count < 0 or shard.byte_size < 0:
                raise _ERR(f"{_WHAT}: shard {shard.db_id} has negative row_count or byte_size")
        return self

    def shard(self, db_id: int) -> ShardEntry | None:
        return self._by_id.get(db_id)

    @property
    def _by_id(self) -> dict[int, ShardEntry]:
        cached = self.__dict__.get("_by_id_cache")
        if cached is None:
            cached = {s.db_id: s for s in self.shards}
            object.__setattr__(self, "_by_id_cache", cached)
        return cached

    @property
    def row_count(self) -> int:
        return sum(s.row_count for s in self.shards)

    @property
    def byte_size(self) -> int:
        return sum(s.byte_size for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version, "run_id": self.run_id,
            "created_at": ser.ts_str(self.created_at), "output_uri": self.output_uri, "num_dbs": self.num_dbs,
            "sharding": self.sharding.to_dict(), "key_encoding": self.key_encoding,
            "value_format": self.value_format, "value_columns": list(self.value_columns),
            "storage_engine": dict(self.storage_engine), "shards": [s.to_dict() for s in self.shards],
            "stats": dict(self.stats), "writer": dict(self.writer),
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Manifest:
        return ser.parse_object(cls._from_dict, obj, _WHAT, _ERR)

    @classmethod
    def _from_dict(cls, obj: dict[str, Any]) -> Manifest:
        sharding = ser.require(obj, "sharding", dict, _WHAT, _ERR)
        shards = ser.require(obj, "shards", list, _WHAT, _ERR)
        for bad in (s for s in shards if not isinstance(s, dict)):
            raise _ERR(f"{_WHAT}: shard entry {show_value(bad)} is not an object")
        value_columns = ser.require(obj, "value_columns", list, _WHAT, _ERR, optional=True) or []
        for bad in (c for c in value_columns if not isinstance(c, str)):
            raise _ERR(f"{_WHAT}: value_columns entry {show_value(bad)} is not a string")
        return cls(
            format_version=ser.require(obj, "format_version", int, _WHAT, _ERR),
            run_id=ser.require(obj, "run_id", str, _WHAT, _ERR),
            created_at=ser.ts_field(obj, "created_at", _WHAT, _ERR),  # type: ignore[arg-type]
            output_uri=ser.require(obj, "output_uri", str, _WHAT, _ERR),
            num_dbs=ser.require(obj, "num_dbs", int, _WHAT, _ERR),
            sharding=ShardingInfo.from_dict(sharding),
            key_encoding=ser.require(obj, "key_encoding", str, _WHAT, _ERR),
            value_format=ser.require(obj, "value_format", str, _WHAT, _ERR),
            value_columns=tuple(value_columns),
            storage_engine=dict(ser.require(obj, "storage_engine", dict, _WHAT, _ERR, optional=True) or {}),
            shards=tuple(ShardEntry.from_dict(s) for s in shards),
            stats=dict(ser.require(obj, "stats", dict, _WHAT, _ERR, optional=True) or {}),
            writer=dict(ser.require(obj, "writer", dict, _WHAT, _ERR, optional=True) or {}),
        ).validate()

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        return cls.from_dict(ser.loads_object(data, _WHAT, _ERR, MANIFEST_FORMAT_VERSION))
