"""The immutable manifest of one published snapshot (SPEC §7)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError
from airflow_provider_shardyfusion.core.model import encoding, routing
from airflow_provider_shardyfusion.core.model.value_schema import ValueSchema

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CHAIN_DOCUMENT_FORMAT_VERSION", "CHAIN_FORMAT_VERSION", "FULL_FORMAT_VERSION", "MANIFEST_FORMAT_VERSION", "SHARD_LAYOUTS",
    "SHARD_LAYOUT_DB", "SHARD_LAYOUT_SST", "WRITE_MODES", "LayerCounts", "Manifest", "ShardEntry", "ShardFile",
    "ShardLayer", "ShardingInfo", "WriteMode", "stored_files",
]

# 1: full snapshots. 2: snapshots with a chain (SPEC §13): base_run_id, chain_depth, per-shard layers,
# every inherited layer restated. 3: a delta's chain document (SPEC §17): only the shards it changed,
# only its own layers, and the base's manifest named by reference and checksum.
# Full snapshots are still written as 1, so readers that predate deltas keep reading them.
MANIFEST_FORMAT_VERSION = 3
FULL_FORMAT_VERSION = 1
CHAIN_FORMAT_VERSION = 2
CHAIN_DOCUMENT_FORMAT_VERSION = 3
WRITE_MODES = ("full", "delta", "compact")
WriteMode = Literal["full", "delta", "compact"]
# How a shard's files are laid out, recorded as storage_engine["shard_layout"]: "db", a RocksDB
# database folder (CURRENT, MANIFEST-*, *.sst; manifests without the key), or "sst", only the SST
# file(s) of the shard, one per sort run, which a reader ingests into a local database in order.
SHARD_LAYOUT_DB = "db"
SHARD_LAYOUT_SST = "sst"
SHARD_LAYOUTS = (SHARD_LAYOUT_DB, SHARD_LAYOUT_SST)
_WHAT = "manifest"
_ERR = ManifestValidationError


@dataclass(frozen=True, slots=True)
class ShardFile:
    """One file of a shard as the writer uploaded it: name relative to ``db_url``, size and checksum."""

    name: str
    size: int
    checksum: str  # "<algorithm>:<hex>", see core.model.checksum

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardFile:
        return _FILE_CODEC.from_dict(obj)

    def validate(self) -> ShardFile:
        _check_file_name(self.name)
        return self


def stored_files(files: tuple[ShardFile, ...], key_index: ShardFile | None) -> tuple[ShardFile, ...]:
    """Every file of a shard's layer on storage: its data, then its key index if it has one."""
    return (*files, key_index) if key_index is not None else files


def _dotdot(url: str) -> bool:
    """Whether ``url`` has a ``..`` segment (the cheap substring test first: this runs once per shard)."""
    return "/.." in url and ".." in url.split("/")


def _check_file_name(name: str) -> None:
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise _ERR(f"{_WHAT} shard file: name {name!r} must be a relative path without '.' or '..'")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCounts:
    """What a layer did to the rows before it (deleted_absent: tombstones of keys not there)."""

    puts: int = 0
    deletes: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    deleted_absent: int = 0

    @property
    def row_delta(self) -> int:
        return self.inserted - self.deleted

    @property
    def consistent(self) -> bool:
        """None negative, puts = inserted + updated, deletes = deleted + deleted_absent."""
        return (min(self.puts, self.deletes, self.inserted, self.updated, self.deleted, self.deleted_absent) >= 0
                and self.inserted + self.updated == self.puts and self.deleted + self.deleted_absent == self.deletes)

    def to_dict(self) -> dict[str, int]:
        return ser.to_plain(self)


_COUNT_FIELDS = tuple(f.name for f in fields(LayerCounts))


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardLayer(LayerCounts):
    """One layer of a shard in a chain: the SST file(s) one run wrote for it, oldest first in a shard.

    A ``full`` layer holds the shard's whole data (a full write or a compaction); a ``delta``
    layer holds the puts and point tombstones of one delta run. Its counts (``LayerCounts``, which
    it extends) say what the layer did to the rows before it.
    """

    # The counts are inherited rather than held as one field: the manifest stores them flat beside
    # run_id and files, and stored manifests keep their bytes (and checksums) for older readers.
    run_id: str
    db_url: str
    kind: Literal["full", "delta"]
    files: tuple[ShardFile, ...] = field(default=(), metadata={"entry": "file"})
    # The layer's keys alone (KEY_INDEX_FILE): an empty value per put, a point tombstone per deletion.
    # Never data: a writer ingests it to learn which keys exist; readers ingest ``files`` only.
    key_index: ShardFile | None = field(default=None, metadata={"omit_none": True})

    @property
    def byte_size(self) -> int:
        """Bytes of the layer's data (its key index is not data)."""
        return sum(f.size for f in self.files)

    @property
    def counts(self) -> LayerCounts:
        """The layer's counts alone (a ``LayerCounts``, not the layer)."""
        return LayerCounts(**{name: getattr(self, name) for name in _COUNT_FIELDS})

    @classmethod
    def of(cls, run_id: str, db_url: str, kind: Literal["full", "delta"], files: tuple[ShardFile, ...],
           key_index: ShardFile | None, counts: LayerCounts) -> ShardLayer:
        """A layer with ``counts``."""
        return cls(run_id=run_id, db_url=db_url, kind=kind, files=files, key_index=key_index,
                   **{name: getattr(counts, name) for name in _COUNT_FIELDS})

    def stored_files(self) -> tuple[ShardFile, ...]:
        return stored_files(self.files, self.key_index)

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardLayer:
        return _LAYER_CODEC.from_dict(obj)


@dataclass(frozen=True, slots=True)
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
    # The shard's key index (see ShardLayer.key_index); absent in manifests written before it existed.
    key_index: ShardFile | None = field(default=None, metadata={"omit_none": True})
    # A chain's shard (format 2): every layer, oldest first; db_url / files are then the newest
    # layer's and byte_size the sum of all. Empty for a full snapshot's shard: db_url / files are it.
    layers: tuple[ShardLayer, ...] = field(default_factory=tuple, metadata={"entry": "layer"})

    def all_layers(self) -> tuple[ShardLayer, ...]:
        """The layers a reader ingests, oldest first (one full layer for a shard without ``layers``)."""
        if self.layers:
            return self.layers
        try:
            run_id = layout.run_id_of_shard_url(self.db_url)
        except ConfigError as exc:  # validate() refuses such a manifest; say so in its terms
            raise _ERR(f"{_WHAT} shard {self.db_id}: {exc}") from None
        return (ShardLayer.of(run_id, self.db_url, "full", self.files, self.key_index,
                              LayerCounts(puts=self.row_count, inserted=self.row_count)),)

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> ShardEntry:
        return _ENTRY_CODEC.from_dict(obj)


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
        return _SHARDING_CODEC.from_dict(obj)

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
    # A chain (SPEC §13): the run this one was written on (null for a full write; a compaction keeps
    # it, so it too goes live only on its base), and how many delta runs separate it from a full layer.
    base_run_id: str | None = None
    chain_depth: int = 0
    write_mode: WriteMode = "full"
    format_version: int = FULL_FORMAT_VERSION
    # A chain document (format 3): the base run's manifest and the checksum of its bytes. In memory
    # (``core.model.chain.resolve``) the manifest lists every shard with all its layers, as format 2 did;
    # stored (``to_bytes``), only what this run changed.
    base_manifest_ref: str | None = None
    base_manifest_checksum: str | None = None
    # SPEC §18: the value columns' types (JSON values), and which encoder wrote the value bytes
    # (None: the Python encoder of earlier versions). Left out when None: older manifests keep their bytes.
    value_schema: ValueSchema | None = field(default=None, metadata={"omit_none": True})
    value_encoding_version: int | None = field(default=None, metadata={"omit_none": True})

    def validate(self) -> Manifest:
        """Reject every unsafe or inconsistent manifest (SPEC §7); return self for chaining."""
        if self.format_version > MANIFEST_FORMAT_VERSION or self.format_version < 1:
            raise _ERR(f"{_WHAT}: format_version {self.format_version} is not supported (max {MANIFEST_FORMAT_VERSION})")
        root = self._checked(self._validate_fields)
        self._validate_sharding()
        self._validate_shards(root)
        self._validate_file_names()
        self._validate_chain()
        return self

    def _validate_file_names(self) -> None:
        # Shards mostly share their few file names: check each distinct name once.
        names = {f.name for s in self.shards for f in s.files}
        names.update(s.key_index.name for s in self.shards if s.key_index is not None)
        names.update(f.name for s in self.shards if s.layers for layer in s.layers for f in layer.stored_files())
        for name in names:
            _check_file_name(name)

    def _validate_chain(self) -> None:
        chained = self.base_run_id is not None or self.chain_depth or any(s.layers for s in self.shards)
        if chained and self.format_version < CHAIN_FORMAT_VERSION:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: base_run_id, chain_depth and shard layers need "
                       f"format_version {CHAIN_FORMAT_VERSION}, not {self.format_version}")
        if self.write_mode not in WRITE_MODES:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: write_mode {self.write_mode!r} is not one of {list(WRITE_MODES)}")
        if self.chain_depth < 0:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: chain_depth {self.chain_depth} is negative")
        if self.base_run_id is not None:
            self._checked(lambda: layout.validate_run_id(self.base_run_id))
            if self.base_run_id == self.run_id:
                raise _ERR(f"{_WHAT} of run {self.run_id!r}: base_run_id names the run itself")
        if (self.write_mode == "delta") != (self.chain_depth > 0):
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: write_mode {self.write_mode!r} with chain_depth {self.chain_depth}")
        if self.write_mode != "full" and self.base_run_id is None:
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: a {self.write_mode} run needs base_run_id")
        referenced = self.base_manifest_ref is not None or self.base_manifest_checksum is not None
        if self.is_chain_document != referenced or (referenced and not (self.base_manifest_ref and self.base_manifest_checksum)):
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: base_manifest_ref and base_manifest_checksum go together, "
                       f"in format_version {CHAIN_DOCUMENT_FORMAT_VERSION} only (this one is {self.format_version})")
        if self.is_chain_document and self.write_mode != "delta":
            raise _ERR(f"{_WHAT} of run {self.run_id!r}: format_version {CHAIN_DOCUMENT_FORMAT_VERSION} is for delta runs, "
                       f"not {self.write_mode!r}")

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
        # Once per shard, so per-shard work is string tests only: each run's prefix is built (and
        # its run id validated) once, so decoding stays within SPEC §17's bound against json.loads.
        own_prefix = self._run_prefix(root, self.run_id, {})
        prefixes: dict[str, str] = {}
        seen: set[int] = set()
        for shard in self.shards:
            db_id = shard.db_id
            if not 0 <= db_id < self.num_dbs:
                raise _ERR(f"{_WHAT}: shard db_id {db_id} is outside [0, {self.num_dbs})")
            if db_id in seen:
                raise _ERR(f"{_WHAT}: shard db_id {db_id} appears more than once")
            seen.add(db_id)
            if shard.layers:
                self._validate_layers(root, shard, prefixes)
            else:
                own_db = own_prefix + layout.shard_db_dir(db_id)
                if not shard.db_url.startswith(own_db) or _dotdot(shard.db_url):
                    raise _ERR(
                        f"{_WHAT}: db_url {shard.db_url!r} of shard {db_id} is not under this snapshot's "
                        f"{own_prefix!r} in its own folder {own_db!r}"
                    )
            if shard.row_count < 0 or shard.byte_size < 0:
                raise _ERR(f"{_WHAT}: shard {db_id} has negative row_count or byte_size")

    def _run_prefix(self, root: str, run_id: str, prefixes: dict[str, str]) -> str:
        """``run_id``'s shard folder under ``root``, its run id validated on first use (memo: ``prefixes``)."""
        prefix = prefixes.get(run_id)
        if prefix is None:
            prefix = prefixes[run_id] = layout.join(root, self._checked(functools.partial(layout.shards_prefix, run_id)))
        return prefix

    def _validate_layers(self, root: str, shard: ShardEntry, prefixes: dict[str, str]) -> None:
        """Each layer in its own run's folder for this shard, each run once, the newest one the entry's."""
        runs: set[str] = set()
        for i, layer in enumerate(shard.layers):
            own_db = self._run_prefix(root, layer.run_id, prefixes) + layout.shard_db_dir(shard.db_id)
            where = f"{_WHAT}: layer {i} ({layer.run_id!r}) of shard {shard.db_id}"
            if not layer.db_url.startswith(own_db) or _dotdot(layer.db_url):
                raise _ERR(f"{where}: db_url {layer.db_url!r} is not in that run's folder {own_db!r}")
            if layer.run_id in runs:
                raise _ERR(f"{where}: the run has a layer in this shard already")
            runs.add(layer.run_id)
            if layer.kind == "full" and i:
                raise _ERR(f"{where}: a full layer can only be the oldest")
            if not layer.files:
                raise _ERR(f"{where}: lists no files")
            if not layer.consistent:
                raise _ERR(f"{where}: counts are negative or inconsistent (puts = inserted + updated, "
                           "deletes = deleted + deleted_absent)")
        newest = shard.layers[-1]
        if (shard.db_url, shard.files, shard.key_index) != (newest.db_url, newest.files, newest.key_index):
            raise _ERR(f"{_WHAT}: shard {shard.db_id}: db_url, files and key_index must be its newest layer's")

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
    def is_chain_document(self) -> bool:
        """Stored as the change alone (format 3): reading it means following ``base_manifest_ref``."""
        return self.format_version == CHAIN_DOCUMENT_FORMAT_VERSION

    def stored_document(self) -> Manifest:
        """What is stored for this run: itself, or for a chain document only the shards it changed
        (each with only this run's layers; row counts and key ranges are the resulting shard's)."""
        if not self.is_chain_document:
            return self
        changed = []
        for s in self.shards:
            own = tuple(layer for layer in s.layers if layer.run_id == self.run_id)
            if own:
                changed.append(s if own == s.layers else replace(s, layers=own))
        return replace(self, shards=tuple(changed))

    @property
    def is_chain(self) -> bool:
        """Written on a base run (a delta or a compaction), so it goes live only on that base."""
        return self.base_run_id is not None

    def layer_run_ids(self) -> set[str]:
        """Every run whose shard files this snapshot reads: its own and, in a chain, earlier ones."""
        # Asked on every refresh of every reader (and by cleanup, history, publish) of an immutable
        # manifest: worked out once per manifest, as ``_by_id``.
        cached = self.__dict__.get("_layer_runs_cache")
        if cached is None:
            cached = frozenset({layer.run_id for s in self.shards for layer in s.all_layers()} | {self.run_id})
            object.__setattr__(self, "_layer_runs_cache", cached)
        return set(cached)

    def layer_bytes(self, run_id: str) -> int:
        """Bytes of the layers ``run_id`` wrote that this snapshot reads."""
        return sum(layer.byte_size for s in self.shards for layer in s.all_layers() if layer.run_id == run_id)

    @property
    def byte_size(self) -> int:
        return sum(s.byte_size for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Manifest:
        return _CODEC.from_dict(obj)

    def _decoded(self) -> Manifest:
        manifest = self
        if self.run_started_at is None and isinstance(self.stats.get("run_started_at"), str):
            # Manifests written before the field existed kept it in stats only.
            started = ser.ts_field(self.stats["run_started_at"], "run_started_at", _WHAT, _ERR)
            manifest = replace(self, run_started_at=started)
        return manifest.validate()

    def to_bytes(self) -> bytes:
        """The stored form (``stored_document``): a chain document holds only this run's change."""
        # A publish stores these bytes and records their checksum and size: encoded once (encoding a
        # manifest of 1000s of shards is a noticeable part of a small delta's whole write).
        cached = self.__dict__.get("_bytes_cache")
        if cached is None:
            cached = ser.dumps(self.stored_document().to_dict())
            object.__setattr__(self, "_bytes_cache", cached)
        return cached

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        return _CODEC.from_bytes(data)


# Written before chains existed, a manifest has no chain fields: their defaults make it a full snapshot.
_CODEC = ser.Codec(Manifest, _WHAT, _ERR, supported=MANIFEST_FORMAT_VERSION, finish=Manifest._decoded,
                   absent_ok=("chain_depth", "write_mode"))
_FILE_CODEC = ser.Codec(ShardFile, f"{_WHAT} shard file", _ERR, finish=ShardFile.validate)
_LAYER_CODEC = ser.Codec(ShardLayer, f"{_WHAT} shard layer", _ERR)
_ENTRY_CODEC = ser.Codec(ShardEntry, f"{_WHAT} shard", _ERR)
_SHARDING_CODEC = ser.Codec(ShardingInfo, f"{_WHAT} sharding", _ERR)
