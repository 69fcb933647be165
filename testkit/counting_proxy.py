"""A request-counting HTTP proxy on 127.0.0.1 in front of an S3 endpoint (moto, SeaweedFS).

The benchmark puts it between the daemon and the store to count what reaches the store: object
GETs (ranged or whole), listings, HEADs, and the body bytes of the GETs. Requests and answers
pass through unchanged, streamed in 1 MiB chunks (bounded memory); each client connection gets
its own upstream connection, kept alive like the client's.

Python::

    with CountingProxy("http://127.0.0.1:8333") as proxy:
        ... endpoint_url=proxy.url ...
        proxy.counts()  # {"get": 12, "get_bytes": 9437184, "list": 1, "head": 0, "other": 0}
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"
CHUNK = 1024 * 1024
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class CountingProxy:
    """The proxy; ``url`` is its endpoint. ``counts()`` is safe to call while it runs."""

    def __init__(self, upstream: str, port: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or HOST, parsed.port or 80)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer((HOST, port), _handler_for(self))
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def add(self, kind: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[kind] += amount

    def counts(self) -> dict[str, int]:
        """Requests so far by kind: ``get`` (object GETs), ``get_bytes`` (their body bytes),
        ``list``, ``head``, ``other``."""
        with self._lock:
            return {k: self._counts[k] for k in ("get", "get_bytes", "list", "head", "other")}


def request_kind(method: str, path: str) -> str:
    """``get``, ``list``, ``head`` or ``other`` for a path-style S3 request (pure)."""
    parts = urllib.parse.urlsplit(path)
    _, _, key = parts.path.lstrip("/").partition("/")
    if method == "GET":
        return "get" if key else "list"
    return "head" if method == "HEAD" else "other"


def _handler_for(proxy: CountingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the counts are the output

        def do_GET(self) -> None:
            self._forward()

        def do_HEAD(self) -> None:
            self._forward()

        def do_PUT(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def do_DELETE(self) -> None:
            self._forward()

        def _connection(self) -> http.client.HTTPConnection:
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*proxy.upstream, timeout=300)
            return self.upstream

        def _forward(self) -> None:
            kind = request_kind(self.command, self.path)
            proxy.add(kind)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn = self._connection()
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.upstream = None
                self.send_error(502)
                return
            self.send_response(reply.status, reply.reason)
            for k, v in reply.getheaders():
                if k.lower() not in _HOP_BY_HOP:
                    self.send_header(k, v)
            whole = None
            if reply.getheader("Content-Length") is None and self.command != "HEAD":
                whole = reply.read()  # a chunked answer (a listing): small, sent framed
                self.send_header("Content-Length", str(len(whole)))
            self.end_headers()
            if whole is not None:
                self.wfile.write(whole)
                return
            sent = self._stream(reply)
            if kind == "get" and reply.status in (200, 206):
                proxy.add("get_bytes", sent)

        def _stream(self, reply: http.client.HTTPResponse) -> int:
            sent = 0
            if self.command == "HEAD":
                reply.read()
                return 0
            while chunk := reply.read(CHUNK):
                self.wfile.write(chunk)
                sent += len(chunk)
            return sent

    return Handler
