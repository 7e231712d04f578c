"""The ``_CURRENT`` pointer: the only mutable object readers follow (SPEC §7).

Its bytes are parsed here and nowhere else (``parse_pointer``): the snapshot facade, the reader,
the CLI and the async trigger all hand raw bytes to it, so a pointer is checked the same way
wherever it is read. What a waiting sensor makes of a pointer (``PointerWait``) lives here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError

__all__ = [
    "CURRENT_FORMAT_VERSION", "MANIFEST_CONTENT_TYPE", "WAIT_MODES", "CurrentPointer", "PointerWait", "WaitMode",
    "parse_pointer",
]

CURRENT_FORMAT_VERSION = 1
MANIFEST_CONTENT_TYPE = "application/json"
_WHAT = "_CURRENT pointer"

WaitMode = Literal["exists", "changed", "run_id"]
WAIT_MODES: tuple[str, ...] = get_args(WaitMode)


@dataclass(frozen=True)
class CurrentPointer:
    """The ``_CURRENT`` pointer: which manifest is live, its checksum and size, and the run it replaced."""

    manifest_ref: str
    run_id: str
    updated_at: datetime
    manifest_content_type: str = MANIFEST_CONTENT_TYPE
    previous_run_id: str | None = None
    # What the manifest's bytes must hash to: a hand-edited manifest no longer matches its pointer.
    manifest_checksum: str | None = None
    manifest_size: int | None = None
    format_version: int = CURRENT_FORMAT_VERSION

    def check_root(self, root: str) -> None:
        """The manifest must lie under ``root/manifests/`` and belong to ``run_id`` (tamper check)."""
        try:
            key = layout.relative_key(root, self.manifest_ref)
        except ManifestValidationError as exc:
            raise ManifestValidationError(f"{_WHAT}: manifest_ref {exc}") from None
        parsed = layout.parse_manifest_key(key)
        if parsed is None or parsed.run_id != self.run_id:
            raise ManifestValidationError(
                f"{_WHAT}: manifest_ref {self.manifest_ref!r} is not a manifest of run {self.run_id!r} under {root}/manifests/"
            )

    def check_manifest_bytes(self, data: bytes, checksum: str | None = None) -> None:
        """Refuse manifest bytes that are not the ones this pointer was written for (``checksum``: the
        bytes' ``bytes_checksum`` if the caller has it, so a large manifest is hashed once)."""
        from airflow_provider_shardyfusion.core.model.checksum import bytes_checksum

        if self.manifest_size is not None and len(data) != self.manifest_size:
            raise ManifestValidationError(
                f"manifest {self.manifest_ref} is {len(data)} bytes but _CURRENT recorded {self.manifest_size}: "
                "it was changed after publishing; refusing to follow it"
            )
        if self.manifest_checksum is None:
            return
        if checksum is None or checksum.split(":", 1)[0] != self.manifest_checksum.split(":", 1)[0]:
            checksum = bytes_checksum(data, self.manifest_checksum)
        if checksum != self.manifest_checksum:
            raise ManifestValidationError(
                f"manifest {self.manifest_ref} does not match the checksum _CURRENT recorded: it was changed after "
                "publishing; refusing to follow it"
            )

    def to_dict(self) -> dict[str, Any]:
        return ser.to_plain(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> CurrentPointer:
        return _CODEC.from_dict(obj)

    def _decoded(self) -> CurrentPointer:
        for name in ("run_id", "previous_run_id"):
            value = getattr(self, name)
            if value is not None:
                try:
                    layout.validate_run_id(value, what=name)
                except ConfigError as exc:
                    raise ManifestValidationError(f"{_WHAT}: {exc}") from None
        return self

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> CurrentPointer:
        return _CODEC.from_bytes(data)


_CODEC = ser.Codec(CurrentPointer, _WHAT, ManifestValidationError, supported=CURRENT_FORMAT_VERSION,
                   finish=CurrentPointer._decoded)


def parse_pointer(data: bytes, root: str) -> CurrentPointer:
    """The one way a stored ``_CURRENT`` becomes a pointer: parsed, versioned, and tied to ``root``."""
    pointer = CurrentPointer.from_bytes(data)
    pointer.check_root(root)
    return pointer


@dataclass(frozen=True)
class PointerWait:
    """What a sensor waiting on ``_CURRENT`` wants; shared by the poke and the trigger.

    * ``exists``: any valid pointer (whose manifest loads: checked by the caller);
    * ``changed``: a pointer other than the baseline (``previous_manifest_ref``, else
      ``previous_run_id``; no baseline: there was no pointer, so any pointer);
    * ``run_id``: a pointer naming ``run_id``.
    """

    mode: WaitMode = "exists"
    run_id: str | None = None
    previous_run_id: str | None = None
    previous_manifest_ref: str | None = None

    def validate(self) -> PointerWait:
        if self.mode not in WAIT_MODES:
            raise ConfigError(f"mode {self.mode!r} is invalid: use one of {list(WAIT_MODES)}")
        if self.mode == "run_id":
            layout.validate_run_id(self.run_id, what="run_id (required by mode='run_id')")
        return self

    def satisfied_by(self, pointer: CurrentPointer) -> bool:
        if self.mode == "exists":
            return True
        if self.mode == "run_id":
            return pointer.run_id == self.run_id
        if self.previous_manifest_ref is not None:
            return pointer.manifest_ref != self.previous_manifest_ref
        if self.previous_run_id is not None:
            return pointer.run_id != self.previous_run_id
        return True
