"""S3 object store on boto3; any S3-compatible server via ``endpoint_url`` and path-style addressing.

Every failure leaves this module as a ``StorageError``. Operations that may be repeated safely
(get, head, list, delete, whole-object put, upload, download) are retried with capped backoff
(``core.retry``) on transient failures: connection errors, timeouts, 5xx and throttling. A
conditional put is repeated too, because a repeat that finds its own earlier write in place is
recognised by re-reading the object (see ``put_if_match``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ObjectNotFoundError, StorageError
from airflow_provider_shardyfusion.core.retry import RetryPolicy, call_with_retry
from airflow_provider_shardyfusion.core.storage.base import ObjectInfo, ObjectStore, StorageOptions, StoredObject

if TYPE_CHECKING:
    import builtins
    from collections.abc import Callable, Iterable, Iterator

__all__ = [
    "DEFAULT_RETRY", "S3Store", "client_config", "credential_kwargs", "is_not_found", "is_transient", "make_s3_client",
    "split_root", "storage_error",
]

T = TypeVar("T")

_NOT_MODIFIED_CODES = {"304", "NotModified"}
_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
# Error codes that say "try again later" whatever the HTTP status (S3 and S3-compatible servers).
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
    "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
    "InternalError", "ServiceUnavailable", "OperationAborted",
}

DEFAULT_RETRY = RetryPolicy()


def client_config(options: StorageOptions, *, max_attempts: int | None = None,
                  timeouts_s: tuple[float, float] | None = None) -> Any:
    """The botocore ``Config`` for ``options`` (retry budget, addressing style), sync and async alike;
    ``timeouts_s``: (connect, read) instead of botocore's 60 s each."""
    from botocore.config import Config

    cfg: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": max_attempts or options.max_attempts}}
    if options.addressing_style:
        cfg["s3"] = {"addressing_style": options.addressing_style}
    if timeouts_s is not None:
        cfg["connect_timeout"], cfg["read_timeout"] = timeouts_s
    return Config(**cfg)


def credential_kwargs(options: StorageOptions) -> dict[str, Any]:
    """In-process credentials of ``options`` as client keyword arguments (none: the default chain)."""
    return {
        "aws_access_key_id": options.aws_access_key_id,
        "aws_secret_access_key": options.aws_secret_access_key,
        "aws_session_token": options.aws_session_token,
    }


def make_s3_client(options: StorageOptions, *, session: Any = None,
                   timeouts_s: tuple[float, float] | None = None) -> Any:
    """A boto3 S3 client for ``options``; ``session`` (a boto3 session) supplies credentials instead."""
    import boto3  # deferred: never imported at DAG-parse time

    if session is None:
        session = boto3.session.Session(botocore_session=_botocore_session(), region_name=options.region_name,
                                        **credential_kwargs(options))
    return session.client("s3", endpoint_url=options.endpoint_url, config=client_config(options, timeouts_s=timeouts_s))


_LOADER: Any = None


def _botocore_session() -> Any:
    """A new botocore session sharing one process-wide data loader.

    A fresh session re-reads botocore's service model JSON (most of a new client's cost); the loader
    caches what it read, so only the first store a process opens pays it. Sessions stay
    one per client: they hold credentials and must not be shared.
    """
    global _LOADER
    import botocore.session
    from botocore.loaders import create_loader

    if _LOADER is None:
        _LOADER = create_loader(os.environ.get("AWS_DATA_PATH"))
    session = botocore.session.Session()
    session.register_component("data_loader", _LOADER)
    return session


def split_root(root: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> ``("bucket", "prefix/")`` (prefix ``""`` at the bucket's top)."""
    bucket, _, prefix = root[len("s3://") :].partition("/")
    return bucket, prefix + "/" if prefix else ""


def is_not_found(exc: BaseException) -> bool:
    """The object (or, for a head, its key) does not exist."""
    return _code(exc) in _NOT_FOUND_CODES


def storage_error(what: str, uri: str, exc: BaseException) -> StorageError:
    """The one message shape for a failed S3 operation on ``uri``."""
    return StorageError(f"S3 {what} of {uri} failed: {type(exc).__name__}: {exc}")


def _response(exc: BaseException) -> dict[str, Any]:
    # Connection errors carry no response at all (``response`` absent or None).
    resp = getattr(exc, "response", None)
    return resp if isinstance(resp, dict) else {}


def _code(exc: BaseException) -> str:
    error = _response(exc).get("Error")
    return str(error.get("Code", "") or "") if isinstance(error, dict) else ""


def _status(exc: BaseException) -> int:
    meta = _response(exc).get("ResponseMetadata")
    try:
        return int(meta.get("HTTPStatusCode") or 0) if isinstance(meta, dict) else 0
    except (TypeError, ValueError):
        return 0


def is_transient(exc: BaseException) -> bool:
    """True for failures a later identical request may not meet: network, timeouts, 5xx, throttling."""
    from boto3.exceptions import RetriesExceededError
    from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError, RetriesExceededError)):
        return True
    if isinstance(exc, ClientError):
        return _code(exc) in _TRANSIENT_CODES or _status(exc) >= 500 or _status(exc) == 429
    try:
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:  # pragma: no cover - urllib3 comes with botocore
        return False
    return isinstance(exc, Urllib3Error)


class _Conflict:
    """A conditional put met a precondition failure (the object is not as the caller expected)."""


_CONFLICT = _Conflict()


class _Unchanged:
    """A conditional get met an object whose etag is still the caller's (HTTP 304, no body)."""


_UNCHANGED = _Unchanged()


class S3Store(ObjectStore):
    """The ``s3://`` store over boto3: any S3-compatible endpoint, conditional puts by etag, retried calls."""

    def __init__(
        self, root: str, options: StorageOptions | None = None, client: Any = None, retry: RetryPolicy | None = None
    ):
        self.root = layout.normalize_root(root)
        if not self.root.startswith("s3://"):
            raise StorageError(f"{root!r} is not an s3:// URI")
        self.options = options or StorageOptions()
        self.retry = retry or DEFAULT_RETRY
        self.bucket, self.prefix = split_root(self.root)
        self.client = client if client is not None else make_s3_client(self.options)

    def _k(self, key: str, *, prefix: bool = False) -> str:
        return self.prefix + self._check_key(key, prefix=prefix)

    def _endpoint(self) -> str:
        return self.options.endpoint_url or "the default AWS S3 endpoint"

    def _wrap(self, exc: BaseException, what: str, key: str) -> StorageError:
        return storage_error(what, self.uri(key), exc)

    def _retrying(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """``fn`` retried on transient failures; every failure that escapes is a ``StorageError``."""

        def give_up(exc: BaseException, attempts: int, elapsed: float) -> StorageError:
            return StorageError(
                f"S3 {what} of {self.uri(key)} failed after {attempts} attempt(s) over {elapsed:.1f}s: "
                f"{type(exc).__name__}: {exc}. {self._endpoint()} is unreachable or failing: check "
                "storage_options.endpoint_url, the network and the service's health, then run again"
            )

        try:
            return call_with_retry(fn, policy=self.retry, retryable=is_transient,
                                   describe=f"S3 {what} of {self.uri(key)}", give_up=give_up)
        except StorageError:
            raise
        except Exception as exc:
            raise self._wrap(exc, what, key) from exc

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> str:
        k = self._k(key)
        resp = self._retrying(
            "put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=k, Body=data, ContentType=content_type)
        )
        return str(resp.get("ETag", "")).strip('"')

    def put_if_match(
        self, key: str, data: bytes, etag: str | None, *, content_type: str = "application/json"
    ) -> str | None:
        k = self._k(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": f'"{etag}"'}

        def attempt() -> str | _Conflict:
            try:
                resp = self.client.put_object(Bucket=self.bucket, Key=k, Body=data, ContentType=content_type, **condition)
            except Exception as exc:
                code = _code(exc)
                # If-Match on a deleted object: S3 answers 404, which is a conflict as well.
                if code in _PRECONDITION_CODES or (etag is not None and is_not_found(exc)):
                    return _CONFLICT
                raise
            return str(resp.get("ETag", "")).strip('"')

        result = self._retrying("conditional put", key, attempt)
        if not isinstance(result, _Conflict):
            return result
        # The request may have been applied with its response lost; the repeat (botocore's or
        # ours) then fails its own precondition. An object holding exactly our bytes is that
        # earlier write of ours, so it is a success, not a conflict.
        current = self._get_or_none(key)
        if current is not None and current.data == data:
            return current.etag
        return None

    def _get_or_none(self, key: str) -> StoredObject | None:
        try:
            return self.get(key)
        except ObjectNotFoundError:
            return None

    def get(self, key: str) -> StoredObject:
        k = self._k(key)
        found = self._retrying("get", key, lambda: self._get_object(k))
        if found is None:
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        assert isinstance(found, StoredObject)  # no condition: never _UNCHANGED
        return found

    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        if etag is None:
            return self.get(key)
        k = self._k(key)

        found = self._retrying("conditional get", key, lambda: self._get_object(k, IfNoneMatch=f'"{etag}"'))
        if found is None:
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        return None if isinstance(found, _Unchanged) else found

    def _get_object(self, k: str, **conditions: str) -> StoredObject | _Unchanged | None:
        """One GET of bucket key ``k``: None when absent, ``_UNCHANGED`` when a condition says so."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=k, **conditions)
        except Exception as exc:
            if is_not_found(exc):
                return None
            if conditions and (_code(exc) in _NOT_MODIFIED_CODES or _status(exc) == 304):
                return _UNCHANGED
            raise
        # The body is read inside the retried call: a connection dropped mid-body is transient too.
        return StoredObject(data=resp["Body"].read(), etag=str(resp.get("ETag", "")).strip('"'))

    def head(self, key: str) -> ObjectInfo | None:
        k = self._k(key)

        def attempt() -> dict[str, Any] | None:
            try:
                return self.client.head_object(Bucket=self.bucket, Key=k)
            except Exception as exc:
                if is_not_found(exc):
                    return None
                raise

        resp = self._retrying("head", key, attempt)
        if resp is None:
            return None
        return ObjectInfo(
            key=key, size=int(resp["ContentLength"]), last_modified=resp.get("LastModified"),
            etag=str(resp.get("ETag", "")).strip('"'),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Checked here, not in the generator, so a bad prefix fails at the call as on the local store.
        return self._list(self._k(prefix, prefix=True), prefix)

    def _list(self, full_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        # Page by page, each page retried on its own: restarting a half-consumed listing would
        # yield its first objects twice.
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._retrying("list", prefix, lambda kw=kwargs: self.client.list_objects_v2(**kw))  # type: ignore[misc]
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    key=item["Key"][len(self.prefix) :], size=int(item["Size"]),
                    last_modified=item.get("LastModified"), etag=str(item.get("ETag", "")).strip('"'),
                )
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return

    def delete_many(self, keys: Iterable[str]) -> builtins.list[tuple[str, str]]:
        pending: builtins.list[str] = []
        failures: builtins.list[tuple[str, str]] = []
        for key in keys:
            try:
                self._k(key)
            except StorageError as exc:
                failures.append((key, str(exc)))
            else:
                pending.append(key)
        for start in range(0, len(pending), 1000):  # S3 DeleteObjects takes at most 1000 keys
            chunk = pending[start : start + 1000]
            request = {"Objects": [{"Key": self._k(k)} for k in chunk], "Quiet": True}
            try:
                resp = self._retrying(
                    "delete", chunk[0], lambda r=request: self.client.delete_objects(Bucket=self.bucket, Delete=r)  # type: ignore[misc]
                )
            except StorageError as exc:
                failures.extend((k, str(exc)) for k in chunk)
                continue
            for err in resp.get("Errors", []):
                failures.append((err["Key"][len(self.prefix) :], f"{err.get('Code')}: {err.get('Message')}"))
        return failures

    def upload_file(self, local_path: str, key: str) -> None:
        k = self._k(key)
        self._retrying("upload", key, lambda: self.client.upload_file(local_path, self.bucket, k))

    def download_file(self, key: str, local_path: str) -> None:
        k = self._k(key)

        def attempt() -> bool:
            try:
                os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
                self.client.download_file(self.bucket, k, local_path)
            except Exception as exc:
                if is_not_found(exc):
                    return False
                raise
            return True

        if not self._retrying("download", key, attempt):
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
