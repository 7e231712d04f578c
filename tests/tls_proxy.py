"""TLS in front of a plain-text server on loopback, with a self-signed certificate made here.

The Spark Connect server has no TLS of its own (Spark 4.2 has no server-side TLS setting; a
deployment puts a TLS-terminating proxy or ingress in front of it, which is what this plays): a
thread runs an asyncio server that completes the TLS handshake (ALPN ``h2``, as gRPC needs) and
copies bytes both ways to the plain port.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.processes import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass(frozen=True)
class SelfSigned:
    """A self-signed certificate for ``localhost`` and ``127.0.0.1`` and its key, as PEM files."""

    cert_path: Path
    key_path: Path

    @property
    def cert_pem(self) -> str:
        return self.cert_path.read_text()


def self_signed(directory: Path, name: str = "connect") -> SelfSigned:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"shardyfusion test {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return SelfSigned(cert_path, key_path)


@contextlib.contextmanager
def tls_proxy(backend_port: int, cert: SelfSigned) -> Iterator[int]:
    """Yield a loopback port serving TLS (``cert``) that forwards to ``127.0.0.1:backend_port``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.cert_path, cert.key_path)
    context.set_alpn_protocols(["h2"])
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stopping: asyncio.Future[None] | None = None

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", backend_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    async def serve() -> None:
        nonlocal stopping
        stopping = loop.create_future()
        # A failed handshake (the client does not trust the certificate) is the client's finding, not ours.
        loop.set_exception_handler(lambda _loop, _context: None)
        server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=context)
        started.set()
        async with server:
            await stopping

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="tls-proxy", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the TLS proxy did not start")
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(lambda: stopping is not None and not stopping.done() and stopping.set_result(None))
        thread.join(timeout=10)
