"""A fault-injecting HTTP proxy on 127.0.0.1, in front of the moto S3 server.

Clients (boto3) use the proxy's URL as their ``endpoint_url``; the proxy forwards each request
to the upstream server unchanged (Host header included, so path-style S3 keeps working) unless
a rule matches it. A rule names a method, a regular expression searched in the request path
(``/<bucket>/<key>?<query>``, percent-decoded) and how many requests it faults; the first rule
with faults left wins. Actions:

- ``error``:   answer ``status`` with an S3 error body (``code``) without forwarding (not applied);
- ``error_after``: forward (the request is applied), then answer ``status`` instead of the reply;
- ``drop``:    forward (the request is applied), then close the connection without any reply;
- ``close``:   close the connection before forwarding (nothing applied);
- ``delay``:   wait ``delay_s`` seconds, then forward normally.

Every request is logged as ``(method, path, outcome)``. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACTIONS = ("error", "error_after", "drop", "close", "delay")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that timed out and hung up makes the late reply fail: expected under faults.
        pass


@dataclass
class Rule:
    action: str
    method: str | None = None  # None: any method
    path: str = ""  # regular expression searched in the decoded request path
    count: int | None = 1  # None: every matching request until the rule is removed
    status: int = 500
    code: str = "InternalError"
    delay_s: float = 0.0
    hits: int = 0
    hit_paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; choose one of {ACTIONS}")
        if not 0 <= self.delay_s <= 30:
            raise ValueError("delay_s must lie in [0, 30]: every wait in the proxy is bounded")
        self._pattern = re.compile(self.path)

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        if self.count is not None and self.hits >= self.count:
            return False
        return self._pattern.search(path) is not None


def _error_body(code: str, status: int, path: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>fault injected by the test proxy (HTTP {status})</Message>"
        f"<Resource>{path}</Resource><RequestId>fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    """``with FaultProxy(upstream) as proxy: proxy.add(Rule(...))``; ``proxy.url`` is the endpoint."""

    def __init__(self, upstream: str, *, upstream_timeout_s: float = 30.0):
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.scheme != "http":
            raise ValueError(f"the fault proxy only fronts a loopback http server, not {upstream!r}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.upstream_timeout_s = upstream_timeout_s
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self.log: list[tuple[str, str, str]] = []
        self._server = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- control ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self._rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def requests(self, method: str | None = None, path: str = "") -> list[tuple[str, str, str]]:
        """Logged ``(method, path, outcome)`` entries, optionally filtered like a rule."""
        pattern = re.compile(path)
        with self._lock:
            return [e for e in self.log if (method is None or e[0] == method) and pattern.search(e[1])]

    @property
    def faulted(self) -> int:
        with self._lock:
            return sum(1 for _, _, outcome in self.log if outcome != "forwarded")

    # -- the handler -------------------------------------------------------------------------------

    def _pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path):
                    rule.hits += 1
                    rule.hit_paths.append(path)
                    return rule
            return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append((method, path, outcome))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as boto3's connection pool expects

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _read_body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                                  timeout=proxy.upstream_timeout_s)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST") else None,
                                 headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    return resp.status, resp.reason, resp.getheaders(), data
                finally:
                    conn.close()

            def _drop_connection(self) -> None:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response_only(status, reason)
                for k, v in headers:
                    if k.lower() in _HOP_BY_HOP or k.lower() == "content-length":
                        continue
                    self.send_header(k, v)
                if self.command == "HEAD":  # no body; keep the size the upstream reported
                    length = next((v for k, v in headers if k.lower() == "content-length"), "0")
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, code: str, path: str) -> None:
                body = _error_body(code, status, path) if self.command != "HEAD" else b""
                self._reply(status, "Injected Fault", [("Content-Type", "application/xml")], body)

            def _handle(self) -> None:
                body = self._read_body()  # always read first: the client then sees a clean fault
                path = urllib.parse.unquote(self.path)
                rule = proxy._pick(self.command, path)
                action = rule.action if rule else "forward"
                if action == "close":
                    proxy._record(self.command, path, "close")
                    self._drop_connection()
                    return
                if action == "error":
                    proxy._record(self.command, path, f"error {rule.status} {rule.code}")
                    self._error(rule.status, rule.code, path)
                    return
                if action == "delay":
                    # Logged before the wait: the client may give up and retry long before it ends.
                    proxy._record(self.command, path, f"delay {rule.delay_s}s")
                    time.sleep(rule.delay_s)
                status, reason, headers, data = self._forward(body)
                if action == "drop":
                    proxy._record(self.command, path, f"drop (upstream said {status})")
                    self._drop_connection()
                    return
                if action == "error_after":
                    proxy._record(self.command, path, f"error_after {rule.status} {rule.code} (upstream said {status})")
                    self._error(rule.status, rule.code, path)
                    return
                if action != "delay":
                    proxy._record(self.command, path, "forwarded")
                self._reply(status, reason, headers, data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler
