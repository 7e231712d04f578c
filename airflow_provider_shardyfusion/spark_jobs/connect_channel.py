"""The gRPC channel to a Spark Connect server, trusting the connection's own CA when it has one.

pyspark's ``DefaultChannelBuilder`` opens TLS with the system's root certificates only, so a
server behind a private or self-signed certificate cannot be reached without changing the whole
process's trust (``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``). The connection's ``ca_cert`` travels to
the job in its environment (``core.write.job_environment.CA_CERT``) and is trusted for this one
channel. Used by the job's session and by the task's check of the server, so both trust the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["channel_builder"]


def channel_builder(url: str, *, ca_cert: str | None = None, options: list[tuple[str, Any]] | None = None) -> Any:
    """A pyspark channel builder for ``url``; with ``ca_cert`` (PEM), a TLS channel that trusts it.

    ``ca_cert`` counts only when the URL asks for TLS (``use_ssl=true``); the connection check
    (``submission.connect.check_connect_settings``) refuses a CA without it.
    """
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    if not ca_cert:
        return DefaultChannelBuilder(url, channelOptions=options)
    roots = ca_cert.encode()

    class TrustingChannelBuilder(DefaultChannelBuilder):
        def toChannel(self) -> Any:
            import grpc

            if not self.use_ssl:
                return super().toChannel()
            creds = grpc.ssl_channel_credentials(root_certificates=roots)
            if self.token is not None:
                creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
            return self._secure_channel(self.endpoint, creds)

    return TrustingChannelBuilder(url, channelOptions=options)
