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

Three store-wide settings, for every request (listings included), checked before the rules:
``down`` (an outage: every request's connection is reset, TCP RST, no answer), ``refused_keys``
(access key ids answered 403 InvalidAccessKeyId, read from the SigV4 ``Authorization``
header's ``Credential``: moto checks no key, the proxy does) and ``max_rate`` (a store that
answers 503 SlowDown to requests above that many a second, over a sliding second). Two
triggers change them mid-run: ``down_after`` (the store goes down once that many object GETs
arrived) and ``after_gets`` (a change run when object GET n+1 arrives). Every request is
recorded (``timeline``) with its wall-clock time and the status it got (0: reset or cut short),
for tests that compare timelines with the daemon's.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from testkit.proxy import Action, Exchange, ForwardingProxy, ProxyHooks

# what a request got: a rule's action, or one of the store-wide settings
Label = Action | Literal["outage", "refused", "throttled"]


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


@dataclass(frozen=True)
class StoreFault:
    """A store-wide setting's fault (``testkit.proxy.Fault``): ``drop`` for an outage, an
    S3 ``error`` for a refused key or a rate above ``max_rate``."""

    label: Label
    action: Action
    status: int = 0
    code: str = ""
    seconds: float = 0.0


_OUTAGE = StoreFault("outage", "drop")
_REFUSED = StoreFault("refused", "error", 403, "InvalidAccessKeyId")
_THROTTLED = StoreFault("throttled", "error", 503, "SlowDown")


@dataclass
class Request:
    method: str
    key: str
    ranged: bool
    fault: Label | None
    at: float = field(default_factory=time.time)  # wall clock, when the request arrived
    listing: bool = False
    access_key: str = ""
    status: int = 0  # the status answered; 0: reset or cut short, or not answered yet


class FaultHooks(ProxyHooks):
    """The rules and store-wide settings, every request seen (with the fault it got and the
    status it was answered with) and the body bytes served per key; rules and settings may be
    changed while the proxy runs (settings under ``lock``, or from ``after_gets``)."""

    whole_bodies = True

    def __init__(self, seed: int) -> None:
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.served_bytes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.down = False  # every connection reset (an outage)
        self.refused_keys: set[str] = set()  # access key ids answered 403 InvalidAccessKeyId
        self.max_rate: float | None = None  # requests a second above which: 503 SlowDown
        self.down_after: int | None = None  # go down once this many object GETs arrived
        self.down_at = 0.0  # wall clock the outage began (``down_after``)
        # (n, change): ``change(hooks)`` runs, under the lock, when object GET n+1 arrives
        self.after_gets: tuple[int, Callable[[FaultHooks], None]] | None = None
        self.changed_at = 0.0  # wall clock ``after_gets`` ran
        self._recent: deque[float] = deque()  # monotonic times of requests let through
        self._object_gets = 0
        self._records: dict[Exchange, Request] = {}  # requests not answered yet

    def request(self, exchange: Exchange) -> Rule | StoreFault | None:
        """The fault for this request (a store-wide one first, else the rule that fires, and
        count it), or None; the request is recorded either way."""
        with self.lock:
            fault: Rule | StoreFault | None = self._store_wide(exchange)
            if fault is None:
                fault = self._rule(exchange)
            record = Request(
                exchange.method,
                exchange.key,
                exchange.ranged,
                fault.label if isinstance(fault, StoreFault) else fault.action if fault else None,
                listing=exchange.listing,
                access_key=exchange.access_key,
            )
            self.requests.append(record)
            self._records[exchange] = record
            return fault

    def answered(self, exchange: Exchange, status: int) -> None:
        with self.lock:
            record = self._records.pop(exchange, None)
            if record is not None:
                record.status = status

    def _store_wide(self, exchange: Exchange) -> StoreFault | None:
        """The outage, key and rate settings (and their triggers), under the lock."""
        if exchange.method == "GET" and not exchange.listing:
            self._object_gets += 1
            if self.down_after is not None and self._object_gets > self.down_after:
                self.down, self.down_at, self.down_after = True, time.time(), None
            if self.after_gets is not None and self._object_gets > self.after_gets[0]:
                change, self.after_gets = self.after_gets[1], None
                change(self)
                self.changed_at = time.time()
        if self.down:
            return _OUTAGE
        if exchange.access_key in self.refused_keys:
            return _REFUSED
        if self.max_rate is not None:
            now = time.monotonic()
            while self._recent and self._recent[0] <= now - 1.0:
                self._recent.popleft()
            if len(self._recent) >= self.max_rate:
                return _THROTTLED
            self._recent.append(now)
        return None

    def _rule(self, exchange: Exchange) -> Rule | None:
        """The rule that fires for this request (and count it), or None; under the lock."""
        method, key, ranged, listing = (
            exchange.method,
            exchange.key,
            exchange.ranged,
            exchange.listing,
        )
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
            return rule
        return None

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

    def hits(self, action: Label | None = None) -> int:
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

    def timeline(self) -> list[Request]:
        """Every request so far, in arrival order, with its time, fault and status."""
        with self.faults.lock:
            return list(self.faults.requests)

    # the store-wide settings (``FaultHooks``), set while the proxy runs

    @property
    def down(self) -> bool:
        return self.faults.down

    @down.setter
    def down(self, value: bool) -> None:
        with self.faults.lock:
            self.faults.down = value

    @property
    def refused_keys(self) -> set[str]:
        return self.faults.refused_keys

    @property
    def max_rate(self) -> float | None:
        return self.faults.max_rate

    @max_rate.setter
    def max_rate(self, value: float | None) -> None:
        with self.faults.lock:
            self.faults.max_rate = value

    @property
    def down_after(self) -> int | None:
        return self.faults.down_after

    @down_after.setter
    def down_after(self, value: int | None) -> None:
        with self.faults.lock:
            self.faults.down_after = value

    @property
    def down_at(self) -> float:
        """Wall clock the outage of ``down_after`` began (0: not yet)."""
        return self.faults.down_at

    @property
    def after_gets(self) -> tuple[int, Callable[[FaultHooks], None]] | None:
        return self.faults.after_gets

    @after_gets.setter
    def after_gets(self, value: tuple[int, Callable[[FaultHooks], None]] | None) -> None:
        with self.faults.lock:
            self.faults.after_gets = value

    @property
    def changed_at(self) -> float:
        """Wall clock ``after_gets`` ran (0: not yet)."""
        return self.faults.changed_at
