"""The supervisor's status: ``status.json`` about once a second, the systemd watchdog and
``STATUS=`` line, and the metrics server's latest record (``status.metrics_port``).

The record is built from the children's reports (``children/<child>.json``), the trainers'
(``consumers/``) and the daemon's own state; its keys are interface (docs/status.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from prefetchd import __version__
from prefetchd.atomic import dir_bytes, write_atomic
from prefetchd.config import Config
from prefetchd.layout import Layout
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.counters import Counts
from prefetchd.messages.epoch_keep import hit_ratio
from prefetchd.messages.status_record import ChildStatus, DaemonState, EpochStatus, StatusRecord
from prefetchd.supervise.children import Child
from prefetchd.supervise.diagnosis import diagnose
from prefetchd.supervise.epochs import EpochBooks
from prefetchd.supervise.keep_status import keep_epochs
from prefetchd.supervise.sdnotify import notify, watchdog_interval
from prefetchd.supervise.startup import JobIdentity
from prefetchd.supervise.states import ChildState
from prefetchd.supervise.status import (
    ConsumerWaits,
    Rates,
    Series,
    Totals,
    eta_seconds,
    read_consumers,
)

STATUS_INTERVAL = 1.0
HEALTHY_HEARTBEAT = 10.0  # a running child reported this recently: the watchdog is fed
MAX_EPOCHS_SHOWN = 4


class Daemon(Protocol):
    """What the status record shows of the daemon itself."""

    state: DaemonState
    reason: str | None
    outcome: tuple[str, str] | None  # once done: (outcome, summary), outcome.py
    job: JobIdentity
    epochs: EpochBooks


class StatusWriter:
    """Owns the status books of one run (counters carried across child restarts, the 10 s
    rates and wait series, the trainers' waits), the last record written and the one the
    metrics server serves, and the systemd notifications (watchdog, ``STATUS=``)."""

    def __init__(self, config: Config, layout: Layout, children: list[Child]) -> None:
        self.config = config
        self.layout = layout
        self.children = children
        self.totals = Totals()
        self.rates = Rates()
        self.series = Series()  # wait times, for the 10 s ratios
        self.source_rates = Series()  # each source's bytes downloaded (sources:), by name
        self.waits = ConsumerWaits()
        self.metrics: Any = None  # the metrics HTTP server, when status.metrics_port is set
        self.last_snapshot: StatusRecord | None = None
        self.started = time.time()  # shown to people; durations use started_monotonic
        self.started_monotonic = time.monotonic()
        self._last_notice = ""
        self._last_status = 0.0
        self._last_watchdog = 0.0
        self._watchdog = watchdog_interval()

    def serve_metrics(self) -> None:
        """Start the metrics server if ``status.metrics_port`` is set."""
        if self.config.status.metrics_port is not None:
            from prefetchd.supervise.metrics import (
                MetricsServer,  # only daemons with metrics load it
            )

            self.metrics = MetricsServer.start(
                self.config.status.metrics_port, lambda: self.last_snapshot
            )

    def stop_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()

    def counts(self) -> Counts:
        """The children's counters summed (over restarts too)."""
        reports = {c.name: c.last_report for c in self.children if c.last_report is not None}
        return self.totals.sum(reports)

    def publish(self, daemon: Daemon, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._watchdog and now - self._last_watchdog >= self._watchdog and self._healthy(daemon):
            notify("WATCHDOG=1")
            self._last_watchdog = now
        if not force and now - self._last_status < STATUS_INTERVAL:
            return
        self._last_status = now
        snapshot = self.snapshot(daemon, now)
        write_atomic(self.layout.status_file, snapshot.encode())
        self.last_snapshot = snapshot
        self._notify_status(snapshot)

    def _healthy(self, daemon: Daemon) -> bool:
        """Whether the systemd watchdog may be fed: every child alive, and once running, each
        one reported within ``HEALTHY_HEARTBEAT`` seconds (a hung or restarting child stops it)."""
        if daemon.state is DaemonState.STARTING:
            return all(c.alive for c in self.children)
        if daemon.state is not DaemonState.RUNNING:
            return False
        now = time.monotonic()
        return all(_child_healthy(c, c.last_report or ChildReport(), now) for c in self.children)

    def _notify_status(self, snapshot: StatusRecord) -> None:
        """One line for ``systemctl status`` (STATUS=), sent when it changes."""
        verdict = snapshot.bottleneck.verdict if snapshot.bottleneck else "unknown"
        line = (
            f"{snapshot.state}: epoch {snapshot.epoch}, "
            f"{snapshot.download_bytes_per_s / 1e6:.0f} MB/s, {verdict}"
        )
        if snapshot.reason:
            line = f"{snapshot.state}: {snapshot.reason}"
        if line != self._last_notice:
            notify(f"STATUS={line}")
            self._last_notice = line

    def snapshot(self, daemon: Daemon, now: float) -> StatusRecord:
        """The status record as of now (``now``: monotonic), with its bottleneck verdict."""
        lay = self.layout
        reports = {c.name: c.last_report for c in self.children if c.last_report is not None}
        counts = self.totals.sum(reports)
        self.rates.add(now, counts.bytes_downloaded, counts.records_written)
        download_rate, record_rate = self.rates.recent()
        elapsed = max(now - self.started_monotonic, 1e-9)
        dl = reports.get("downloader", ChildReport())
        errors = sorted((e for r in reports.values() for e in r.last_errors), key=lambda e: e.time)
        consumer_reports = read_consumers(lay)
        wait_total, consumers, waiting = self.waits.update(consumer_reports, now)
        resumed = sorted({r.resumed for r in consumer_reports.values() if r.resumed})
        ram_wait = sum(r.ram_wait_s for r in reports.values())
        self.series.add(now, {"consumer_wait_s": wait_total, "writer_ram_wait_s": ram_wait})
        wait_ratio = min(1.0, self.series.rate("consumer_wait_s") / max(consumers, 1))
        ram_wait_ratio = min(
            1.0, self.series.rate("writer_ram_wait_s") / max(self.config.output.writers, 1)
        )
        avg_rate = round(counts.bytes_downloaded / elapsed, 1)
        self.source_rates.add(now, {s.name: s.bytes_downloaded for s in dl.sources})
        sources = tuple(
            replace(s, bytes_per_s=round(self.source_rates.rate(s.name), 1)) for s in dl.sources
        )
        next_epoch = daemon.epochs.next_epoch
        record = StatusRecord(
            state=str(daemon.state),
            reason=daemon.reason,
            outcome=daemon.outcome[0] if daemon.outcome else None,
            outcome_summary=daemon.outcome[1] if daemon.outcome else None,
            pid=os.getpid(),
            prefetchd_version=__version__,
            config=str(self.config.path) if self.config.path else None,
            started=self.started,
            updated=time.time(),  # for people; staleness is judged by updated_monotonic
            updated_monotonic=now,
            uptime_s=round(elapsed, 1),
            epoch=next_epoch,
            epochs_total=self.config.epochs.count,
            download_epoch=dl.epoch,
            epoch_objects=dl.epoch_objects,
            epoch_objects_done=dl.epoch_objects_done,
            epoch_bytes=dl.epoch_bytes,
            epoch_bytes_done=dl.epoch_bytes_done,
            epochs=_epoch_progress(next_epoch, dl, download_rate or avg_rate),
            job_eta_s=self._job_eta(dl, download_rate or avg_rate),
            download_activity=dl.activity_text,
            objects_listed=dl.objects_listed,
            counts=counts,
            shards_ready=count_entries(lay.ram_ready),
            shards_claimed=count_entries(lay.ram_claimed),
            window_bytes=dl.window_bytes,
            window_fetching_bytes=dl.window_fetching_bytes,
            window_limit=self.config.download.window,
            concurrency_limit=dl.concurrency_limit,
            concurrency=self.config.download.concurrency,
            max_requests_per_s=self.config.download.max_requests_per_s,
            max_bytes_per_s=self.config.download.max_bytes_per_s,
            budget_wait_s=dl.budget_wait_s,
            store_unreachable_since=dl.store_unreachable_since,
            store_errors=dl.store_errors,
            store_last_error=dl.store_last_error,
            keep_bytes=dl.keep_bytes,
            keep_limit=self.config.download.keep,
            keep_hit_ratio=hit_ratio(counts.keep_hit_bytes, counts.keep_miss_bytes),
            keep_epochs=keep_epochs(lay) if self.config.download.keep else (),
            ram_bytes=dir_bytes(*lay.ram_shard_dirs),
            ram_budget=self.config.output.ram_budget,
            sources=sources,
            download_bytes_per_s=round(download_rate, 1),
            write_records_per_s=round(record_rate, 1),
            download_bytes_per_s_avg=avg_rate,
            write_records_per_s_avg=round(counts.records_written / elapsed, 1),
            writer_ram_wait_s=ram_wait,
            writer_ram_wait_ratio=round(ram_wait_ratio, 3),
            consumers=consumers,
            consumers_waiting=waiting,
            consumer_wait_s=round(wait_total, 3),
            consumer_wait_ratio=round(wait_ratio, 3),
            trainers_resumed="; ".join(resumed)[:400] or None,
            job_id=daemon.job.job_id,
            job=daemon.job.note,
            job_resumed=daemon.job.resumed,
            children={
                c.name: _child_status(c, c.last_report or ChildReport(), now) for c in self.children
            },
            last_errors=tuple(errors[-10:]),
        )
        return replace(record, bottleneck=diagnose(record, dl.activity))

    def _job_eta(self, dl: ChildReport, rate: float) -> float | None:
        """Seconds until the last epoch is downloaded; None: endless, or nothing moves."""
        count = self.config.epochs.count
        if count is None or dl.epoch is None:
            return None
        total, done = dl.epoch_bytes, dl.epoch_bytes_done
        return eta_seconds((count - 1 - dl.epoch) * total + (total - done), rate)


def _epoch_progress(next_epoch: int, dl: ChildReport, rate: float) -> tuple[EpochStatus, ...]:
    """Per-epoch progress: the epochs not yet complete (from ``next_epoch``), up to the one
    downloading, with ETAs at ``rate`` (the last 10 s, or since start if nothing moved lately)."""
    if dl.epoch is None:
        return ()
    total, done = dl.epoch_bytes, dl.epoch_bytes_done
    epochs = []
    for k in range(next_epoch, dl.epoch + 1)[-MAX_EPOCHS_SHOWN:]:
        downloading = k == dl.epoch and done < total
        epochs.append(
            EpochStatus(
                epoch=k,
                state="downloading" if downloading else "downloaded",
                objects=dl.epoch_objects,
                objects_done=dl.epoch_objects_done if downloading else dl.epoch_objects,
                bytes=total,
                bytes_done=done if downloading else total,
                eta_s=eta_seconds(total - done, rate) if downloading else 0.0,
            )
        )
    return tuple(epochs)


def _child_status(child: Child, report: ChildReport, now: float) -> ChildStatus:
    return ChildStatus(
        pid=child.pid,
        alive=child.alive,
        restarts=child.restarts,
        state=str(child.state),
        activity=report.activity_text,
        healthy=_child_healthy(child, report, now),
        heartbeat_age_s=_heartbeat_age(report, now),
    )


def _heartbeat_age(report: ChildReport, now: float) -> float | None:
    """Seconds since the child's last report, ``now`` being time.monotonic()."""
    beat = report.beat
    return round(max(0.0, now - beat), 1) if beat else None


def _child_healthy(child: Child, report: ChildReport, now: float) -> bool:
    age = _heartbeat_age(report, now)
    return (
        child.alive
        and child.state is ChildState.RUNNING
        and age is not None
        and age < HEALTHY_HEARTBEAT
    )


def count_entries(directory: Path) -> int:
    """How many names ``directory`` holds (0 if it is gone)."""
    try:
        return len(os.listdir(directory))
    except FileNotFoundError:
        return 0
