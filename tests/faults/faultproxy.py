"""The fault-injecting proxy of the tests: ``testkit.proxy``'s forwarder between the daemon
and the moto server on 127.0.0.1, with hooks that, following rules the test sets, answer with
S3 errors, reset the connection mid-body, cut a body short, stall, or flip a byte of a response.

    with FaultProxy(upstream_url) as proxy:
        proxy.add(Rule("error", status=503, code="SlowDown", key="data/000003", times=4))
        ... point ``source.endpoint_url`` at ``proxy.url`` ...
        assert proxy.hits("error") == 4

A rule matches GET requests of objects (never listings or bucket calls, unless ``listing`` is
set) whose key contains ``key``; ``ranged`` restricts it to ranged or to whole-object GETs.
Each rule fires ``times`` times (None: for ever) and, when ``probability`` < 1, only on a
seeded random share of the requests it matches. Answers are read whole before they are passed
on (``whole_bodies``), so a fault can spoil any part of one.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field

from testkit.proxy import Action, Exchange, ForwardingProxy, ProxyHooks


@dataclass
class Rule:
    """A fault (``testkit.proxy.Fault``) and the requests it is injected into."""

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


class FaultHooks(ProxyHooks):
    """The rules, every request seen (with the fault it got) and the body bytes served per key;
    rules may be added and removed while the proxy runs."""

    whole_bodies = True

    def __init__(self, seed: int) -> None:
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.served_bytes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)

    def request(self, exchange: Exchange) -> Rule | None:
        """The rule that fires for this request (and count it), or None."""
        method, key, ranged, listing = (
            exchange.method,
            exchange.key,
            exchange.ranged,
            exchange.listing,
        )
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
            self.requests.append(Request(method, key, ranged, chosen.action if chosen else None))
            return chosen

    def served(self, exchange: Exchange, status: int, size: int) -> None:
        if exchange.method == "GET" and not exchange.listing and status in (200, 206):
            with self.lock:
                self.served_bytes[exchange.key] += size


class FaultProxy(ForwardingProxy):
    """The proxy with ``FaultHooks``; ``url`` is its endpoint."""

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        self.faults = FaultHooks(seed)
        super().__init__(upstream, self.faults)

    @property
    def requests(self) -> list[Request]:
        return self.faults.requests

    def add(self, rule: Rule) -> Rule:
        with self.faults.lock:
            self.faults.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.faults.lock:
            self.faults.rules.clear()

    def hits(self, action: Action | None = None) -> int:
        """How many requests got a fault (of one kind, or of any)."""
        with self.faults.lock:
            return sum(1 for r in self.faults.requests if r.fault and action in (None, r.fault))

    def gets(self, key: str = "") -> int:
        with self.faults.lock:
            return sum(
                1 for r in self.faults.requests if r.method == "GET" and key in r.key and r.key
            )

    def bytes_served(self, key: str) -> int:
        """Body bytes of successful GETs of ``key`` passed on (a fault may cut them short)."""
        with self.faults.lock:
            return self.faults.served_bytes[key]

    def faults_by_action(self) -> Counter[str]:
        with self.faults.lock:
            return Counter(r.fault for r in self.faults.requests if r.fault)
