"""A fault-injecting HTTP proxy for the tests: it sits between the daemon and the moto server on
127.0.0.1 and, following rules the test sets, answers with S3 errors, resets the connection
mid-body, cuts a body short, stalls, or flips a byte of a response.

Standard library only. One thread per connection; every request is forwarded to the upstream
server over a fresh connection, so the proxy never mixes up two responses.

    with FaultProxy(upstream_url) as proxy:
        proxy.add(Rule("error", status=503, code="SlowDown", key="data/000003", times=4))
        ... point ``source.endpoint_url`` at ``proxy.url`` ...
        assert proxy.hits("error") == 4

A rule matches GET requests of objects (never listings or bucket calls, unless ``listing`` is
set) whose key contains ``key``; ``ranged`` restricts it to ranged or to whole-object GETs.
Each rule fires ``times`` times (None: for ever) and, when ``probability`` < 1, only on a
seeded random share of the requests it matches.

Three store-wide hooks, for every request (listings included), checked before the rules:
``down`` (an outage: every request's connection is reset, TCP RST, no answer), ``refused_keys``
(access key ids answered 403 InvalidAccessKeyId, read from the SigV4 ``Authorization``
header's ``Credential``: moto checks no key, the proxy does) and ``max_rate`` (a store that
answers 503 SlowDown to requests above that many a second, over a sliding second). Every
request is recorded with its wall-clock time and the status it got (0: reset), for tests that
compare timelines with the daemon's.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Action = Literal["error", "reset", "short", "stall", "flip", "outage", "refused", "throttled"]
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 412: "Precondition Failed"}


@dataclass
class Rule:
    action: Action
    key: str = ""  # substring of the object key; "" matches every object
    ranged: bool | None = None  # True: only ranged GETs; False: only whole-object GETs
    times: int | None = 1  # how often it fires; None: until removed
    probability: float = 1.0
    status: int = 503  # "error": the HTTP status and S3 error code to answer with
    code: str = "SlowDown"
    seconds: float = 1.0  # "stall": how long to hold the response before its body
    listing: bool = False  # also match ListObjectsV2 requests
    fired: int = field(default=0, init=False)


@dataclass
class Request:
    method: str
    key: str
    ranged: bool
    fault: Action | None
    at: float = field(default_factory=time.time)  # wall clock, when the request arrived
    listing: bool = False
    access_key: str = ""
    status: int = 0  # the status answered; 0: reset, or not answered yet


class FaultProxy:
    """The proxy; ``url`` is its endpoint. Rules may be added and removed while it runs."""

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.served: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.down = False  # every connection reset (an outage)
        self.refused_keys: set[str] = set()  # access key ids answered 403 InvalidAccessKeyId
        self.max_rate: float | None = None  # requests a second above which: 503 SlowDown
        self._recent: deque[float] = deque()  # monotonic times of requests let through
        self.down_after: int | None = None  # go down once this many object GETs arrived
        self.down_at = 0.0  # wall clock the outage began (``down_after``)
        # (n, change): ``change(self)`` runs, under the lock, when object GET n+1 arrives
        self.after_gets: tuple[int, Callable[[FaultProxy], None]] | None = None
        self.changed_at = 0.0  # wall clock ``after_gets`` ran
        self._object_gets = 0
        self.server = _Server(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def add(self, rule: Rule) -> Rule:
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def hits(self, action: Action | None = None) -> int:
        """How many requests got a fault (of one kind, or of any)."""
        with self.lock:
            return sum(1 for r in self.requests if r.fault and action in (None, r.fault))

    def gets(self, key: str = "") -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.method == "GET" and key in r.key and r.key)

    def count_served(self, key: str, size: int) -> None:
        with self.lock:
            self.served[key] += size

    def bytes_served(self, key: str) -> int:
        """Body bytes of successful GETs of ``key`` passed on (a fault may cut them short)."""
        with self.lock:
            return self.served[key]

    def faults_by_action(self) -> Counter[str]:
        with self.lock:
            return Counter(r.fault for r in self.requests if r.fault)

    def timeline(self) -> list[Request]:
        with self.lock:
            return list(self.requests)

    def store_wide(
        self, method: str, key: str, ranged: bool, listing: bool, access_key: str
    ) -> Request | None:
        """The outage, key and rate hooks: the request recorded with its fault, or None."""
        with self.lock:
            fault: Action | None = None
            now = time.monotonic()
            if method == "GET" and not listing:
                self._object_gets += 1
                if self.down_after is not None and self._object_gets > self.down_after:
                    self.down, self.down_at, self.down_after = True, time.time(), None
                if self.after_gets is not None and self._object_gets > self.after_gets[0]:
                    change, self.after_gets = self.after_gets[1], None
                    change(self)
                    self.changed_at = time.time()
            if self.down:
                fault = "outage"
            elif access_key in self.refused_keys:
                fault = "refused"
            elif self.max_rate is not None:
                while self._recent and self._recent[0] <= now - 1.0:
                    self._recent.popleft()
                if len(self._recent) >= self.max_rate:
                    fault = "throttled"
                else:
                    self._recent.append(now)
            if fault is None:
                return None
            request = Request(method, key, ranged, fault, listing=listing, access_key=access_key)
            self.requests.append(request)
            return request

    def choose(
        self, method: str, key: str, ranged: bool, listing: bool, access_key: str = ""
    ) -> tuple[Rule | None, Request]:
        """The rule that fires for this request (and count it), or None; and its record."""
        with self.lock:
            chosen = None
            for rule in self.rules:
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if method != "GET" or (listing and not rule.listing):
                    continue
                if not listing and (rule.key not in key or rule.ranged not in (None, ranged)):
                    continue
                if rule.probability < 1 and self.rng.random() >= rule.probability:
                    continue
                rule.fired += 1
                chosen = rule
                break
            action = chosen.action if chosen else None
            request = Request(method, key, ranged, action, listing=listing, access_key=access_key)
            self.requests.append(request)
            return chosen, request


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (a SIGKILLed daemon, a reset we injected) is normal here."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def _object_key(path: str) -> tuple[str, bool]:
    """``(key, is_listing)`` of a path-style request ``/bucket/key?query``."""
    parts = urllib.parse.urlsplit(path)
    _, _, key = parts.path.lstrip("/").partition("/")
    key = urllib.parse.unquote(key)
    return key, not key


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the tests read counters, not logs

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

        def _proxy(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            key, listing = _object_key(self.path)
            ranged = "Range" in self.headers
            found = _CREDENTIAL.search(self.headers.get("Authorization", ""))
            access_key = found.group(1) if found else ""
            hooked = proxy.store_wide(self.command, key, ranged, listing, access_key)
            if hooked is not None:
                if hooked.fault == "outage":
                    self._reset()
                elif hooked.fault == "refused":
                    hooked.status = 403
                    self._error(403, "InvalidAccessKeyId", key)
                else:
                    hooked.status = 503
                    self._error(503, "SlowDown", key)
                return
            rule, request = proxy.choose(self.command, key, ranged, listing, access_key)
            if rule is not None and rule.action == "error":
                request.status = rule.status
                self._error(rule.status, rule.code, key)
                return
            status, reason, headers, payload = self._forward(body)
            request.status = status if rule is None or rule.action in ("stall", "flip") else 0
            if self.command == "GET" and not listing and status in (200, 206):
                proxy.count_served(key, len(payload))
            if rule is None or status >= 300:
                self._respond(status, reason, headers, payload)
            elif rule.action == "flip" and payload:
                flipped = bytearray(payload)
                flipped[len(flipped) // 2] ^= 0x40
                self._respond(status, reason, headers, bytes(flipped))
            elif rule.action == "stall":
                self._head(status, reason, headers, len(payload))
                self.wfile.flush()
                time.sleep(rule.seconds)
                self.wfile.write(payload)
            elif rule.action == "short":
                self._head(status, reason, headers, len(payload))
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif rule.action == "reset":
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

        def _reset(self) -> None:
            """No answer: SO_LINGER 0, so closing sends a TCP RST (connection reset)."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # now, before the server's shutdown(SHUT_WR) sends a FIN
            self.close_connection = True

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                return resp.status, resp.reason, resp.getheaders(), payload
            finally:
                conn.close()

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
