"""What every request of the downloader process tells, and is told by, the rest: the host's
budgets (``pacing.Pacer``), the adaptive limit on requests in flight (``adaptive``), and
whether the store answers (``health``). One ``Signals`` per downloader process, shared by its
transfer client, its probe and its botocore clients (``hooks.observe``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefetchd.config import Config
from prefetchd.download.adaptive import AdaptiveLimit
from prefetchd.download.health import StoreHealth
from prefetchd.download.pacing import Pacer


@dataclass
class Signals:
    limit: AdaptiveLimit
    pacer: Pacer
    health: StoreHealth = field(default_factory=StoreHealth)

    @classmethod
    def of(cls, config: Config) -> Signals:
        dl = config.download
        limit = AdaptiveLimit(dl.concurrency)
        return cls(limit, Pacer(dl.max_requests_per_s, dl.max_bytes_per_s, limit=limit))
