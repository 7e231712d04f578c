"""S3 object store on boto3; any S3-compatible server via ``endpoint_url`` and path-style addressing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from .. import layout
from ..errors import ObjectNotFoundError, StorageError
from .base import ObjectInfo, ObjectStore, StorageOptions, StoredObject

_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}


def make_s3_client(options: StorageOptions) -> Any:
    import boto3  # deferred: never imported at DAG-parse time
    from botocore.config import Config

    cfg: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": options.max_attempts}}
    if options.addressing_style:
        cfg["s3"] = {"addressing_style": options.addressing_style}
    session = boto3.session.Session(
        aws_access_key_id=options.aws_access_key_id,
        aws_secret_access_key=options.aws_secret_access_key,
        aws_session_token=options.aws_session_token,
        region_name=options.region_name,
    )
    return session.client("s3", endpoint_url=options.endpoint_url, config=Config(**cfg))


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3Store(ObjectStore):
    def __init__(self, root: str, options: StorageOptions | None = None, client: Any = None):
        self.root = layout.normalize_root(root)
        if not self.root.startswith("s3://"):
            raise StorageError(f"{root!r} is not an s3:// URI")
        self.options = options or StorageOptions()
        bucket, _, prefix = self.root[len("s3://") :].partition("/")
        self.bucket = bucket
        self.prefix = prefix + "/" if prefix else ""
        self.client = client if client is not None else make_s3_client(self.options)

    def _k(self, key: str, *, prefix: bool = False) -> str:
        return self.prefix + self._check_key(key, prefix=prefix)

    def _wrap(self, exc: Exception, what: str, key: str) -> StorageError:
        return StorageError(f"S3 {what} of {self.uri(key)} failed: {exc}")

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> str:
        k = self._k(key)
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=k, Body=data, ContentType=content_type)
        except Exception as exc:
            raise self._wrap(exc, "put", key) from exc
        return str(resp.get("ETag", "")).strip('"')

    def put_if_match(
        self, key: str, data: bytes, etag: str | None, *, content_type: str = "application/json"
    ) -> str | None:
        k = self._k(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": f'"{etag}"'}
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=k, Body=data, ContentType=content_type, **condition)
        except Exception as exc:
            if _code(exc) in _PRECONDITION_CODES:
                return None
            if etag is not None and _code(exc) in _NOT_FOUND_CODES:  # If-Match on a deleted object: S3 says 404
                return None
            raise self._wrap(exc, "conditional put", key) from exc
        return str(resp.get("ETag", "")).strip('"')

    def get(self, key: str) -> StoredObject:
        k = self._k(key)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=k)
            data = resp["Body"].read()
        except Exception as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
            raise self._wrap(exc, "get", key) from exc
        return StoredObject(data=data, etag=str(resp.get("ETag", "")).strip('"'))

    def head(self, key: str) -> ObjectInfo | None:
        k = self._k(key)
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=k)
        except Exception as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                return None
            raise self._wrap(exc, "head", key) from exc
        return ObjectInfo(
            key=key, size=int(resp["ContentLength"]), last_modified=resp.get("LastModified"),
            etag=str(resp.get("ETag", "")).strip('"'),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Checked here, not in the generator, so a bad prefix fails at the call as on the local store.
        return self._list(self._k(prefix, prefix=True), prefix)

    def _list(self, full_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        key=item["Key"][len(self.prefix) :], size=int(item["Size"]),
                        last_modified=item.get("LastModified"), etag=str(item.get("ETag", "")).strip('"'),
                    )
        except Exception as exc:
            raise self._wrap(exc, "list", prefix) from exc

    def delete_many(self, keys: Iterable[str]) -> list[tuple[str, str]]:
        pending: list[str] = []
        failures: list[tuple[str, str]] = []
        for key in keys:
            try:
                self._k(key)
            except StorageError as exc:
                failures.append((key, str(exc)))
            else:
                pending.append(key)
        for start in range(0, len(pending), 1000):  # S3 DeleteObjects takes at most 1000 keys
            chunk = pending[start : start + 1000]
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": self._k(k)} for k in chunk], "Quiet": True}
                )
            except Exception as exc:
                failures.extend((k, str(exc)) for k in chunk)
                continue
            for err in resp.get("Errors", []):
                failures.append((err["Key"][len(self.prefix) :], f"{err.get('Code')}: {err.get('Message')}"))
        return failures

    def upload_file(self, local_path: str, key: str) -> None:
        k = self._k(key)
        try:
            self.client.upload_file(local_path, self.bucket, k)
        except Exception as exc:
            raise self._wrap(exc, "upload", key) from exc

    def download_file(self, key: str, local_path: str) -> None:
        k = self._k(key)
        try:
            os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
            self.client.download_file(self.bucket, k, local_path)
        except Exception as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
            raise self._wrap(exc, "download", key) from exc
