"""``ShardyfusionHook``: storage for an output URI, built from an Airflow AWS connection.

``file://`` roots need no connection. For ``s3://`` roots the hook reads credentials, region and
endpoint URL (connection extra ``endpoint_url``, plus optional ``s3_addressing_style``) from
``aws_conn_id`` through the amazon provider; credentials stay in this process and are never
written anywhere (``StorageOptions.to_dict`` drops them).
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.hook import BaseHook

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.storage import ObjectStore, StorageOptions, open_store
from airflow_provider_shardyfusion.core.storage.async_reader import AsyncObjectReader, open_async_reader

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.core.errors import RunRecordError
    from airflow_provider_shardyfusion.core.model.manifest import Manifest
    from airflow_provider_shardyfusion.core.model.pointer import CurrentPointer
    from airflow_provider_shardyfusion.core.model.run_record import RunRecord
    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.read.reader import ShardedReader

__all__ = ["ShardyfusionHook"]

log = logging.getLogger(__name__)

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
        return _public_options(self._aws_hook.conn_config)

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
        """Pointer, manifests and run records under ``output_uri`` (see ``core.model.snapshot``)."""
        from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

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
        """A ``ShardedReader`` of ``output_uri`` with this connection's storage options; ``kwargs`` are
        the reader's own (``cache_dir``, ``manifest_ref``, ``value_decoding``...)."""
        from airflow_provider_shardyfusion.core.read.reader import ShardedReader

        return ShardedReader(output_uri, storage_options=self.storage_options(output_uri), **kwargs)

    # ============================================================================================
    # Async access for triggers (runs on the triggerer's event loop).
    #
    # Nothing here blocks the loop: the connection is fetched as ``_aget_connection`` explains,
    # everything that may block (secret masking of the connection's extra, building sessions and
    # clients, STS for an assumed role, local reads) runs in a worker thread, and S3 reads go
    # through aiobotocore (``core.storage.async_s3``). Credentials stay inside the session and
    # client objects; nothing here returns or logs them.
    # ============================================================================================

    async def _asessions(self, deferrable: bool) -> tuple[StorageOptions, Any]:
        """Public storage options and a session holding the connection's credentials (``deferrable``:
        an aiobotocore session, else a boto3 one), via the amazon provider's session factory."""
        import asyncio

        connection = await _aget_connection(type(self), self.aws_conn_id) if self.aws_conn_id else None
        return await asyncio.to_thread(_options_and_session, connection, deferrable)

    async def aopen_reader(self, output_uri: str) -> AsyncObjectReader:
        """An async reader of small objects under ``output_uri``; close it with ``aclose()``."""
        root = layout.normalize_root(output_uri)
        if not root.startswith("s3://") or not self.aws_conn_id:
            return await open_async_reader(root)
        options, session = await self._asessions(deferrable=True)
        return await open_async_reader(root, options, session=session)

    async def amark_failed(self, output_uri: str, run_id: str, error: RunRecordError) -> RunRecord | None:
        """Mark a still-running run failed (conditional write, see ``SnapshotRoot.mark_failed``).

        The connection is fetched asynchronously first; the write itself is a single conditional
        put through the sync store, run in a worker thread.
        """
        import asyncio

        from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot

        root = layout.normalize_root(output_uri)
        if not root.startswith("s3://") or not self.aws_conn_id:
            return await asyncio.to_thread(lambda: SnapshotRoot(open_store(root)).mark_failed(run_id, error))
        options, session = await self._asessions(deferrable=False)

        def mark() -> RunRecord | None:
            from airflow_provider_shardyfusion.core.storage.s3 import S3Store, make_s3_client

            store = S3Store(root, options, client=make_s3_client(options, session=session))
            return SnapshotRoot(store).mark_failed(run_id, error)

        return await asyncio.to_thread(mark)

    async def aread_object(self, output_uri: str, key: str) -> bytes | None:
        """Bytes of ``<output_uri>/<key>``, or ``None`` if it does not exist (one request)."""
        reader = await self.aopen_reader(output_uri)
        try:
            return await reader.read(key)
        finally:
            await reader.aclose()

    async def aread_run_record(self, output_uri: str, run_id: str) -> RunRecord | None:
        from airflow_provider_shardyfusion.core.model.run_record import RunRecord

        data = await self.aread_object(output_uri, layout.run_record_key(run_id))
        return None if data is None else RunRecord.from_bytes(data)

    async def aread_current(self, output_uri: str) -> CurrentPointer | None:
        from airflow_provider_shardyfusion.core.model.pointer import parse_pointer

        data = await self.aread_object(output_uri, layout.CURRENT_KEY)
        return None if data is None else parse_pointer(data, layout.normalize_root(output_uri))


def _public_options(cfg: Any) -> StorageOptions:
    """Endpoint, region and addressing style of the amazon provider's ``AwsConnectionWrapper``."""
    extra = dict(getattr(cfg, "extra_config", None) or {})
    return StorageOptions(
        endpoint_url=cfg.get_service_endpoint_url("s3"),
        region_name=cfg.region_name,
        addressing_style=extra.get("s3_addressing_style") or ("path" if cfg.endpoint_url else None),
    )


def _options_and_session(connection: Any, deferrable: bool) -> tuple[StorageOptions, Any]:
    """Blocking (run it in a worker thread): reading the extra masks secrets through the supervisor."""
    from airflow.providers.amazon.aws.hooks.base_aws import SessionFactory
    from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

    cfg = AwsConnectionWrapper(conn=connection)
    options = _public_options(cfg)
    factory = SessionFactory(conn=cfg, region_name=options.region_name, config=cfg.botocore_config)
    return options, factory.create_session(deferrable=deferrable)


async def _aget_connection(hook: type[BaseHook], conn_id: str) -> Any:
    """The connection, fetched without blocking the loop; ``None`` if it does not exist (boto's
    default chain then applies, as in ``AwsBaseHook``).

    Before Airflow 3.3.2 ``aget_connection`` masks the connection's secrets with a *synchronous*
    call to the supervisor, which raises ``DeadlockImminentError`` when another async call is in
    flight on the loop (see common.compat's ``get_async_connection``; its fixed version is newer
    than Airflow 3.3.0's constraints allow). There the sync look-up runs in a worker thread,
    where blocking on the supervisor is safe. 3.3.2 masks asynchronously and added
    ``Connection.aextra_dejson``, which tells the versions apart.
    """
    import asyncio

    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        if hasattr(Connection, "aextra_dejson"):
            return await hook.aget_connection(conn_id)
        return await asyncio.to_thread(hook.get_connection, conn_id)
    except AirflowNotFoundException:
        log.warning("AWS connection %r not found; using the default credential chain.", conn_id)
        return None
