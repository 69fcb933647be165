"""The downloader process: list once (``lister.py``), then fetch each epoch's objects into the
cache window.

Objects are fetched in the epoch's seeded order (``plan.py``), ``download.concurrency``
requests at a time (``transfer.py``), while the raw bytes on disk stay within
``download.window`` (``admission.py``). A fetched object is verified, then published into
``ready/`` in an order that makes a crash at any point safe (``publish.py``, with its line in
the download log: ``exactly_once/download_log.py``); one that failed is fetched again or
skipped (``retries.py``). With ``download.keep``, an object whose verified copy is kept is
published from it without a GET (``handover.py``). At start-up the cache a previous run left is
swept (``restart.py``). When every object of epoch k is published or skipped,
``epochs/<k>.downloaded`` is written.

An object published and then deleted from ``ready/`` by someone else, before any writer read
it, is fetched again under the same name and counted in ``objects_refetched``, at start-up
(``restart.py``) and while running (``_refetch``) alike.
"""

from __future__ import annotations

import logging
import os
import queue
import time

from prefetchd.budget import Window
from prefetchd.child.context import PARENT_CHECK_INTERVAL, REPORT_INTERVAL, ChildContext
from prefetchd.download.admission import Admission
from prefetchd.download.handover import Handover
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.lister import ShareLister
from prefetchd.download.plan import EpochPlan, EpochProgress
from prefetchd.download.probe import STALLED, Probe
from prefetchd.download.publish import Publisher
from prefetchd.download.restart import read_logs, roll_forward, sweep_metas
from prefetchd.download.retries import Retries
from prefetchd.download.signals import Signals
from prefetchd.download.transfer import Transfer, make_transfer
from prefetchd.exactly_once.download_log import DownloadLog
from prefetchd.inotify import IN_DELETE, IN_MOVED_FROM, Watch
from prefetchd.messages.activity import Activity
from prefetchd.messages.counters import new_downloader_counters

log = logging.getLogger(__name__)

# How often the loop asks ``should_stop()`` (the supervisor's liveness; a stop signal sets
# ``ctx.stopping``, read every turn), and looks again whether a report is due after one was
# made elsewhere: each is a call per turn otherwise.
STOP_CHECK_EVERY = PARENT_CHECK_INTERVAL
REPORT_LOOK_EVERY = 0.05


class Downloader:
    """The downloader process's main loop, and the parts it is made of: ``lister`` (the
    listing at start-up), ``plan`` (the epochs' order, what is done), ``admission`` (the
    window and its inotify watches), ``transfer`` (the S3 client), ``publisher`` (into
    ``ready/``), ``retries`` (failed fetches, pauses), ``handover`` (kept copies) and
    ``download_log``. It owns only the requests in flight (``active``) and the order of the
    steps."""

    transfer: Transfer  # made in run(), once the share is listed and the cache swept

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.config = config = ctx.config
        self.layout = ctx.layout
        self.window = Window(config.download.window)
        handoff = Window(config.download.window)  # kept objects handed to writers
        self.counters = ctx.counters = new_downloader_counters(self.window.limit)
        download = config.download
        keeper = Keeper(
            self.layout, config.source.bucket, download.keep, download.part_size, self.counters
        )
        keeping = keeper if download.keep else None
        self.active: dict[str, Job] = {}  # prepared and not yet handled, by local name
        self.download_log = DownloadLog(self.layout)
        self.plan = EpochPlan(
            config, self.layout, self.download_log, keeping, self.counters, self._before_epoch
        )
        self.epochs: dict[int, EpochProgress] = self.plan.epochs
        self.publisher = Publisher(
            ctx, self.counters, self.window, self.download_log, self.plan, keeping
        )
        self._transfer_done = self.publisher.transfer_done  # called on the transfer's threads
        self.retries = Retries(ctx, self.counters, self.window, self.publisher)
        self.signals = Signals.of(config)
        self.probe = self.retries.probe = Probe(config, self.signals)
        self._handled_at = 0.0  # time.monotonic() a job last settled (a stall wakes the probe)
        self._report_due = 0.0  # time.monotonic() the loop next asks whether to report
        self.handover = Handover(
            keeper, self.counters, handoff, self.plan, self.publisher, self.active, self._handle
        )
        self.handover.signals = self.signals
        self.lister = ShareLister(ctx, self.counters, self.signals)
        self.admission = Admission(
            self.layout, self.window, handoff, self.active, self.retries, self._refetch
        )

    # --- boot ---------------------------------------------------------------------------------

    def run(self) -> None:
        self.lister.stagger()
        self.plan.shares = self.lister.list_shares()
        self.plan.remainder = self.lister.remainder
        self.handover.choose(self.plan.share)
        # Watch before the start-up sweep: a writer that deletes an object while we sweep (its
        # own recovery) must still free the window, or those bytes would be held for ever.
        with (
            Watch(self.layout.cache_claimed, IN_DELETE | IN_MOVED_FROM) as deletions,
            Watch(self.layout.cache_ready, IN_DELETE) as vanished,
        ):
            self.admission.watch(deletions, vanished)
            self._recover()
            # on_caller: completions are settled on this thread (in poll and while a request
            # waits for a slot), so one Python thread does an object's whole work (issue 28).
            self.transfer = make_transfer(
                self.config, self._transfer_done, self.signals, on_caller=True
            )
            self.retries.refresh_credentials = self.transfer.refresh_credentials
            self.ctx.settled()
            try:
                self._loop()
            finally:
                self.transfer.shutdown()
                self._drain_results()
                self._abandon_unfinished()
                self.download_log.close_all()
        self._source_figures()
        self.ctx.report(force=True)

    def _recover(self) -> None:
        """Sweep what a previous run left behind; learn what is already on disk."""
        logged = read_logs(self.download_log)
        roll_forward(self.layout, logged)
        on_disk = self.admission.on_disk()
        self.plan.refetch = sweep_metas(self.layout, logged, on_disk)
        self.admission.reset(on_disk)

    def _before_epoch(self) -> None:
        self.handover.refresh(self.lister.listed)

    def _abandon_unfinished(self) -> None:
        """On stop: remove downloads that were cancelled before they finished."""
        for job in self.active.values():
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1
            job.tmp.unlink(missing_ok=True)
        self.active.clear()

    # --- main loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        # Per turn, what is not due costs one comparison and no call: the checks that are
        # about time (the stop check, the inotify watches, the probe, the report) are each
        # made when their time comes, and the rest reads attributes (issue 28: the loop's
        # Python calls were most of the downloader's CPU per small object).
        jobs = self.plan.jobs()
        retries, admission, window, ctx = self.retries, self.admission, self.window, self.ctx
        transfer, results, counters = self.transfer, self.publisher.results, self.counters
        handover, active, monotonic = self.handover, self.active, time.monotonic
        publisher, plan = self.publisher, self.plan
        current: Job | None = None
        exhausted = False
        stop_due = 0.0  # when should_stop() is next asked (a signal sets ctx.stopping at once)
        while True:
            now = monotonic()
            if now >= stop_due:
                if ctx.should_stop():
                    break
                stop_due = now + STOP_CHECK_EVERY
                if publisher.owed or plan.markers_owed:  # a full disk held them back
                    publisher.settle_owed()
            elif ctx.stopping:
                break
            transfer.poll(0)  # settles on this thread, into results
            if not results.empty():
                self._drain_queue()
            if now >= admission.deletions_due:
                admission.apply_deletions(timeout=0)
            if active and now - self._handled_at >= STALLED:
                self.probe.kick()  # nothing settled for a while: does the store answer?
            if current is None and retries.queue:
                current = retries.next_due(now)
            if current is None and not exhausted:
                current = next(jobs, None)
                exhausted = current is None
            if current is None:
                if (
                    exhausted
                    and not active
                    and not retries.queue
                    and not publisher.owed
                    and not plan.markers_owed
                ):
                    counters["activity"] = Activity.FINISHED
                    self._report()
                    admission.apply_deletions(timeout=0.2)
                    continue
                if now < retries.paused_until and not retries.ends_early(now):
                    # every job waits out the pause in the retry queue (all were in flight
                    # when it began): the pause is what status must say, as below
                    counters["activity"] = Activity.PAUSED
                    counters["activity_detail"] = retries.pause_reason
                self._wait(0.05)
                continue
            if now < retries.paused_until and not retries.ends_early(now):
                counters["activity"] = Activity.PAUSED
                counters["activity_detail"] = retries.pause_reason
                self._wait(0.1)
                continue
            if current.fd < 0 and current.next_part == 0:
                if handover.keeper is not None:
                    served = handover.serve(current)
                    if served is not False:
                        if served is None:
                            self._wait(0.05)
                        current = None if served else retries.prefer_held(current, now)
                        continue
                size, name = current.obj.size, current.name
                if not window.fits(size, name):
                    admission.apply_deletions(timeout=0)  # not yet read: maybe room was freed
                    if not window.fits(size, name):
                        current = retries.prefer_held(current, now)
                        counters["activity"] = Activity.WAITING_FOR_WINDOW
                        self._wait(0.05)
                        continue
                window.reserve(name, size)
                transfer.prepare(current)
                active[name] = current
            counters["activity"] = Activity.DOWNLOADING
            if transfer.submit_parts(current, timeout=0.05):
                current = None
            if now >= self._report_due:
                self._report()

    def _wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a job to settle, and handle what did; if none,
        apply the writers' deletions."""
        if self.transfer.poll(timeout):  # settled on this thread, into results
            handled = self._drain_queue()
        else:
            try:
                job = self.publisher.results.get(timeout=timeout)
            except queue.Empty:
                handled = False
            else:
                self._handle(job)
                handled = True
        if not handled:
            self.admission.apply_deletions(timeout=0)
        self._report()

    def _report(self) -> None:
        if not self.ctx.report_due():
            # Reported since (forced, say): look again soon; the loop asks only once due.
            self._report_due = time.monotonic() + REPORT_LOOK_EVERY
            return  # the figures are only needed when published
        self._report_due = time.monotonic() + REPORT_INTERVAL
        self.counters["window_bytes"] = self.window.used
        self._source_figures()
        self._report_signals()
        if self.handover.keeper is not None:
            self.handover.keeper.save()
        retrying = (job for _, job in self.retries.queue)
        self.counters["window_fetching_bytes"] = sum(
            job.obj.size for job in (*self.active.values(), *retrying)
        )
        self.ctx.report()

    def _source_figures(self) -> None:
        """Each source's figures (several sources only), for the report."""
        if self.config.mixed:
            self.counters["sources"] = self.plan.source_statuses(self.window.held)

    def _report_signals(self) -> None:
        """The adaptive limit, the budgets and the store's health, as status shows them."""
        signals, counters = self.signals, self.counters
        counters["concurrency_limit"] = signals.limit.allowed
        counters["throttled"] = signals.limit.throttled
        counters["budget_wait_s"] = round(signals.pacer.waited_s, 3)
        outage = signals.health.outage()
        counters["store_unreachable_since"] = outage.since if outage else None
        counters["store_errors"] = outage.errors if outage else 0
        counters["store_last_error"] = outage.last if outage else None
        counters["store_outages"] = signals.health.outages

    def _drain_results(self) -> None:
        """Handle every job settled so far (settling first what the transfer settles here)."""
        self.transfer.poll(0)
        self._drain_queue()

    def _drain_queue(self) -> bool:
        """Handle every job in ``results``; whether there was one."""
        results = self.publisher.results
        if results.empty():  # most turns: no exception raised and caught per turn
            return False
        while not results.empty():  # this thread alone takes from it
            self._handle(results.get_nowait())
        return True

    def _handle(self, job: Job) -> None:
        """A job the transfer settled: publish it, or clean up and fetch it again or skip it."""
        self.active.pop(job.name, None)
        self._handled_at = time.monotonic()
        self.counters["retries"] += job.retries
        self.counters["verify_requests"] += job.lookups
        if job.error is None:
            job.error = self.publisher.try_publish(job)
            if job.error is None:
                retries = self.retries
                if retries.consecutive_faults or retries.ended_early:
                    retries.published()  # nothing to reset on most objects: no call
                if job.unverified is not None:
                    self.publisher.note_unverified(job)
                return
        self.publisher.discard(job)
        if self.ctx.stopping:
            return
        self.retries.failed(job)

    def _refetch(self, name: str) -> None:
        """``ready/<name>`` was deleted before any writer claimed it (a writer renames, never
        deletes, there): fetch it again under the same name. Its meta is (re)written first, so
        the supervisor does not call its epoch complete meanwhile."""
        job = self.plan.job_again(name)
        if job is None:
            return
        self.publisher.write_meta(job)
        # its room in the window stays reserved for the new copy (see Publisher.discard)
        log.warning(
            "%s (s3://%s/%s) vanished from ready/ before a writer read it; fetching it again",
            name,
            self.config.sources[job.source].bucket,
            job.obj.key,
        )
        self.counters["objects_refetched"] += 1
        self.retries.retry(job, delay=0.0, count_attempt=False)
