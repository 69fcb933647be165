"""The botocore clients' part in the signals (``signals.py``): hooks on a client's events.

- ``before-send`` (once per HTTP attempt, retries included): the request budget
  (``Pacer.wait``) - every request this host sends, GET, HEAD, listing page or retry, counts.
- ``needs-retry`` (after each attempt): what the answer says - throttling cuts the adaptive
  limit, a failure or an answer goes to ``StoreHealth`` - and, for what botocore's "standard"
  mode retries (throttling, 5xx, a dropped connection), the delay before the next attempt:
  botocore's own schedule (a random share of 2^attempt seconds, up to 20 s), but never more
  than ``MAX_RETRY_DELAY``. A request that slept 20 s at a time would wait out most of a short
  outage after it ended; the longer waits belong to the downloader's pause, which a probe
  ends as soon as the store answers (``probe.py``). Attempts stay ``download.retries`` + 1.
"""

from __future__ import annotations

import random
from typing import Any

from prefetchd.download.signals import Signals

MAX_RETRY_DELAY = 2.0
_THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
_RETRY_4XX = {"RequestTimeout", "TooManyRequests"}


def observe(client: Any, signals: Signals, attempts: int) -> Any:
    """Install the hooks on ``client`` (made with ``attempts`` tries in all); returns it."""
    events = client.meta.events
    # Always: the adaptive rate may engage later (the pacer returns at once while it is off).
    events.register("before-send.s3", lambda **_: signals.pacer.wait(1, 0))
    events.register_first("needs-retry.s3", lambda **kw: _needs_retry(signals, attempts, **kw))
    return client


def _needs_retry(
    signals: Signals,
    attempts_allowed: int,
    *,
    attempts: int = 1,
    response: Any = None,
    caught_exception: BaseException | None = None,
    **_: Any,
) -> float | None:
    """The delay before the next attempt, or None to leave the decision to botocore."""
    retryable = False
    if caught_exception is not None:
        signals.health.failed(trouble(caught_exception))
        retryable = True
    elif response is not None:
        status = int(getattr(response[0], "status_code", 0) or 0)
        code = str((response[1] or {}).get("Error", {}).get("Code", ""))
        throttled = code in _THROTTLING or status in (429, 503)
        if throttled:
            signals.limit.throttle()
        if status >= 500 and code not in _THROTTLING:
            signals.health.failed(f"{code or 'error'} (HTTP {status})")
        else:
            signals.health.answered()
            if status < 300:
                signals.limit.success()
        retryable = throttled or status >= 500 or code in _RETRY_4XX
    if not retryable or attempts >= attempts_allowed:
        return None
    return min(MAX_RETRY_DELAY, random.uniform(0, 2.0 ** (attempts - 1)))


def trouble(exc: BaseException) -> str:
    """A few words on a failure that got no answer from the store."""
    name = getattr(exc, "name", "")  # an awscrt error's name: AWS_IO_SOCKET_CLOSED...
    cause = getattr(exc, "kwargs", {}).get("error", "")  # botocore's: the urllib3 error
    text = f"{type(exc).__name__} {name} {cause} {exc}".lower().replace("_", " ")
    for words, said in (
        ("reset", "connection reset"),
        ("refused", "connection refused"),
        ("could not connect", "connection refused"),
        ("timed out", "timeout"),
        ("timeout", "timeout"),
        ("broken pipe", "connection closed"),
        ("closed", "connection closed"),
    ):
        if words in text:
            return said
    return type(exc).__name__
