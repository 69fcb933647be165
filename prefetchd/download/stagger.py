"""A fleet's start without a stampede: how long this host waits before its first request.

Hosts of one job (``sharding.num_workers`` > 1, or TF_CONFIG) started together would all list
the bucket and send their first GETs in the same second. Host ``i`` of ``n`` waits
``i / n x spread`` seconds, ``spread = min(MAX_SPREAD, n x PER_HOST)``: evenly spread, the same
on every run (deterministic from ``worker_index``), at most ``MAX_SPREAD`` seconds; worker 0
starts at once, and a single host never waits. 8 hosts: 0 to 0.7 s; 100 hosts: 0 to 9.9 s;
300 hosts and more: 0 to 30 s, about 10 hosts starting a second. Pure.
"""

from __future__ import annotations

from prefetchd.config import Config

PER_HOST = 0.1  # seconds of spread per host: about 10 hosts start each second
MAX_SPREAD = 30.0


def start_delay(config: Config) -> float:
    """Seconds this host waits before listing (or reading the manifest and sending GETs)."""
    n, i = config.sharding.num_workers, config.sharding.worker_index
    if n <= 1:
        return 0.0
    spread = min(MAX_SPREAD, n * PER_HOST)
    return spread * i / n
