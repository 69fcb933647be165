"""Prometheus metrics: the status record's figures as text exposition on 127.0.0.1 only.

The supervisor starts ``MetricsServer`` when ``status.metrics_port`` is set. Every scrape reads
the latest status record (rebuilt about once a second) through the record's own encoder, so
metrics and ``status --json`` show the same numbers. The names are interface, documented in
``docs/status.md``; ``METRICS`` is the single list both the exposition and the docs test read.
"""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefetchd.errors import RuntimeFailure
from prefetchd.messages.counters import quarantined_by_reason
from prefetchd.messages.status_record import VERDICTS, DaemonState, StatusRecord

LISTEN_ADDRESS = "127.0.0.1"  # never another interface: the figures are for this host


@dataclass(frozen=True)
class Figure:
    name: str  # without the ``_total`` a counter gets in the exposition
    kind: str  # "counter" | "gauge"
    key: str  # the status record's key (in ``status --json``)
    help: str


METRICS = (
    Figure("prefetchd_objects_downloaded", "counter", "objects_downloaded", "Objects downloaded"),
    Figure("prefetchd_downloaded_bytes", "counter", "bytes_downloaded", "Bytes downloaded"),
    Figure("prefetchd_objects_skipped", "counter", "objects_skipped", "Objects skipped"),
    Figure(
        "prefetchd_integrity_failures",
        "counter",
        "integrity_failures",
        "Fetches that failed verification (size, MD5, S3 checksum or TFRecord CRC)",
    ),
    Figure(
        "prefetchd_objects_unverified",
        "counter",
        "objects_unverified",
        "Objects published with only their size checked",
    ),
    Figure(
        "prefetchd_verify_requests",
        "counter",
        "verify_requests",
        "HEAD requests made to learn an object's checksum or part sizes",
    ),
    Figure("prefetchd_keep_hits", "counter", "keep_hits", "Objects served from download.keep"),
    Figure("prefetchd_keep_hit_bytes", "counter", "keep_hit_bytes", "Bytes served from keep"),
    Figure("prefetchd_keep_misses", "counter", "keep_misses", "Objects downloaded with keep on"),
    Figure("prefetchd_keep_miss_bytes", "counter", "keep_miss_bytes", "Bytes downloaded (keep)"),
    Figure("prefetchd_keep_gets_saved", "counter", "keep_gets_saved", "GETs saved by keep"),
    Figure(
        "prefetchd_keep_refetched",
        "counter",
        "keep_refetched",
        "Kept copies that failed their check on use and were downloaded again",
    ),
    Figure("prefetchd_keep_bytes", "gauge", "keep_bytes", "Bytes kept on disk (download.keep)"),
    Figure(
        "prefetchd_objects_refetched",
        "counter",
        "objects_refetched",
        "Objects deleted from cache_dir before a writer read them, and fetched again",
    ),
    Figure("prefetchd_records_written", "counter", "records_written", "Records in shards"),
    Figure("prefetchd_shards_written", "counter", "shards_written", "Shards published"),
    Figure("prefetchd_written_bytes", "counter", "bytes_written", "Bytes of shards published"),
    Figure("prefetchd_retries", "counter", "retries", "Requests retried"),
    Figure(
        "prefetchd_throttled",
        "counter",
        "throttled",
        "Throttling answers from the store (503 SlowDown, 429, 503)",
    ),
    Figure(
        "prefetchd_store_outages",
        "counter",
        "store_outages",
        "Outages of the object store seen (failures in a row, no answer)",
    ),
    Figure(
        "prefetchd_store_unreachable_since_seconds",
        "gauge",
        "store_unreachable_since",
        "Unix time the current outage of the object store began (absent while it answers)",
    ),
    Figure(
        "prefetchd_store_errors",
        "gauge",
        "store_errors",
        "Failures in a row of the current outage (0 while the store answers)",
    ),
    Figure(
        "prefetchd_concurrency_limit",
        "gauge",
        "concurrency_limit",
        "Requests allowed in flight now (adaptive, at most download.concurrency)",
    ),
    Figure(
        "prefetchd_budget_wait_seconds",
        "counter",
        "budget_wait_s",
        "Seconds requests were held back by download.max_requests_per_s / max_bytes_per_s",
    ),
    Figure("prefetchd_errors", "counter", "errors", "Objects skipped or quarantined"),
    Figure(
        "prefetchd_objects_quarantined",
        "counter",
        "objects_quarantined",
        "Objects set aside because parsing them failed",
    ),
    Figure(
        "prefetchd_consumer_wait_seconds",
        "counter",
        "consumer_wait_s",
        "Seconds trainers waited in ready_files() for a shard",
    ),
    Figure(
        "prefetchd_writer_ram_wait_seconds",
        "counter",
        "writer_ram_wait_s",
        "Seconds writers waited for room in output.ram_budget",
    ),
    Figure("prefetchd_epoch", "gauge", "epoch", "Lowest epoch not yet complete"),
    Figure("prefetchd_epoch_objects", "gauge", "epoch_objects", "Objects per epoch"),
    Figure(
        "prefetchd_epoch_objects_done",
        "gauge",
        "epoch_objects_done",
        "Objects of the downloading epoch done",
    ),
    Figure("prefetchd_epoch_bytes", "gauge", "epoch_bytes", "Bytes per epoch"),
    Figure(
        "prefetchd_epoch_bytes_done",
        "gauge",
        "epoch_bytes_done",
        "Bytes of the downloading epoch done",
    ),
    Figure("prefetchd_shards_ready", "gauge", "shards_ready", "Shards waiting for a trainer"),
    Figure("prefetchd_shards_claimed", "gauge", "shards_claimed", "Shards being read"),
    Figure("prefetchd_window_bytes", "gauge", "window_bytes", "Raw bytes in the window"),
    Figure("prefetchd_window_limit_bytes", "gauge", "window_limit", "download.window"),
    Figure(
        "prefetchd_window_fetching_bytes",
        "gauge",
        "window_fetching_bytes",
        "Bytes of the window still being downloaded",
    ),
    Figure("prefetchd_ram_bytes", "gauge", "ram_bytes", "Bytes of shards on the RAM disk"),
    Figure("prefetchd_ram_budget_bytes", "gauge", "ram_budget", "output.ram_budget"),
    Figure(
        "prefetchd_download_bytes_per_second",
        "gauge",
        "download_bytes_per_s",
        "Download rate over the last 10 s",
    ),
    Figure(
        "prefetchd_write_records_per_second",
        "gauge",
        "write_records_per_s",
        "Records written per second over the last 10 s",
    ),
    Figure("prefetchd_consumers", "gauge", "consumers", "Trainer processes reading shards"),
    Figure(
        "prefetchd_consumers_waiting", "gauge", "consumers_waiting", "Trainers waiting right now"
    ),
    Figure(
        "prefetchd_consumer_wait_ratio",
        "gauge",
        "consumer_wait_ratio",
        "Share of the last 10 s trainers spent waiting for a shard (0-1)",
    ),
    Figure(
        "prefetchd_writer_ram_wait_ratio",
        "gauge",
        "writer_ram_wait_ratio",
        "Share of the last 10 s writers spent blocked on the RAM budget (0-1)",
    ),
    Figure("prefetchd_job_eta_seconds", "gauge", "job_eta_s", "Seconds until the last epoch"),
)

# Labelled families, built from the record's structure (documented with METRICS).
LABELLED = (
    ("prefetchd_state", "gauge", "1 for the daemon's current state", "state"),
    ("prefetchd_bottleneck", "gauge", "1 for the current bottleneck verdict", "verdict"),
    ("prefetchd_child_up", "gauge", "1 while the child process is alive", "child"),
    ("prefetchd_child_healthy", "gauge", "1 while the child runs and reports", "child"),
    ("prefetchd_child_restarts", "counter", "Restarts of the child process", "child"),
    ("prefetchd_quarantined", "counter", "Objects quarantined, by reason", "reason"),
    ("prefetchd_store_unreachable", "gauge", "1 while the object store is unreachable", ""),
    ("prefetchd_source_downloaded_bytes", "counter", "Bytes downloaded of each source", "source"),
    (
        "prefetchd_source_bytes_per_second",
        "gauge",
        "Download rate of each source over the last 10 s",
        "source",
    ),
    ("prefetchd_source_window_bytes", "gauge", "Each source's raw bytes in the window", "source"),
    ("prefetchd_source_weight", "gauge", "Each source's weight in the epoch (0-1)", "source"),
    (
        "prefetchd_source_share",
        "gauge",
        "Each source's share of the epoch's bytes downloaded so far (0-1)",
        "source",
    ),
)


class StatusCollector(Collector):
    """Turns the latest status record into metric families at scrape time."""

    def __init__(self, latest: Callable[[], StatusRecord | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        status = self._latest()
        if status is None:
            return
        figures: dict[str, Any] = json.loads(status.encode())  # METRICS names its keys
        for fig in METRICS:
            value = figures.get(fig.key)
            if value is None:
                continue
            family = CounterMetricFamily if fig.kind == "counter" else GaugeMetricFamily
            yield family(fig.name, fig.help, value=float(value))
        yield from self._labelled(status)

    @staticmethod
    def _labelled(status: StatusRecord) -> Iterator[Metric]:
        state = GaugeMetricFamily("prefetchd_state", LABELLED[0][2], labels=["state"])
        for daemon_state in DaemonState:
            current = status.state == daemon_state
            state.add_metric([str(daemon_state)], 1.0 if current else 0.0)
        yield state
        verdict = status.bottleneck.verdict if status.bottleneck else None
        bottleneck = GaugeMetricFamily("prefetchd_bottleneck", LABELLED[1][2], labels=["verdict"])
        for name in VERDICTS:
            bottleneck.add_metric([name], 1.0 if verdict == name else 0.0)
        yield bottleneck
        up = GaugeMetricFamily("prefetchd_child_up", LABELLED[2][2], labels=["child"])
        healthy = GaugeMetricFamily("prefetchd_child_healthy", LABELLED[3][2], labels=["child"])
        restarts = CounterMetricFamily("prefetchd_child_restarts", LABELLED[4][2], labels=["child"])
        for child, info in sorted(status.children.items()):
            up.add_metric([child], 1.0 if info.alive else 0.0)
            healthy.add_metric([child], 1.0 if info.healthy else 0.0)
            restarts.add_metric([child], float(info.restarts))
        yield from (up, healthy, restarts)
        quarantined = CounterMetricFamily(
            "prefetchd_quarantined", LABELLED[5][2], labels=["reason"]
        )
        for reason, count in quarantined_by_reason(status.counts).items():
            quarantined.add_metric([reason], float(count))
        yield quarantined
        down = status.store_unreachable_since is not None
        yield GaugeMetricFamily("prefetchd_store_unreachable", LABELLED[6][2], value=float(down))
        yield from _per_source(status)


def _per_source(status: StatusRecord) -> Iterator[Metric]:
    """Each source's figures with a ``source`` label (sources:, several only)."""
    if not status.sources:
        return
    (downloaded, _, help_b, _), (rate, _, help_r, _) = LABELLED[7], LABELLED[8]
    (window, _, help_w, _), (weight, _, help_g, _), (share, _, help_s, _) = LABELLED[9:12]
    families = (
        (CounterMetricFamily(downloaded, help_b, labels=["source"]), "bytes_downloaded"),
        (GaugeMetricFamily(rate, help_r, labels=["source"]), "bytes_per_s"),
        (GaugeMetricFamily(window, help_w, labels=["source"]), "window_bytes"),
        (GaugeMetricFamily(weight, help_g, labels=["source"]), "weight"),
        (GaugeMetricFamily(share, help_s, labels=["source"]), "share"),
    )
    for family, key in families:
        for src in status.sources:
            value = getattr(src, key)
            if value is not None:
                family.add_metric([src.name], float(value))
        yield family


class MetricsServer:
    """The HTTP listener on ``127.0.0.1:port``, served from a daemon thread."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @classmethod
    def start(cls, port: int, latest: Callable[[], StatusRecord | None]) -> MetricsServer:
        """Raises ``RuntimeFailure`` naming the port when it cannot listen."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatusCollector(latest))
        try:
            server, thread = start_http_server(port, addr=LISTEN_ADDRESS, registry=registry)
        except OSError as exc:
            why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise RuntimeFailure(
                f"status.metrics_port {port}: cannot listen on {LISTEN_ADDRESS}:{port} ({why})"
            ) from None
        return cls(server, thread)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
