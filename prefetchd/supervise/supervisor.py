"""The supervisor: ``prefetchd run``. Starts the children, keeps them alive, keeps the books.

Its loop reads like a table of contents: handle signals, reap and restart children, note the
shards trainers finished, notice epochs that are complete, return shards of dead trainers,
publish status, ping systemd. At start-up it takes its directories (``owner.py``) and, resuming
a job, checks that nothing it published vanished (``recovery.py``). Signal
handlers only record the signal. A child that cannot boot stops the daemon with its reason; a
child that crashes later is restarted with backoff, and one that keeps crashing fails the daemon.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefetchd import __version__
from prefetchd.atomic import dir_bytes, holds_lock, write_atomic
from prefetchd.budget import rename_under_budget_lock
from prefetchd.config import Config
from prefetchd.errors import EXIT_FAILURE, EXIT_INCOMPLETE, EXIT_OK
from prefetchd.exactly_once.ledger import forget_epoch, record_delivered
from prefetchd.exactly_once.markers import first_epoch_without, mark_complete, mark_downloaded
from prefetchd.exactly_once.recovery import CACHE, RAM, recover, write_disks
from prefetchd.exactly_once.trained_objects import HostPositions, read_host_positions
from prefetchd.fence import remove_fence, write_fence
from prefetchd.inotify import IN_DELETE, Watch
from prefetchd.layout import Layout, claimed_object, epoch_prefix, is_own_file, parse_claim_name
from prefetchd.logs import redact
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.counters import Counts
from prefetchd.messages.epoch_keep import hit_ratio
from prefetchd.messages.status_record import ChildStatus, DaemonState, EpochStatus, StatusRecord
from prefetchd.owner import Ownership, claim_dirs
from prefetchd.roles.shell import child_main
from prefetchd.roles.table import ROLES
from prefetchd.supervise.children import Child, ChildProcess, Lifecycle
from prefetchd.supervise.diagnosis import diagnose
from prefetchd.supervise.job import JobStart, decide, save_job
from prefetchd.supervise.keep_status import keep_epochs
from prefetchd.supervise.outcome import COMPLETE, bad_object_failure, outcome
from prefetchd.supervise.sdnotify import notify, watchdog_interval
from prefetchd.supervise.states import DAEMON, ChildState
from prefetchd.supervise.status import (
    ConsumerWaits,
    Rates,
    Series,
    Totals,
    eta_seconds,
    read_children,
    read_consumers,
)

log = logging.getLogger(__name__)

TICK = 0.2
STATUS_INTERVAL = 1.0
EPOCH_CHECK_INTERVAL = 1.0
STOP_GRACE = 20.0  # seconds children get to drain before they are killed
HEALTHY_HEARTBEAT = 10.0  # a running child reported this recently: the watchdog is fed
MAX_EPOCHS_SHOWN = 4


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.layout = Layout.of(config)
        self.mp = multiprocessing.get_context("spawn")
        self.children = [Child(role, i) for role in ROLES for i in range(role.count(config))]
        self.lifecycle = Lifecycle(self.children, self._start_process)
        self.state = DaemonState.STARTING  # then only DAEMON.move changes it
        self.reason: str | None = None
        self.job_resumed: str | None = None  # sharding.resume_from: which job, which epoch
        # once done and the children's final counters are in: (outcome, summary), outcome.py
        self.outcome: tuple[str, str] | None = None
        self.signals: deque[int] = deque()
        self.totals = Totals()
        self.rates = Rates()
        self.series = Series()  # wait times, for the 10 s ratios
        self.source_rates = Series()  # each source's bytes downloaded (sources:), by name
        self.waits = ConsumerWaits()
        self.metrics: Any = None  # the metrics HTTP server, when status.metrics_port is set
        self.last_snapshot: StatusRecord | None = None
        self._last_notice = ""
        self.next_epoch = 0  # lowest epoch not yet complete
        self.ledger_epoch = 0  # lowest epoch whose ledger may still be needed
        self.started = time.time()  # shown to people; durations use started_monotonic
        self.started_monotonic = time.monotonic()
        self.ownership = Ownership([])
        self.job_id: str | None = None  # the job this daemon runs, and what it said about it
        self.job_note: str | None = None
        self._fence: int | None = None  # holds the lock of ram_dir's job fence (fence.py)
        self._finished: Watch | None = None  # claimed/: a trainer deleted a shard it read
        self._vanished: Watch | None = None  # ready/: nobody but a stranger deletes there
        self._last_status = 0.0
        self._last_epoch_check = 0.0
        self._last_watchdog = 0.0
        self._watchdog = watchdog_interval()

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        self._boot()
        try:
            while self.state in (DaemonState.STARTING, DaemonState.RUNNING):
                if self._handle_signals():
                    break  # children may already be exiting from the same signal: no restarts
                self._reap_and_restart()
                self._check_started()
                self._note_deliveries()
                self._check_epochs()
                self._return_orphaned_claims()
                self._check_bad_objects()
                self._check_done()
                self._publish_status()
                time.sleep(TICK)
        finally:
            self._stop_children()
            self._collect_reports()  # the children's last words: final counters
            if self.state is DaemonState.DONE:
                # only now: a writer's last quarantine may not have been reported at done
                self.outcome = outcome(self._counts())
            self._publish_status(force=True)
            if self.metrics is not None:
                self.metrics.stop()
            self._note_deliveries()
            for watch in (self._finished, self._vanished):
                if watch is not None:
                    watch.close()
            if self._fence is not None:
                os.close(self._fence)  # the fence stays, stale: trainers of this job read on
            self.ownership.close()
        if self.state is DaemonState.FAILED:
            return EXIT_FAILURE
        if self.outcome is not None and self.outcome[0] != COMPLETE:
            # the last line says it, after the children's last words
            log.warning("job finished: %s (exit %d)", self.outcome[1], EXIT_INCOMPLETE)
            return EXIT_INCOMPLETE
        if self.outcome is not None:
            log.info("job finished: %s", self.outcome[1])
        return EXIT_OK

    def _boot(self) -> None:
        self.ownership = claim_dirs(self.layout, self.config)
        # First: no trainer claims again until we know whose shards ram_dir holds (fence.py)
        remove_fence(self.layout.job_fence)
        self.layout.create()
        start = self._prepare_state()
        if start.resume:
            reason = recover(self.layout, self.ownership)
            if reason is not None:
                self._fail(reason)
                return  # nothing starts; status says why, and ready_files() raises it
        write_disks(self.layout, self.ownership)
        # what stays is decided: trainers may claim (before any child publishes a shard)
        self._fence = write_fence(self.layout.job_fence, self.job_id or "", self.job_note or "")
        self._finished = Watch(self.layout.ram_claimed, IN_DELETE)
        self._vanished = Watch(self.layout.ram_ready, IN_DELETE)
        # SIGHUP drains like SIGTERM: it comes from a closed terminal, never from systemd or
        # Kubernetes, and there is no config to reload (docs/operations.md, "Restarts and
        # signals").
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, _f: self.signals.append(s))
        self._return_orphaned_claims(force=True)
        self.next_epoch = self._first_incomplete_epoch()
        if self.config.status.metrics_port is not None:
            from prefetchd.supervise.metrics import (
                MetricsServer,  # only daemons with metrics load it
            )

            self.metrics = MetricsServer.start(
                self.config.status.metrics_port, lambda: self.last_snapshot
            )
        self.lifecycle.start_all()
        self._publish_status(force=True)

    def _prepare_state(self) -> JobStart:
        """Resume the same unfinished job, or start a new one, sweeping what the old one left;
        says which in the daemon's first log line (``supervise/job.py``). A new job with
        ``sharding.resume_from`` resumes the interrupted epoch of a job on another number of
        hosts (``_resume_hosts``)."""
        start = decide(self.layout, self.config.job_fingerprint())
        # the old hosts' positions are checked before anything is touched (exit 2 naming
        # what is missing), and the epochs they finished are this job's too
        rehost = read_host_positions(self.config) if self.config.sharding.resume_from else None
        splits = rehost is not None and (
            not start.resume or first_epoch_without(self.layout.downloaded_marker) <= rehost.epoch
        )
        if rehost is not None and splits:
            # the old hosts' objects are found again by their place in the listing: refuse a
            # source whose keys changed since, before anything is touched (exit 2). Imported
            # here: only a resume on other hosts makes the supervisor list (botocore).
            from prefetchd.download.rehost import check_source, unchecked_note

            unchecked = check_source(self.config, rehost)
            if unchecked:
                log.warning("%s", unchecked_note(rehost, unchecked))
        if rehost is not None:
            self.job_resumed = (
                f"resumed epoch {rehost.epoch} of a job of {rehost.num_workers} hosts "
                f"(positions in {self.config.sharding.resume_from})"
            )
        removed, foreign = (0, []) if start.resume else self._wipe()
        if rehost is not None and not start.resume:
            self._resume_hosts(rehost)
        for stale in self.layout.children.iterdir():
            stale.unlink()
        save_job(self.layout, start)
        self.job_id = start.job
        self.job_note = start.note(
            epoch=self._first_incomplete_epoch(), count=self.config.epochs.count, removed=removed
        )
        log.info("%s", self.job_note)
        if rehost is not None and not start.resume:
            sharding = self.config.sharding
            log.info(
                "resuming epoch %d of a job of %d hosts (positions in %s) as host %d of %d",
                rehost.epoch,
                rehost.num_workers,
                sharding.resume_from,
                sharding.worker_index,
                sharding.num_workers,
            )
        for path in foreign:
            log.warning("left %s alone: prefetchd did not make it", path)
        return start

    def _resume_hosts(self, hosts: HostPositions) -> None:
        """A new job resuming one run on ``hosts.num_workers`` hosts: the epochs before the
        interrupted one were delivered by the old hosts, so they are marked downloaded and
        complete here (the trainers pass over them); the downloader delivers what is left of
        the interrupted one (``download/rehost.py``)."""
        for epoch in range(hosts.epoch):
            mark_downloaded(self.layout, epoch, 0)
            mark_complete(self.layout, epoch)

    def _wipe(self) -> tuple[int, list[str]]:
        """Delete what an earlier job left: only names our scheme makes (``layout.is_own_file``);
        anything else in our directories is someone's, and stays. Returns how many shards it
        deleted from ram_dir and the paths it left alone."""
        lay = self.layout
        shard_dirs = set(lay.ram_shard_dirs)
        removed, foreign = 0, []
        lay.disks_file.unlink(missing_ok=True)
        for directory in (
            lay.cache_tmp,
            lay.cache_meta,
            lay.cache_ready,
            lay.cache_claimed,
            *lay.ram_shard_dirs,
            lay.download_logs,
            lay.journal,
            lay.epochs,
            lay.shards,
        ):
            # Empty, don't replace: trainers may be watching these directories with inotify.
            for entry in os.scandir(directory):
                if is_own_file(directory.name, entry.name) and not entry.is_dir():
                    os.unlink(entry.path)
                    removed += directory in shard_dirs
                else:
                    foreign.append(entry.path)
        return removed, foreign

    def _first_incomplete_epoch(self) -> int:
        return first_epoch_without(self.layout.complete_marker)

    # --- signals ------------------------------------------------------------------------------

    def _handle_signals(self) -> bool:
        """Start draining if a stop signal arrived; True if the daemon is draining."""
        while self.signals:
            name = signal.Signals(self.signals.popleft()).name
            if self.state is DaemonState.DRAINING:
                log.info("received %s: already draining", name)
                continue
            notify("STOPPING=1")
            DAEMON.move(self, DaemonState.DRAINING, "daemon", f"received {name}")
        return self.state is DaemonState.DRAINING

    # --- children -----------------------------------------------------------------------------

    def _start_process(self, child: Child) -> ChildProcess:
        """The lifecycle's spawn seam: a fresh interpreter running the child's role, with no
        report of a previous process left for it to be mistaken for."""
        self.layout.child_report(child.name).unlink(missing_ok=True)
        process = self.mp.Process(
            target=child_main,
            args=(child.name, child.role.entry, child.index, self.config),
            name=f"prefetchd-{child.name}",
        )
        process.start()
        return process

    def _collect_reports(self) -> None:
        reports = read_children(self.layout)
        for child in self.children:
            raw = reports.get(child.name)
            report = ChildReport.decode_object(raw) if raw else None
            if report is not None and report.pid == child.pid:
                child.last_report = report

    def _reap_and_restart(self) -> None:
        self._collect_reports()
        if self.signals:
            return  # a stop signal just arrived (perhaps to the whole group): drain, no restart
        for gone in self.lifecycle.reap():
            if gone.child.last_report is not None:
                self.totals.add_dead(gone.child.name, gone.child.last_report)
            if gone.failure is not None and self.state is not DaemonState.FAILED:
                self._fail(gone.failure)  # the first child to fail gives the daemon's reason
        self.lifecycle.restart_due()
        self.lifecycle.kill_hung()

    def _check_started(self) -> None:
        self.lifecycle.mark_ready()
        if self.state is DaemonState.STARTING and self.lifecycle.all_running():
            DAEMON.move(self, DaemonState.RUNNING, "daemon", f"{len(self.children)} children")
            notify("READY=1")

    def _stop_children(self) -> None:
        self.lifecycle.stop(STOP_GRACE)

    def _fail(self, reason: str) -> None:
        self.reason = redact(reason)
        DAEMON.move(self, DaemonState.FAILED, "daemon", self.reason)
        notify(f"STATUS=failed: {self.reason}")

    # --- epochs and shards --------------------------------------------------------------------

    def _note_deliveries(self) -> None:
        """Record the shards trainers finished (their claimant moved them to ``done/``, or
        deleted them) in the ledger, so a restart after a lost RAM disk knows what was read, and
        delete those in ``done/`` (their pages are freed here, not in the trainer); fail if a
        shard nobody claimed was deleted from ``ready/`` (its records are gone, and no trainer
        got them)."""
        if self._finished is None or self._vanished is None:
            return
        retired = _retired(self.layout.ram_done)
        done = [
            claim.shard
            for event in self._finished.read_now()
            if not event.overflow and (claim := parse_claim_name(event.name)) is not None
        ]
        done += [shard for _, shard in retired]
        if done:
            record_delivered(self.layout, done)
        for shard in done:  # a position covered it before its trainer freed it: no one reads it
            self.layout.shard_mix(shard).unlink(missing_ok=True)
        for name, _ in retired:  # noted first: a crash in between leaves them, still delivered
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.layout.ram_done / name)
        lost = [e.name for e in self._vanished.read_now() if not e.overflow]
        if lost:
            self._check_disks()  # the whole directory emptied says more than one shard gone
        if lost and self.state is not DaemonState.FAILED:
            self._fail(
                f"output.ram_dir {self.layout.ram}: shard {lost[0]} was deleted from ready/ "
                f"before any trainer read it ({len(lost)} shards in all): its records are lost"
            )

    def _lost_something(self) -> bool:
        """Whether the ledger or the disks show a loss now (the daemon is then failed)."""
        self._note_deliveries()
        self._check_disks()
        return self.state is DaemonState.FAILED

    def _check_disks(self) -> None:
        """Fail if the RAM disk or the cache was emptied under us (our owner marker is gone):
        what trainers had not read is lost, and a restart re-creates it or says why not."""
        for claim in self.ownership:
            if claim.key in (RAM, CACHE) and not claim.intact():
                if self.state is not DaemonState.FAILED:
                    self._fail(
                        f"{claim.key} {claim.path} was emptied under the running daemon (its "
                        "owner marker is gone): restart prefetchd to re-create what trainers "
                        "had not read, or to learn why it cannot"
                    )
                return

    def _check_epochs(self) -> None:
        """Mark epoch k complete once it is downloaded and no raw object of it is left: writers
        delete a raw object only after the shard holding its last record is published.

        The full check (and the disks') runs every ``EPOCH_CHECK_INTERVAL``; in between, on every
        tick once ``_may_be_complete``: trainers learn an epoch's end from its marker, so a
        marker written up to a second late kept them (and a job of one epoch) waiting that long.
        """
        now = time.monotonic()
        if now - self._last_epoch_check >= EPOCH_CHECK_INTERVAL:
            self._last_epoch_check = now
            self._check_disks()
        elif not self._may_be_complete(self.next_epoch):
            return
        if self.state is DaemonState.FAILED:
            return
        count = self.config.epochs.count
        while (count is None or self.next_epoch < count) and self._epoch_complete(self.next_epoch):
            epoch = self.next_epoch
            mark_complete(self.layout, epoch)
            self.layout.download_log(epoch).unlink(missing_ok=True)
            log.info("epoch %d: every shard published", epoch)
            self.next_epoch += 1
        self._forget_read_epochs()

    def _forget_read_epochs(self) -> None:
        """Drop the ledger of complete epochs none of whose shards is left on the RAM disk:
        trainers read them all. The listing comes before the deliveries are noted, so every
        deletion it missed is in the ledger first."""
        while self.ledger_epoch < self.next_epoch:
            prefix = epoch_prefix(self.ledger_epoch)
            lay = self.layout
            try:
                names = os.listdir(lay.ram_ready) + os.listdir(lay.ram_tmp)
                claims = [parse_claim_name(n) for n in os.listdir(lay.ram_claimed)]
            except FileNotFoundError:
                return  # the RAM disk was emptied: _check_disks fails the daemon
            names += [claim.shard for claim in claims if claim is not None]
            if any(n.startswith(prefix) for n in names):
                return
            self._note_deliveries()
            forget_epoch(lay, self.ledger_epoch)
            self.ledger_epoch += 1

    def _may_be_complete(self, epoch: int) -> bool:
        """The cheap half of ``_epoch_complete``: the epoch is downloaded and no writer holds an
        object of it (``claimed/`` holds at most ``writers x mix`` names, while ``ready/`` and
        ``meta/`` may hold a whole window's)."""
        if not self.layout.downloaded_marker(epoch).exists():
            return False
        prefix = epoch_prefix(epoch)
        try:
            claimed = os.listdir(self.layout.cache_claimed)
        except FileNotFoundError:
            return False  # the cache was emptied: _check_disks fails the daemon with the reason
        return not any((claimed_object(n) or "").startswith(prefix) for n in claimed)

    def _epoch_complete(self, epoch: int) -> bool:
        if not self._may_be_complete(epoch):
            return False
        prefix = epoch_prefix(epoch)
        try:
            ready, meta = os.listdir(self.layout.cache_ready), os.listdir(self.layout.cache_meta)
        except FileNotFoundError:
            return False
        # An object's meta goes only once its records are in shards (or it was skipped): one
        # deleted from ready/ under us is still owed, and the downloader fetches it again.
        return not any(n.startswith(prefix) for n in (*ready, *meta))

    def _return_orphaned_claims(self, *, force: bool = False) -> None:
        """Shards claimed by a trainer process that died go back to ``ready/``."""
        if self.state is DaemonState.FAILED or (not force and int(time.monotonic() / TICK) % 5):
            return
        lay = self.layout
        dead: dict[str, bool] = {}
        try:
            names = os.listdir(lay.ram_claimed)
        except FileNotFoundError:
            return  # the RAM disk was emptied: _check_disks fails the daemon with the reason
        for name in names:
            parsed = parse_claim_name(name)
            if parsed is None:
                continue
            owner, shard = parsed
            if owner not in dead:
                dead[owner] = not holds_lock(lay.consumer_lock(owner))
            if dead[owner]:
                log.warning("trainer %s died holding %s; returning it to ready/", owner, shard)
                # a resumed trainer may have taken it back from the dead claim meanwhile
                with contextlib.suppress(FileNotFoundError):
                    rename_under_budget_lock(lay, lay.ram_claimed / name, lay.ram_ready / shard)
        for claimant, lock in lay.consumer_locks().items():
            is_dead = dead[claimant] if claimant in dead else not holds_lock(lock)
            if is_dead:
                lock.unlink(missing_ok=True)

    def _check_done(self) -> None:
        count = self.config.epochs.count
        if count is None or self.next_epoch < count or self.state is DaemonState.FAILED:
            return  # (failed: a child or a loss in this very tick; its reason stands)
        lay = self.layout
        if _count(lay.ram_ready) or _count(lay.ram_claimed):
            return
        if self._lost_something():
            return  # never done with records missing
        DAEMON.move(self, DaemonState.DONE, "daemon", f"{count} epochs")
        job = json.loads(lay.job_file.read_text(encoding="utf-8"))
        write_atomic(lay.job_file, json.dumps({**job, "finished": True}).encode(), fsync=True)
        log.info("all %d epochs consumed; exiting", count)

    def _counts(self) -> Counts:
        """The children's counters summed (over restarts too)."""
        reports = {c.name: c.last_report for c in self.children if c.last_report is not None}
        return self.totals.sum(reports)

    def _check_bad_objects(self) -> None:
        """``output.on_bad_object: fail``: fail at the first object not delivered, naming it."""
        if self.config.output.on_bad_object != "fail" or self.state is DaemonState.FAILED:
            return
        reports = [c.last_report for c in self.children if c.last_report is not None]
        errors = sorted((e for r in reports for e in r.last_errors), key=lambda e: e.time)
        buckets = {s.bucket for s in self.config.sources}
        bucket = self.config.source.bucket if len(buckets) == 1 else None
        reason = bad_object_failure(self._counts(), errors, bucket)
        if reason is not None:
            self._fail(reason)

    # --- status -------------------------------------------------------------------------------

    def _publish_status(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._watchdog and now - self._last_watchdog >= self._watchdog and self._healthy():
            notify("WATCHDOG=1")
            self._last_watchdog = now
        if not force and now - self._last_status < STATUS_INTERVAL:
            return
        self._last_status = now
        snapshot = self.snapshot(now)
        write_atomic(self.layout.status_file, snapshot.encode())
        self.last_snapshot = snapshot
        self._notify_status(snapshot)

    def _healthy(self) -> bool:
        """Whether the systemd watchdog may be fed: every child alive, and once running, each
        one reported within ``HEALTHY_HEARTBEAT`` seconds (a hung or restarting child stops it)."""
        if self.state is DaemonState.STARTING:
            return all(c.alive for c in self.children)
        if self.state is not DaemonState.RUNNING:
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

    def snapshot(self, now: float) -> StatusRecord:
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
        record = StatusRecord(
            state=str(self.state),
            reason=self.reason,
            outcome=self.outcome[0] if self.outcome else None,
            outcome_summary=self.outcome[1] if self.outcome else None,
            pid=os.getpid(),
            prefetchd_version=__version__,
            config=str(self.config.path) if self.config.path else None,
            started=self.started,
            updated=time.time(),  # for people; staleness is judged by updated_monotonic
            updated_monotonic=now,
            uptime_s=round(elapsed, 1),
            epoch=self.next_epoch,
            epochs_total=self.config.epochs.count,
            download_epoch=dl.epoch,
            epoch_objects=dl.epoch_objects,
            epoch_objects_done=dl.epoch_objects_done,
            epoch_bytes=dl.epoch_bytes,
            epoch_bytes_done=dl.epoch_bytes_done,
            epochs=self._epoch_progress(dl, download_rate or avg_rate),
            job_eta_s=self._job_eta(dl, download_rate or avg_rate),
            download_activity=dl.activity_text,
            objects_listed=dl.objects_listed,
            counts=counts,
            shards_ready=_count(lay.ram_ready),
            shards_claimed=_count(lay.ram_claimed),
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
            job_id=self.job_id,
            job=self.job_note,
            job_resumed=self.job_resumed,
            children={
                c.name: _child_status(c, c.last_report or ChildReport(), now) for c in self.children
            },
            last_errors=tuple(errors[-10:]),
        )
        return replace(record, bottleneck=diagnose(record, dl.activity))

    def _epoch_progress(self, dl: ChildReport, rate: float) -> tuple[EpochStatus, ...]:
        """Per-epoch progress: the epochs not yet complete, up to the one downloading, with
        ETAs at ``rate`` (the last 10 s, or since start if nothing moved lately)."""
        if dl.epoch is None:
            return ()
        total, done = dl.epoch_bytes, dl.epoch_bytes_done
        epochs = []
        for k in range(self.next_epoch, dl.epoch + 1)[-MAX_EPOCHS_SHOWN:]:
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

    def _job_eta(self, dl: ChildReport, rate: float) -> float | None:
        """Seconds until the last epoch is downloaded; None: endless, or nothing moves."""
        count = self.config.epochs.count
        if count is None or dl.epoch is None:
            return None
        total, done = dl.epoch_bytes, dl.epoch_bytes_done
        return eta_seconds((count - 1 - dl.epoch) * total + (total - done), rate)


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


def _retired(directory: Path) -> list[tuple[str, str]]:
    """``(name, shard)`` of the claims in ``done/``: shards their trainers finished (none if
    it is gone). Anything else there is not ours, and is left alone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [(name, claim.shard) for name in names if (claim := parse_claim_name(name)) is not None]


def _count(directory: Path) -> int:
    try:
        return len(os.listdir(directory))
    except FileNotFoundError:
        return 0
