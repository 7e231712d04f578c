"""``ShardyfusionHook``: storage for an output URI, built from an Airflow AWS connection.

``file://`` roots need no connection. For ``s3://`` roots the hook reads credentials, region and
endpoint URL (connection extra ``endpoint_url``, plus optional ``s3_addressing_style``) from
``aws_conn_id`` through the amazon provider; credentials stay in this process and are never
written anywhere (``StorageOptions.to_dict`` drops them).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.hook import BaseHook

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.storage import ObjectStore, StorageOptions, open_store

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.errors import RunRecordError
    from airflow_provider_shardyfusion.core.manifest import Manifest
    from airflow_provider_shardyfusion.core.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.reader import ShardedReader
    from airflow_provider_shardyfusion.core.run_record import RunRecord
    from airflow_provider_shardyfusion.core.snapshot import SnapshotRoot


class ShardyfusionHook(BaseHook):
    """Storage access for snapshots under an output URI (``s3://…`` or ``file://…``).

    :param aws_conn_id: the Airflow AWS connection for ``s3://`` roots (credentials, region, extra
        ``endpoint_url`` / ``s3_addressing_style``); ``None`` uses boto3's default chain.
    """

    hook_name = "Shardyfusion"

    def __init__(self, aws_conn_id: str | None = "aws_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id

    # -- connection → storage options ----------------------------------------------------------

    @cached_property
    def _aws_hook(self) -> Any:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(aws_conn_id=self.aws_conn_id, client_type="s3")

    def public_storage_options(self, output_uri: str) -> StorageOptions:
        """Endpoint, region and addressing style only: safe to hand to the Spark job."""
        if not layout.normalize_root(output_uri).startswith("s3://") or not self.aws_conn_id:
            return StorageOptions()
        cfg = self._aws_hook.conn_config
        extra = dict(getattr(cfg, "extra_config", None) or {})
        return StorageOptions(
            endpoint_url=cfg.get_service_endpoint_url("s3"),
            region_name=cfg.region_name,
            addressing_style=extra.get("s3_addressing_style") or ("path" if cfg.endpoint_url else None),
        )

    def storage_options(self, output_uri: str) -> StorageOptions:
        """Public options plus in-process credentials from the connection (if it has any)."""
        public = self.public_storage_options(output_uri)
        if not layout.normalize_root(output_uri).startswith("s3://") or not self.aws_conn_id:
            return public
        creds = self._aws_hook.get_credentials(region_name=public.region_name)
        return StorageOptions(
            **public.to_dict(),
            aws_access_key_id=creds.access_key,
            aws_secret_access_key=creds.secret_key,
            aws_session_token=creds.token,
        )

    def credential_env(self, output_uri: str) -> dict[str, str]:
        """Credentials as environment variables for a child process (never argv).

        Only when the connection holds keys or assumes a role: otherwise the child's own default
        chain (instance profile, IRSA, …) finds the same identity and refreshes it, whereas a
        frozen copy of temporary credentials could expire in the middle of a long write.
        """
        if not layout.normalize_root(output_uri).startswith("s3://") or not self.aws_conn_id:
            return {}
        cfg = self._aws_hook.conn_config
        if not (cfg.aws_access_key_id or cfg.role_arn):
            return {}
        opts = self.storage_options(output_uri)
        env = {
            "AWS_ACCESS_KEY_ID": opts.aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": opts.aws_secret_access_key,
            "AWS_SESSION_TOKEN": opts.aws_session_token,
        }
        return {k: v for k, v in env.items() if v}

    # -- storage access ------------------------------------------------------------------------

    def get_store(self, output_uri: str) -> ObjectStore:
        return open_store(output_uri, self.storage_options(output_uri))

    def get_snapshots(self, output_uri: str) -> SnapshotRoot:
        """Pointer, manifests and run records under ``output_uri`` (see ``core.snapshot``)."""
        from airflow_provider_shardyfusion.core.snapshot import SnapshotRoot

        return SnapshotRoot(self.get_store(output_uri))

    def read_current(self, output_uri: str) -> CurrentPointer | None:
        return self.get_snapshots(output_uri).current()

    def read_manifest(self, output_uri: str, manifest_ref: str) -> Manifest:
        return self.get_snapshots(output_uri).read_manifest(manifest_ref)

    def read_run_record(self, output_uri: str, run_id: str) -> RunRecord | None:
        return self.get_snapshots(output_uri).read_run(run_id)

    def list_run_ids(self, output_uri: str) -> list[str]:
        return self.get_snapshots(output_uri).list_run_ids()

    def get_reader(self, output_uri: str, **kwargs: Any) -> ShardedReader:
        from airflow_provider_shardyfusion.core.reader import ShardedReader

        return ShardedReader(output_uri, storage_options=self.storage_options(output_uri), **kwargs)

    # ============================================================================================
    # Async access for triggers (runs on the triggerer's event loop).
    #
    # Nothing here blocks the loop: local reads go to a worker thread, S3 goes through aiobotocore
    # via the amazon provider, and the connection is fetched with ``aget_connection`` (never the
    # sync ``get_connection``, which can deadlock the triggerer's supervisor comms).
    # Credentials stay inside the client objects; nothing here returns or logs them.
    # ============================================================================================

    async def _aseed_aws_connection(self) -> None:
        """Fetch the connection asynchronously and hand it to the amazon hook's config cache.

        ``AwsBaseHook.conn_config`` would otherwise look the connection up synchronously.
        """
        hook = self._aws_hook
        if "conn_config" in hook.__dict__:
            return
        from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper
        from airflow.sdk.exceptions import AirflowNotFoundException

        connection = None
        if not self.aws_conn_id:
            return
        try:
            connection = await self.aget_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            # Same behaviour as AwsBaseHook: a missing connection falls back to boto's default chain.
            self.log.warning("AWS connection %r not found; using the default credential chain.", self.aws_conn_id)
        hook.__dict__["conn_config"] = AwsConnectionWrapper(
            conn=connection, region_name=hook._region_name, botocore_config=hook._config, verify=hook._verify
        )

    async def aopen_reader(self, output_uri: str) -> AsyncObjectReader:
        """An async reader of small objects under ``output_uri``; close it with ``aclose()``."""
        root = layout.normalize_root(output_uri)
        if root.startswith("file://"):
            return _AsyncLocalReader(root)
        if self.aws_conn_id:
            await self._aseed_aws_connection()
        import asyncio

        # Building the client reads botocore's JSON service models from disk (and may call STS for
        # an assumed role): do it off the loop.
        client_ctx = await asyncio.to_thread(self._build_async_s3_client, root)
        client = await client_ctx.__aenter__()
        return _AsyncS3Reader(root, client, client_ctx)

    def _build_async_s3_client(self, root: str) -> Any:
        from botocore.config import Config

        # The trigger owns the retry policy (one request per poll, its own backoff): keep botocore's short.
        if not self.aws_conn_id:
            from aiobotocore.session import get_session

            return get_session().create_client("s3", config=Config(retries={"mode": "standard", "max_attempts": 2}))
        public = self.public_storage_options(root)
        overrides: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": 2}}
        if public.addressing_style:
            overrides["s3"] = {"addressing_style": public.addressing_style}
        config = self._aws_hook.config.merge(Config(**overrides))
        return self._aws_hook.get_client_type(region_name=public.region_name, config=config, deferrable=True)

    async def amark_failed(self, output_uri: str, run_id: str, error: RunRecordError) -> RunRecord | None:
        """Mark a still-running run failed (conditional write, see ``core.run_record.mark_failed``).

        The connection is fetched asynchronously first; the write itself is a single conditional
        put through the sync store, run in a worker thread.
        """
        import asyncio

        from airflow_provider_shardyfusion.core.run_record import mark_failed

        root = layout.normalize_root(output_uri)
        if root.startswith("s3://") and self.aws_conn_id:
            await self._aseed_aws_connection()
        return await asyncio.to_thread(
            lambda: mark_failed(self.get_store(root), run_id, error)
        )

    async def aread_object(self, output_uri: str, key: str) -> bytes | None:
        """Bytes of ``<output_uri>/<key>``, or ``None`` if it does not exist (one request)."""
        reader = await self.aopen_reader(output_uri)
        try:
            return await reader.read(key)
        finally:
            await reader.aclose()

    async def aread_run_record(self, output_uri: str, run_id: str) -> RunRecord | None:
        from airflow_provider_shardyfusion.core.run_record import RunRecord

        data = await self.aread_object(output_uri, layout.run_record_key(run_id))
        return None if data is None else RunRecord.from_bytes(data)

    async def aread_current(self, output_uri: str) -> CurrentPointer | None:
        from airflow_provider_shardyfusion.core.pointer import parse_pointer

        data = await self.aread_object(output_uri, layout.CURRENT_KEY)
        return None if data is None else parse_pointer(data, layout.normalize_root(output_uri))


class AsyncObjectReader:
    """Reads small objects (pointer, run record) under one output root from async code."""

    root: str

    async def read(self, key: str) -> bytes | None:
        """The object's bytes, or ``None`` if it does not exist. Other failures raise."""
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class _AsyncLocalReader(AsyncObjectReader):
    def __init__(self, root: str):
        from airflow_provider_shardyfusion.core.storage.local import LocalStore

        self.root = root
        self._store = LocalStore(root)

    def _read(self, key: str) -> bytes | None:
        from airflow_provider_shardyfusion.core.errors import ObjectNotFoundError

        try:
            return self._store.get(key).data
        except ObjectNotFoundError:
            return None

    async def read(self, key: str) -> bytes | None:
        import asyncio

        return await asyncio.to_thread(self._read, key)


class _AsyncS3Reader(AsyncObjectReader):
    _NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})

    def __init__(self, root: str, client: Any, client_ctx: Any):
        self.root = root
        bucket, _, prefix = root[len("s3://") :].partition("/")
        self._bucket = bucket
        self._prefix = prefix + "/" if prefix else ""
        self._client = client
        self._client_ctx = client_ctx

    async def read(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        from airflow_provider_shardyfusion.core.errors import StorageError

        uri = layout.join(self.root, key)
        try:
            resp = await self._client.get_object(Bucket=self._bucket, Key=self._prefix + key)
            async with resp["Body"] as body:
                return await body.read()
        except ClientError as exc:
            if str((exc.response or {}).get("Error", {}).get("Code", "")) in self._NOT_FOUND:
                return None
            raise StorageError(f"S3 get of {uri} failed: {exc}") from exc
        except Exception as exc:
            # Connection errors and timeouts carry no response; the trigger retries on its next poll.
            raise StorageError(f"S3 get of {uri} failed: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        ctx, self._client_ctx = self._client_ctx, None
        if ctx is not None:
            await ctx.__aexit__(None, None, None)
