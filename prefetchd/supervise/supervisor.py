"""The supervisor: ``prefetchd run``. Starts the children, keeps them alive, keeps the books.

Its loop reads like a table of contents: handle signals, reap and restart children, note the
shards trainers finished, notice epochs that are complete, return shards of dead trainers,
publish status, ping systemd. Each concept has its own room: start-up (``startup.py``: the
directories, the job, recovery, the fence), the children (``children.py``), the shards trainers
read (``deliveries.py``), complete epochs (``epochs.py``) and the status (``status_writer.py``).
Signal handlers only record the signal. A child that cannot boot stops the daemon with its
reason; a child that crashes later is restarted with backoff, and one that keeps crashing fails
the daemon.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import time
from collections import deque

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.errors import EXIT_FAILURE, EXIT_INCOMPLETE, EXIT_OK
from prefetchd.layout import Layout
from prefetchd.logs import redact
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.status_record import DaemonState
from prefetchd.owner import Ownership
from prefetchd.roles.shell import child_main
from prefetchd.roles.table import ROLES
from prefetchd.spares import delete_spares
from prefetchd.supervise.children import Child, ChildProcess, Lifecycle
from prefetchd.supervise.deliveries import Deliveries
from prefetchd.supervise.epochs import EpochBooks
from prefetchd.supervise.outcome import COMPLETE, bad_object_failure, outcome
from prefetchd.supervise.sdnotify import notify
from prefetchd.supervise.startup import JobIdentity, Startup
from prefetchd.supervise.states import DAEMON
from prefetchd.supervise.status import read_children
from prefetchd.supervise.status_writer import StatusWriter, count_entries

log = logging.getLogger(__name__)

TICK = 0.2
STOP_GRACE = 20.0  # seconds children get to drain before they are killed


class Supervisor:
    """Owns the daemon's state (``states.DAEMON``: starting, running, draining, done, failed),
    its reason and outcome, the stop signals received, and the loop that drives the rooms:
    start-up, the children's lifecycle, deliveries, epochs and status. It decides the exit code.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.layout = Layout.of(config)
        self.mp = multiprocessing.get_context("spawn")
        self.children = [Child(role, i) for role in ROLES for i in range(role.count(config))]
        self.lifecycle = Lifecycle(self.children, self._start_process)
        self.state = DaemonState.STARTING  # then only DAEMON.move changes it
        self.reason: str | None = None
        # once done and the children's final counters are in: (outcome, summary), outcome.py
        self.outcome: tuple[str, str] | None = None
        self.signals: deque[int] = deque()
        self.job = JobIdentity()
        self.ownership = Ownership([])
        self._fence: int | None = None  # holds the lock of ram_dir's job fence (fence.py)
        self.deliveries = Deliveries(self.layout, self)
        self.epochs = EpochBooks(config, self.layout, self.deliveries, self)
        self.status = StatusWriter(config, self.layout, self.children)

    @property
    def failed(self) -> bool:
        return self.state is DaemonState.FAILED

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        self._boot()
        try:
            while self.state in (DaemonState.STARTING, DaemonState.RUNNING):
                if self._handle_signals():
                    break  # children may already be exiting from the same signal: no restarts
                self._reap_and_restart()
                self._check_started()
                self.deliveries.note()
                self.epochs.check()
                self._return_orphaned_claims()
                self._check_bad_objects()
                self._check_done()
                self.status.publish(self)
                time.sleep(TICK)
        finally:
            self._shut_down()
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
        started = Startup(self.config, self.layout).start()
        self.ownership, self.job = started.ownership, started.job
        if started.failure is not None:
            self.fail(started.failure)
            return  # nothing starts; status says why, and ready_files() raises it
        self._fence = started.fence
        self.deliveries.watch(self.ownership)
        # SIGHUP drains like SIGTERM: it comes from a closed terminal, never from systemd or
        # Kubernetes, and there is no config to reload (docs/operations.md, "Restarts and
        # signals").
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, _f: self.signals.append(s))
        self._return_orphaned_claims(force=True)
        self.epochs.next_epoch = self.epochs.first_incomplete()
        self.status.serve_metrics()
        self.lifecycle.start_all()
        self.status.publish(self, force=True)

    def _shut_down(self) -> None:
        """Stop the children, take their last words, write the last status, let go of the
        watches, the fence's lock and the directories."""
        self.lifecycle.stop(STOP_GRACE)
        if self._fence is not None:  # ours (started): no child of this job runs any more
            delete_spares(self.layout.cache_tmp)
        self._collect_reports()  # the children's last words: final counters
        if self.state is DaemonState.DONE:
            # only now: a writer's last quarantine may not have been reported at done
            self.outcome = outcome(self.status.counts())
        self.status.publish(self, force=True)
        self.status.stop_metrics()
        self.deliveries.note()
        self.deliveries.close()
        if self._fence is not None:
            os.close(self._fence)  # the fence stays, stale: trainers of this job read on
        self.ownership.close()

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
                self.status.totals.add_dead(gone.child.name, gone.child.last_report)
            if gone.failure is not None and self.state is not DaemonState.FAILED:
                self.fail(gone.failure)  # the first child to fail gives the daemon's reason
        self.lifecycle.restart_due()
        self.lifecycle.kill_hung()

    def _check_started(self) -> None:
        self.lifecycle.mark_ready()
        if self.state is DaemonState.STARTING and self.lifecycle.all_running():
            DAEMON.move(self, DaemonState.RUNNING, "daemon", f"{len(self.children)} children")
            notify("READY=1")

    def fail(self, reason: str) -> None:
        self.reason = redact(reason)
        DAEMON.move(self, DaemonState.FAILED, "daemon", self.reason)
        notify(f"STATUS=failed: {self.reason}")

    # --- the end ------------------------------------------------------------------------------

    def _return_orphaned_claims(self, *, force: bool = False) -> None:
        """Shards claimed by a trainer process that died go back to ``ready/`` (every fifth
        tick, and once at start-up)."""
        if self.state is DaemonState.FAILED or (not force and int(time.monotonic() / TICK) % 5):
            return
        self.deliveries.return_orphaned_claims()

    def _check_done(self) -> None:
        count = self.config.epochs.count
        if count is None or self.epochs.next_epoch < count or self.state is DaemonState.FAILED:
            return  # (failed: a child or a loss in this very tick; its reason stands)
        lay = self.layout
        if count_entries(lay.ram_ready) or count_entries(lay.ram_claimed):
            return
        if self.deliveries.lost_something():
            return  # never done with records missing
        DAEMON.move(self, DaemonState.DONE, "daemon", f"{count} epochs")
        job = json.loads(lay.job_file.read_text(encoding="utf-8"))
        write_atomic(lay.job_file, json.dumps({**job, "finished": True}).encode(), fsync=True)
        log.info("all %d epochs consumed; exiting", count)

    def _check_bad_objects(self) -> None:
        """``output.on_bad_object: fail``: fail at the first object not delivered, naming it."""
        if self.config.output.on_bad_object != "fail" or self.state is DaemonState.FAILED:
            return
        reports = [c.last_report for c in self.children if c.last_report is not None]
        errors = sorted((e for r in reports for e in r.last_errors), key=lambda e: e.time)
        buckets = {s.bucket for s in self.config.sources}
        bucket = self.config.source.bucket if len(buckets) == 1 else None
        reason = bad_object_failure(self.status.counts(), errors, bucket)
        if reason is not None:
            self.fail(reason)
