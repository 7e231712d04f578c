"""The small object-store interface every back end implements (SPEC §3)."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core import serialization as ser
from airflow_provider_shardyfusion.core.errors import ConfigError, StorageError

if TYPE_CHECKING:
    import builtins
    from collections.abc import Iterable, Iterator

__all__ = ["AsyncObjectReader", "ObjectInfo", "ObjectStore", "StorageOptions", "StoredObject", "check_key"]


@dataclass(frozen=True)
class StorageOptions:
    """How to reach the store. Only the non-secret fields are ever persisted (``to_dict``).

    Credentials given here are used in-process (e.g. by the Airflow hook building a reader);
    they are excluded from ``repr`` and ``to_dict`` so they never reach manifests, run
    records, argv or logs. Without them boto3's default chain applies (env, profile, role).
    """

    endpoint_url: str | None = field(default=None, metadata={"omit_none": True})
    region_name: str | None = field(default=None, metadata={"omit_none": True})
    addressing_style: str | None = field(default=None, metadata={"omit_none": True})  # "path" | "virtual" | "auto"
    max_attempts: int = 5
    aws_access_key_id: str | None = ser.secret_field()
    aws_secret_access_key: str | None = ser.secret_field()
    aws_session_token: str | None = ser.secret_field()

    def validate(self) -> StorageOptions:
        if self.addressing_style not in (None, "path", "virtual", "auto"):
            raise ConfigError(
                f"storage_options.addressing_style {self.addressing_style!r} must be 'path', 'virtual' or 'auto'"
            )
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"storage_options.max_attempts {self.max_attempts!r} must be an integer >= 1")
        if self.endpoint_url is not None:
            _check_endpoint_url(self.endpoint_url)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The public fields that are set: what a config, a manifest or argv may carry."""
        return dict(ser.to_plain(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> StorageOptions:
        """Options given as a mapping (credentials included), checked; unknown keys are refused."""
        return _CODEC.from_dict(dict(data or {})).validate()


_CODEC = ser.Codec(StorageOptions, "storage_options", ConfigError, absent_ok=True, refuse_unknown=(StorageOptions,))


@dataclass(frozen=True)
class ObjectInfo:
    """A listed object: key, size and last modification time (``None`` when the store does not say)."""

    key: str
    size: int
    last_modified: datetime | None = None
    etag: str | None = None


@dataclass(frozen=True)
class StoredObject:
    """An object read from a store: its bytes and the etag a conditional put needs."""

    data: bytes
    etag: str


class ObjectStore(abc.ABC):
    """Objects addressed by keys relative to ``root`` (a normalized output URI)."""

    root: str

    def uri(self, key: str) -> str:
        return layout.join(self.root, key)

    def key_of(self, uri: str) -> str:
        return layout.relative_key(self.root, uri)

    def _check_key(self, key: object, *, prefix: bool = False) -> str:
        return check_key(self.root, key, prefix=prefix)

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> str:
        """Write atomically; return the new etag."""

    @abc.abstractmethod
    def put_if_match(
        self, key: str, data: bytes, etag: str | None, *, content_type: str = "application/json"
    ) -> str | None:
        """Write only if the object's etag is ``etag`` (``None``: only if absent).

        Return the new etag, or ``None`` if the object changed in between (nothing written).
        """

    def put_if_absent(self, key: str, data: bytes, *, content_type: str = "application/json") -> bool:
        return self.put_if_match(key, data, None, content_type=content_type) is not None

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject:
        """Raise ``ObjectNotFoundError`` if absent (a "folder" is not an object)."""

    @abc.abstractmethod
    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        """The object, or ``None`` if its etag is still ``etag`` (``etag=None``: always the object).

        A poll of a small mutable object (``_CURRENT``): on S3 a conditional GET (``If-None-Match``),
        which answers 304 without a body when nothing moved. Raise ``ObjectNotFoundError`` if absent.
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """``None`` if absent; otherwise ``etag`` is the one ``get`` returns, fit for ``put_if_match``."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order.

        An invalid prefix (see ``_check_key``) raises ``StorageError`` at the call, not on iteration.
        """

    @abc.abstractmethod
    def delete_many(self, keys: Iterable[str]) -> builtins.list[tuple[str, str]]:
        """Delete; absent keys are fine. Return ``(key, error)`` for each failure.

        Never raises for one bad key: an invalid key is reported as a failure, the others are deleted.
        """

    @abc.abstractmethod
    def upload_file(self, local_path: str, key: str) -> None:
        """A missing or unreadable ``local_path`` is a ``StorageError`` (not ``ObjectNotFoundError``)."""

    @abc.abstractmethod
    def download_file(self, key: str, local_path: str) -> None:
        """Raise ``ObjectNotFoundError`` if absent, ``StorageError`` if ``local_path`` cannot be written."""


def check_key(root: str, key: object, *, prefix: bool = False) -> str:
    """Refuse a key (or list prefix) that could name something outside ``root``.

    The local store maps keys onto paths, where ``..`` climbs out of the root; S3 would store
    such a key literally, yet tools and S3-compatible servers read it as a path. Refusing it on
    every back end (and in the async readers) keeps one contract. A prefix may be empty
    (everything); a key may not.
    """
    what = "list prefix" if prefix else "object key"
    if not isinstance(key, str):
        raise StorageError(f"{what} {key!r} under {root} must be a string")
    if (
        (not key and not prefix)
        or key.startswith("/")
        or "\x00" in key
        or any(p in (".", "..") for p in key.split("/"))
    ):
        raise StorageError(
            f"invalid {what} {key!r} under {root}: it must be {'' if prefix else 'non-empty, '}"
            "relative to the store root, without NUL characters and without '.' or '..' segments"
        )
    return key


def _check_endpoint_url(url: object) -> None:
    """An http(s) URL with a host, and no credentials in it; the error names the setting."""
    from urllib.parse import urlsplit

    from airflow_provider_shardyfusion.core.secrets import refuse_userinfo

    what = "storage_options.endpoint_url"
    refuse_userinfo(url, what)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{what} {url!r} must start with http:// or https://")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check (ValueError when invalid)
    except ValueError as exc:
        raise ConfigError(f"{what} {url!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"{what} {url!r} names no host")


# Beside ObjectStore, not in async_reader: async_reader picks the back ends (async_s3 among them), and
# the back ends subclass this, so the base class living there made the two modules import each other.
class AsyncObjectReader(abc.ABC):
    """Reads small objects under one output root from async code; close it with ``aclose()``."""

    root: str

    @abc.abstractmethod
    async def read(self, key: str) -> bytes | None:
        """The object's bytes, or ``None`` if it does not exist. Other failures raise ``StorageError``."""

    async def aclose(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the client (if any)."""
