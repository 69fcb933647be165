"""``download.keep`` in the downloader's loop: an object whose verified copy is kept
(``keeper.py``) is published without a GET. The kept file is hard-linked at ``.tmp/<obj>.part``
and published as a download is (``publish.py``), held to the hand-over account
(``admission.py``) instead of the window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from prefetchd.budget import Window
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.plan import EpochPlan
from prefetchd.download.publish import Publisher
from prefetchd.download.share import ShareTable
from prefetchd.download.signals import Signals
from prefetchd.download.store import list_share, make_client
from prefetchd.exactly_once.download_log import PUBLISHED
from prefetchd.layout import object_digest
from prefetchd.messages.activity import Activity
from prefetchd.messages.counters import DownloaderCounters

log = logging.getLogger(__name__)


class Handover:
    """Owns the kept copies' part of downloading: choosing what to keep at start-up (``plan``),
    listing again before a later epoch so that a copy stands in only for an unchanged object
    (``refresh``), and publishing an object from its kept copy (``serve``)."""

    def __init__(
        self,
        keeper: Keeper,
        counters: DownloaderCounters,
        handoff: Window,
        plan: EpochPlan,
        publisher: Publisher,
        active: dict[str, Job],
        handle: Callable[[Job], None],
    ) -> None:
        self.planner = keeper  # plans even with download.keep 0: drops what was kept
        self.keeper = keeper if keeper.store.capacity else None
        self.counters = counters
        self.handoff = handoff
        self.plan = plan
        self.publisher = publisher
        self.active = active
        self.handle = handle  # the loop's handling of a settled job
        self.signals: Signals | None = None  # the downloader's: the listing keeps the budgets

    def choose(self, share: ShareTable) -> None:
        """Choose what to keep (over every source's share: ``share`` is the first's); with
        ``download.keep: 0``, drop what an earlier run kept."""
        shares = self.plan.shares if self.plan.shares[0] is share else [share]
        buckets = [src.bucket for src in self.plan.config.sources][: len(shares)]
        self.planner.plan(*shares, buckets=buckets)

    def refresh(self, listed: Callable[[int], None]) -> None:
        """List again before an epoch that may serve kept copies: a copy stands in only for an
        object unchanged since (invariant 10). If the listing fails, serve none this epoch."""
        keeper = self.keeper
        if keeper is None or not keeper.store.entries:
            return
        config = self.publisher.config
        client = make_client(config, pool=8, signals=self.signals)
        # Nothing is scheduled until the listing ends: status says so meanwhile, then shows
        # what the loop was doing (serving kept copies sets no activity of its own).
        previous, self.counters["activity"] = self.counters["activity"], Activity.LISTING
        try:
            listings = [  # every source's, before any copy is trusted again
                ShareTable.of(list_share(client, config, listed=listed, source=src))
                for src in config.sources[: len(self.plan.shares)]
            ]
        except Exception as exc:  # the store's error, whatever its type: downloads still work
            log.warning(
                "download.keep: listing again failed (%s); no kept copy is used this epoch", exc
            )
            keeper.trusted = False
            return
        finally:
            self.counters["activity"] = previous
        for source, listing in enumerate(listings):
            keeper.refresh(self.plan.shares[source], listing, source)

    def serve(self, job: Job) -> bool | None:
        """Publish ``job`` from its kept copy: True if done, False if it must be downloaded,
        None if it must wait (the hand-over account is full, or the previous epoch is still
        downloading it to keep it): the loop waits, as for the window."""
        keeper, source = self.keeper, job.source
        name = keeper.usable(job.obj, source) if keeper is not None else None
        if keeper is None or name is None:
            if keeper is not None and keeper.wants(job.obj, source) and self._fetching(job):
                # The previous epoch is still downloading it, to keep it: wait for that copy
                # instead of fetching the same bytes twice.
                return None
            return False
        if not self.handoff.fits(job.obj.size):
            self.counters["activity"] = Activity.WAITING_FOR_WINDOW
            return None
        if not keeper.hand_over(name, job.obj, job.tmp, source):
            return False
        self.handoff.reserve(job.name, job.obj.size)
        try:
            self.publisher.write_meta(job)
            self.publisher.download_log.append(job.epoch, job.name, PUBLISHED)
        except OSError as exc:  # ENOSPC: like a download that cannot be published
            job.error = exc
            self.handoff.release(job.name)
            self.handle(job)
            return True
        os.rename(job.tmp, self.publisher.layout.cache_ready / job.name)
        keeper.hit(job.epoch, job.obj)
        self.plan.mark_done(job)
        return True

    def _fetching(self, job: Job) -> bool:
        """Whether the same object is being downloaded for an earlier read (of one source: an
        earlier epoch, local names ending in the hash of bucket and key; of several: also an
        earlier period of this epoch, ``repeat``, the names hashing the period too, so bucket
        and key are compared). Only requests in flight count: one waiting for a retry is
        resubmitted by the loop, which must not wait for it."""
        if self.plan.config.mixed:
            key, bucket = job.obj.key, job.bucket
            return any(
                other.obj.key == key and other.bucket == bucket and other is not job
                for other in self.active.values()
            )
        if job.epoch == self.plan.first_epoch:
            return False  # no earlier epoch in this run: skip the scan of every request
        digest = object_digest(job.name)
        return any(name.endswith(digest) for name in self.active)
