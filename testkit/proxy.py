"""One HTTP proxy for the tests and the benchmark: it sits on 127.0.0.1 in front of one S3
endpoint (moto, SeaweedFS), forwards every request upstream and passes the answer back; what it
does besides is its hooks' business.

Each client connection gets its own upstream connection, kept alive like the client's (a reused
one that the store closed meanwhile is replaced once, before anything was answered). Answers
are streamed in ``CHUNK`` pieces (bounded memory) unless the hooks need each body whole
(``ProxyHooks.whole_bodies``, fault injection): then the body is read first and sent with its
own ``Content-Length``.

The hooks (``ProxyHooks``; the base does nothing) see each request before it goes upstream
(``request``: counting it, choosing a fault for it), each successful body after it was read
(``served``) and the status each request was answered with (``answered``; 0: no answer, or one
cut short). Two hook sets exist: ``CountingHooks`` here (``CountingProxy``: what reaches the
store, for the benchmark's keep sweep) and the fault tests' rules
(``tests/faults/faultproxy.py``: S3 errors, resets mid-body, short bodies, stalls, flipped
bytes, store outages, refused access keys, rate limits; the proxy carries a chosen ``Fault``
out).

Pacing (the benchmark's paced network, ``bench/drivers/paced_proxy.py``) is not a hook: its
response bytes never enter Python (``splice`` from socket to socket), which an HTTP forwarder
that reads every answer cannot offer.

Python::

    with CountingProxy("http://127.0.0.1:8333") as proxy:
        ... endpoint_url=proxy.url ...
        proxy.counts()  # {"get": 12, "get_bytes": 9437184, "list": 1, "head": 0, "other": 0}
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, Protocol, Self

HOST = "127.0.0.1"
CHUNK = 1024 * 1024
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 412: "Precondition Failed"}

Action = Literal["error", "reset", "short", "stall", "flip", "drop"]
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


@dataclass(frozen=True, eq=False)
class Exchange:
    """One request as the hooks see it: a path-style S3 request ``/bucket/key?query``. Each
    request is its own exchange (compared by identity), so hooks may key state on it."""

    method: str
    path: str
    key: str  # the object key, unquoted; "" for a bucket call (a listing)
    ranged: bool
    access_key: str = ""  # the access key id of the SigV4 ``Authorization`` header, if any

    @property
    def listing(self) -> bool:
        return not self.key


class Fault(Protocol):
    """What the proxy does to an answer instead of passing it on: ``error`` answers ``status``
    with the S3 error ``code`` without asking upstream; ``drop`` answers nothing and resets the
    connection (TCP RST) without asking upstream; ``flip`` flips a byte in the middle of
    the body; ``stall`` holds the body ``seconds`` after the head; ``short`` sends half the body
    and closes; ``reset`` sends a third and resets the connection. Read-only to the proxy."""

    @property
    def action(self) -> Action: ...

    @property
    def status(self) -> int: ...

    @property
    def code(self) -> str: ...

    @property
    def seconds(self) -> float: ...


class ProxyHooks:
    """What a proxy does besides forwarding; this base does nothing. Called on the proxy's
    connection threads: a hook set guards its own state."""

    whole_bodies = False  # read each answer whole before passing it on (faults need it)

    def request(self, exchange: Exchange) -> Fault | None:
        """Sees every request before it goes upstream; returns the fault to inject, if any."""
        return None

    def served(self, exchange: Exchange, status: int, size: int) -> None:
        """A 2xx answer's body of ``size`` bytes was read from upstream (and, streamed, passed
        on whole)."""

    def answered(self, exchange: Exchange, status: int) -> None:
        """The request was answered with ``status``; 0: no answer (``drop``) or one cut short
        (``short``, ``reset``). Called once per request, after ``request``."""


class ForwardingProxy:
    """The proxy on 127.0.0.1 in front of ``upstream``; ``url`` is its endpoint. Runs on its
    own threads between ``__enter__`` and ``__exit__``."""

    def __init__(
        self, upstream: str, hooks: ProxyHooks, *, port: int = 0, timeout: float = 60.0
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or HOST, parsed.port or 80)
        self.hooks, self.timeout = hooks, timeout
        self.server = _Server((HOST, port), _handler_for(self))
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


# --- counting -------------------------------------------------------------------------------


def request_kind(method: str, path: str) -> str:
    """``get``, ``list``, ``head`` or ``other`` for a path-style S3 request (pure)."""
    parts = urllib.parse.urlsplit(path)
    _, _, key = parts.path.lstrip("/").partition("/")
    if method == "GET":
        return "get" if key else "list"
    return "head" if method == "HEAD" else "other"


class CountingHooks(ProxyHooks):
    """Counts what reaches the store: object GETs (ranged or whole), listings, HEADs, other
    requests, and the body bytes of the GETs passed on."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, kind: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[kind] += amount

    def request(self, exchange: Exchange) -> Fault | None:
        self.add(request_kind(exchange.method, exchange.path))
        return None

    def served(self, exchange: Exchange, status: int, size: int) -> None:
        if request_kind(exchange.method, exchange.path) == "get" and status in (200, 206):
            self.add("get_bytes", size)

    def counts(self) -> dict[str, int]:
        """Requests so far by kind: ``get`` (object GETs), ``get_bytes`` (their body bytes),
        ``list``, ``head``, ``other``."""
        with self._lock:
            return {k: self._counts[k] for k in ("get", "get_bytes", "list", "head", "other")}


class CountingProxy(ForwardingProxy):
    """The proxy with ``CountingHooks``; ``counts()`` is safe to call while it runs."""

    def __init__(self, upstream: str, port: int = 0) -> None:
        self.counting = CountingHooks()
        super().__init__(upstream, self.counting, port=port, timeout=300)

    def counts(self) -> dict[str, int]:
        return self.counting.counts()


# --- the forwarder --------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (a SIGKILLed daemon, a reset we injected) is normal here."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def _exchange(method: str, path: str, ranged: bool, authorization: str) -> Exchange:
    parts = urllib.parse.urlsplit(path)
    _, _, key = parts.path.lstrip("/").partition("/")
    found = _CREDENTIAL.search(authorization)
    access_key = found.group(1) if found else ""
    return Exchange(method, path, urllib.parse.unquote(key), ranged, access_key)


Reply = tuple[int, str, list[tuple[str, str]]]


def _handler_for(proxy: ForwardingProxy) -> type[BaseHTTPRequestHandler]:
    hooks = proxy.hooks

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the hooks' counters are the output

        def do_GET(self) -> None:
            self._proxy()

        def do_HEAD(self) -> None:
            self._proxy()

        def do_PUT(self) -> None:
            self._proxy()

        def do_POST(self) -> None:
            self._proxy()

        def do_DELETE(self) -> None:
            self._proxy()

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                if self.upstream is not None:
                    self.upstream.close()

        def _proxy(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            exchange = _exchange(
                self.command,
                self.path,
                "Range" in self.headers,
                self.headers.get("Authorization", ""),
            )
            fault = hooks.request(exchange)
            if fault is not None and fault.action == "drop":
                hooks.answered(exchange, 0)
                self._drop()
                return
            if fault is not None and fault.action == "error":
                hooks.answered(exchange, fault.status)
                self._error(fault.status, fault.code, exchange.key)
                return
            reply = self._ask(body)
            if reply is None:
                hooks.answered(exchange, 502)
                self.send_error(502)
                return
            if hooks.whole_bodies:
                self._whole(exchange, reply, fault)
            else:
                hooks.answered(exchange, reply.status)
                self._streamed(exchange, reply)

        def _drop(self) -> None:
            """No answer: SO_LINGER 0, so closing sends a TCP RST (connection reset)."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # now, before the server's shutdown(SHUT_WR) sends a FIN
            self.close_connection = True

        def _ask(self, body: bytes | None) -> http.client.HTTPResponse | None:
            """The upstream's answer to this request, or None if the store cannot be asked."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            for fresh in (self.upstream is None, True):
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(
                        *proxy.upstream, timeout=proxy.timeout
                    )
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    return self.upstream.getresponse()
                except (OSError, http.client.HTTPException):
                    self.upstream.close()
                    self.upstream = None
                    if fresh:
                        return None
            return None

        # --- streamed: passed on as it comes ----------------------------------------------

        def _streamed(self, exchange: Exchange, reply: http.client.HTTPResponse) -> None:
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
            sent = 0
            if self.command == "HEAD":
                reply.read()
            else:
                while chunk := reply.read(CHUNK):
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if self.command != "HEAD" and 200 <= reply.status < 300:
                hooks.served(exchange, reply.status, sent)

        # --- whole: read first, then passed on or spoiled by a fault ------------------------

        def _whole(
            self, exchange: Exchange, reply: http.client.HTTPResponse, fault: Fault | None
        ) -> None:
            payload = reply.read()
            status, reason, headers = reply.status, reply.reason, reply.getheaders()
            if self.command == "GET" and 200 <= status < 300:
                hooks.served(exchange, status, len(payload))
            if fault is None or status >= 300:
                hooks.answered(exchange, status)
                self._respond(status, reason, headers, payload)
                return
            cut = fault.action in ("short", "reset")
            hooks.answered(exchange, 0 if cut else status)
            if fault.action == "flip" and payload:
                flipped = bytearray(payload)
                flipped[len(flipped) // 2] ^= 0x40
                self._respond(status, reason, headers, bytes(flipped))
            elif fault.action == "stall":
                self._head(status, reason, headers, len(payload))
                self.wfile.flush()
                time.sleep(fault.seconds)
                self.wfile.write(payload)
            elif fault.action == "short":
                self._head(status, reason, headers, len(payload))
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif fault.action == "reset":
                self._head(status, reason, headers, len(payload))
                self.wfile.write(payload[: len(payload) // 3])
                self.wfile.flush()
                # SO_LINGER 0: close() sends a TCP RST instead of a FIN
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.close_connection = True
            else:
                self._respond(status, reason, headers, payload)

        def _head(
            self, status: int, reason: str, headers: list[tuple[str, str]], length: int
        ) -> None:
            self.send_response_only(status, reason)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def _respond(
            self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes
        ) -> None:
            if self.command == "HEAD":  # no body: keep the object's own Content-Length
                length = int(dict((k.lower(), v) for k, v in headers).get("content-length", 0))
                self._head(status, reason, headers, length)
                return
            self._head(status, reason, headers, len(payload))
            self.wfile.write(payload)

        def _error(self, status: int, code: str, key: str) -> None:
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>injected by the test proxy</Message>"
                f"<Key>{key}</Key><RequestId>fault</RequestId></Error>"
            ).encode()
            headers = [("Content-Type", "application/xml")]
            self._respond(status, _REASONS.get(status, "Error"), headers, body)
            with contextlib.suppress(OSError):
                self.wfile.flush()

    return Handler
