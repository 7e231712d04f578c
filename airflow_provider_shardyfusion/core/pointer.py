"""The ``_CURRENT`` pointer: the only mutable object readers follow (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import layout, serialization as ser
from .errors import ManifestValidationError, ObjectNotFoundError

if TYPE_CHECKING:
    from .storage.base import ObjectStore

CURRENT_FORMAT_VERSION = 1
MANIFEST_CONTENT_TYPE = "application/json"
_WHAT = "_CURRENT pointer"


@dataclass(frozen=True)
class CurrentPointer:
    manifest_ref: str
    run_id: str
    updated_at: datetime
    manifest_content_type: str = MANIFEST_CONTENT_TYPE
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version, "manifest_ref": self.manifest_ref,
            "manifest_content_type": self.manifest_content_type, "run_id": self.run_id,
            "updated_at": ser.ts_str(self.updated_at),
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> CurrentPointer:
        return ser.parse_object(cls._from_dict, obj, _WHAT, ManifestValidationError)

    @classmethod
    def _from_dict(cls, obj: dict[str, Any]) -> CurrentPointer:
        err = ManifestValidationError
        run_id = ser.require(obj, "run_id", str, _WHAT, err)
        try:
            layout.validate_run_id(run_id)
        except Exception as exc:
            raise err(f"{_WHAT}: {exc}") from None
        return cls(
            manifest_ref=ser.require(obj, "manifest_ref", str, _WHAT, err),
            run_id=run_id,
            updated_at=ser.ts_field(obj, "updated_at", _WHAT, err),  # type: ignore[arg-type]
            manifest_content_type=ser.require(obj, "manifest_content_type", str, _WHAT, err),
            format_version=ser.require(obj, "format_version", int, _WHAT, err),
        )

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> CurrentPointer:
        return cls.from_dict(ser.loads_object(data, _WHAT, ManifestValidationError, CURRENT_FORMAT_VERSION))


def read_current(store: ObjectStore) -> tuple[CurrentPointer | None, str | None]:
    """The pointer under ``store``'s root and its etag (for a conditional replace), or ``(None, None)``."""
    try:
        obj = store.get(layout.CURRENT_KEY)
    except ObjectNotFoundError:
        return None, None
    return CurrentPointer.from_bytes(obj.data), obj.etag
