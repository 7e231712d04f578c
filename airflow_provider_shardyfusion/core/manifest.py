"""The immutable manifest of one published snapshot (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import encoding, layout, routing
from . import serialization as ser
from .errors import ManifestValidationError

if TYPE_CHECKING:
    from collections.abc import Callable

MANIFEST_FORMAT_VERSION = 1
# How a shard's files are laid out, recorded as storage_engine["shard_layout"]: "db", a RocksDB
# database folder (CURRENT, MANIFEST-*, *.sst; manifests without the key), or "sst", only the SST
# file(s) of the shard, one per sort run, which a reader ingests into a local database in order.
SHARD_LAYOUT_DB = "db"
SHARD_LAYOUT_SST = "sst"
SHARD_LAYOUTS = (SHARD_LAYOUT_DB, SHARD_LAYOUT_SST)
_WHAT = "manifest"
_ERR = ManifestValidationError


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard as the writer uploaded it: name relative to ``db_url``, size and checksum."""

    name: str
    size: int
    checksum: str  # "<algorithm>:<hex>", see core.checksum

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardFile:
        what = f"{_WHAT} shard file"
        shard_file = ser.from_plain(cls, obj, what, _ERR)
        if any(part in ("", ".", "..") for part in shard_file.name.split("/")):
            raise _ERR(f"{what}: name {shard_file.name!r} must be a relative path without '.' or '..'")
        return shard_file


@dataclass(frozen=True)
class ShardEntry:
    """One non-empty shard of a snapshot: where its winning attempt lives, its rows, bytes, key range and files."""

    db_id: int
    db_url: str
    attempt: int
    task_attempt_id: int | None
    row_count: int
    byte_size: int
    min_key: str  # hex of the encoded key
    max_key: str
    files: tuple[ShardFile, ...] = field(default=(), metadata={"entry": "file"})

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardEntry:
        return ser.from_plain(cls, obj, f"{_WHAT} shard", _ERR)


@dataclass(frozen=True)
class ShardingInfo:
    """The resolved sharding of a snapshot: the one model the writer routes by and readers rebuild."""

    strategy: routing.Strategy
    key_column: str
    hash_algorithm: str = routing.HASH_ALGORITHM
    cel_expr: str | None = None
    cel_columns: dict[str, Any] | None = None  # column -> CEL type; checked by Manifest.validate
    cel_mode: routing.CelMode | None = None
    routing_values: tuple[Any, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardingInfo:
        return ser.from_plain(cls, obj, f"{_WHAT} sharding", _ERR)

    def routing_columns(self) -> tuple[str, ...]:
        """The columns routing reads: the CEL columns, or the key column alone."""
        return tuple(self.cel_columns) if self.strategy == "cel" and self.cel_columns else (self.key_column,)

    def cel_spec(self, num_dbs: int) -> routing.CelSpec:
        return routing.CelSpec(expr=self.cel_expr or "", columns=dict(self.cel_columns or {}),
                               mode=self.cel_mode or "direct", num_dbs=num_dbs, routing_values=self.routing_values)


@dataclass(frozen=True)
class Manifest:
    """The immutable description of one written run (SPEC §7): routing, encodings, the sparse shard list, stats."""

    run_id: str
    created_at: datetime
    output_uri: str
    num_dbs: int
    sharding: ShardingInfo
    key_encoding: encoding.KeyEncoding
    value_format: encoding.ValueFormat
    shards: tuple[ShardEntry, ...] = field(metadata={"entry": "shard"})
    value_columns: tuple[str, ...] = field(default_factory=tuple)
    storage_engine: dict[str, Any] = field(default_factory=lambda: {"name": "rocksdb"})
    stats: dict[str, Any] = field(default_factory=dict)
    writer: dict[str, Any] = field(default_factory=dict)
    # When the writer's run started: the never-backwards rule of a publish compares runs by it.
    run_started_at: datetime | None = None
    format_version: int = MANIFEST_FORMAT_VERSION

    def validate(self) -> Manifest:
        """Reject every unsafe or inconsistent manifest (SPEC §7); return self for chaining."""
        if self.format_version > MANIFEST_FORMAT_VERSION or self.format_version < 1:
            raise _ERR(f"{_WHAT}: format_version {self.format_version} is not supported (max {MANIFEST_FORMAT_VERSION})")
        root = self._checked(self._validate_fields)
        self._validate_sharding()
        self._validate_shards(root)
        return self

    def _checked(self, check: Callable[[], Any]) -> Any:
        """``check()``, its error restated as this manifest's (naming the run)."""
        try:
            return check()
        except Exception as exc:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: {exc}") from None

    def _validate_fields(self) -> str:
        layout.validate_run_id(self.run_id)
        root = layout.normalize_root(self.output_uri)
        routing.validate_num_dbs(self.num_dbs)
        encoding.validate_key_encoding(self.key_encoding)
        encoding.validate_value_format(self.value_format)
        return root

    def _validate_sharding(self) -> None:
        sharding = self.sharding
        if sharding.hash_algorithm != routing.HASH_ALGORITHM:
            raise _ERR(
                f"{_WHAT}: hash_algorithm {sharding.hash_algorithm!r} is unknown (expected {routing.HASH_ALGORITHM!r})"
            )
        if sharding.strategy not in routing.STRATEGIES:
            raise _ERR(f"{_WHAT}: sharding strategy {sharding.strategy!r} is unknown")
        if sharding.strategy == "cel":
            self._validate_cel()
        if sharding.routing_values is not None:
            self._checked(lambda: routing.validate_routing_values(sharding.routing_values))
            if len(sharding.routing_values) != self.num_dbs:
                raise _ERR(f"{_WHAT}: routing_values has {len(sharding.routing_values)} values but num_dbs is {self.num_dbs}")
        if sharding.cel_mode == "categorical" and sharding.routing_values is None:
            raise _ERR(f"{_WHAT}: categorical CEL sharding needs routing_values")

    def _validate_cel(self) -> None:
        sharding = self.sharding
        if not sharding.cel_expr or sharding.cel_mode not in routing.CEL_MODES or not sharding.cel_columns:
            raise _ERR(f"{_WHAT}: CEL sharding needs cel_expr, cel_columns and cel_mode in {list(routing.CEL_MODES)}")
        columns = self._checked(lambda: routing.normalize_cel_columns(sharding.cel_columns))
        # The writer resolves every type from the Spark schema; a reader cannot.
        untyped = sorted(name for name, typ in columns.items() if typ is None)
        if untyped:
            raise _ERR(f"{_WHAT}: cel_columns {untyped} have no CEL type (expected one of {list(routing.CEL_TYPES)})")

    def _validate_shards(self, root: str) -> None:
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

    @property
    def shard_layout(self) -> str:
        return str(self.storage_engine.get("shard_layout", SHARD_LAYOUT_DB))

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
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Manifest:
        return ser.parse_object(cls._from_dict, obj, _WHAT, _ERR)

    @classmethod
    def _from_dict(cls, obj: dict[str, Any]) -> Manifest:
        manifest = ser.from_plain(cls, obj, _WHAT, _ERR)
        if manifest.run_started_at is None and isinstance(manifest.stats.get("run_started_at"), str):
            # Manifests written before the field existed kept it in stats only.
            started = ser.ts_field(manifest.stats, "run_started_at", _WHAT, _ERR)
            manifest = replace(manifest, run_started_at=started)
        return manifest.validate()

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        return cls.from_dict(ser.loads_object(data, _WHAT, _ERR, MANIFEST_FORMAT_VERSION))
