"""A cheap probe of the store: one ListObjectsV2 of at most one key, on a thread of its own.

Asked for (``kick``) while downloads are paused by store errors or credentials, and while
requests are in flight and none has finished for ``STALLED`` seconds, at most once every
``EVERY`` seconds. Its answer goes to ``StoreHealth`` (status dates and ends an outage by it)
and ``answered_at`` tells the downloader to end a pause at once: a pause of a minute after a
long outage need not be waited out once the store answers. One try, ``TIMEOUT`` seconds; with
``fresh`` credentials the chain is resolved again first (rotated credentials: ``retries.py``).
Costs at most one request every ``EVERY`` seconds, and only while something is wrong.
"""

from __future__ import annotations

import logging
import threading
import time

import botocore.exceptions

from prefetchd.config import Config
from prefetchd.download.hooks import trouble
from prefetchd.download.signals import Signals
from prefetchd.download.store import S3Client, describe, forget_credentials, make_client

log = logging.getLogger(__name__)

EVERY = 1.0
STALLED = 5.0
TIMEOUT = 3.0


class Probe:
    """The probe thread's state: when the store last answered it, and whether a probe runs."""

    def __init__(self, config: Config, signals: Signals) -> None:
        self._config = config
        self._signals = signals
        self._client: S3Client | None = None
        self._running = threading.Event()
        self._asked = -EVERY
        self.answered_at = 0.0  # time.monotonic() of the last probe the store answered
        self.denied = False  # the last probe's credentials were refused

    def kick(self, *, fresh: bool = False) -> None:
        """Start a probe unless one runs or one started less than ``EVERY`` seconds ago."""
        now = time.monotonic()
        if self._running.is_set() or now - self._asked < EVERY:
            return
        self._asked = now
        self._running.set()
        threading.Thread(target=self._run, args=(fresh,), name="probe", daemon=True).start()

    def _run(self, fresh: bool) -> None:
        try:
            self._probe(fresh)
        finally:
            self._running.clear()

    def _probe(self, fresh: bool) -> None:
        if fresh or self._client is None:
            if fresh:
                forget_credentials()
            self._client = make_client(self._config, pool=1, attempts=1, timeout=TIMEOUT)
        src = self._config.source
        try:
            self._client.list_objects_v2(Bucket=src.bucket, Prefix=src.prefix, MaxKeys=1)
        except botocore.exceptions.NoCredentialsError:
            self.denied = True  # none to be found yet: not the store's fault
            return
        except botocore.exceptions.ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            self.denied = status == 403
            if status >= 500:
                self._signals.health.failed(describe(exc))
            else:
                self._signals.health.answered()
            log.debug("probe: %s", describe(exc))
            return
        except Exception as exc:  # no answer: the outage goes on
            self._signals.health.failed(trouble(exc))
            return
        self.denied = False
        self._signals.health.answered()
        self.answered_at = time.monotonic()
