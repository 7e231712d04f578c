"""The async ``s3://`` object reader (aiobotocore), on the rules of ``core.storage.s3``."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.storage.base import AsyncObjectReader, StorageOptions, check_key
from airflow_provider_shardyfusion.core.storage.s3 import (
    client_config,
    credential_kwargs,
    is_not_found,
    split_root,
    storage_error,
)

__all__ = ["READ_MAX_ATTEMPTS", "AsyncS3Reader", "open_async_s3_reader"]

# One request and one quick repeat per read: the caller polls again on its own schedule, and a
# long botocore retry would hold up its loop's view of an outage.
READ_MAX_ATTEMPTS = 2


class AsyncS3Reader(AsyncObjectReader):
    """Reads objects under an ``s3://`` root through an entered aiobotocore client (``client_ctx``)."""

    def __init__(self, root: str, client: Any, client_ctx: Any = None):
        self.root = layout.normalize_root(root)
        self._bucket, self._prefix = split_root(self.root)
        self._client = client
        self._client_ctx = client_ctx

    async def read(self, key: str) -> bytes | None:
        k = self._prefix + check_key(self.root, key)
        try:
            resp = await self._client.get_object(Bucket=self._bucket, Key=k)
            async with resp["Body"] as body:
                return await body.read()
        except Exception as exc:
            # Connection errors and timeouts carry no response: failures, not absence.
            if is_not_found(exc):
                return None
            raise storage_error("get", layout.join(self.root, key), exc) from exc

    async def aclose(self) -> None:
        ctx, self._client_ctx = self._client_ctx, None
        if ctx is not None:
            await ctx.__aexit__(None, None, None)


def _client_context(options: StorageOptions, session: Any) -> Any:
    if session is None:
        from aiobotocore.session import get_session

        session = get_session()
    return session.create_client(
        "s3", endpoint_url=options.endpoint_url, region_name=options.region_name,
        config=client_config(options, max_attempts=READ_MAX_ATTEMPTS), **credential_kwargs(options),
    )


async def open_async_s3_reader(root: str, options: StorageOptions, *, session: Any = None) -> AsyncS3Reader:
    """A reader whose client is built from ``options`` (and ``session``'s credentials, if given)."""
    # Building the client reads botocore's JSON service models from disk: off the loop.
    ctx = await asyncio.to_thread(_client_context, options, session)
    client = await ctx.__aenter__()
    return AsyncS3Reader(root, client, ctx)
