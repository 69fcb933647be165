"""A run's start-up, before any child starts: take the directories, decide the job, sweep or
recover what an earlier run left, then raise the job fence.

Order matters and is kept here in one place: the old fence goes first (no trainer claims again
until we know whose shards ``ram_dir`` holds, ``fence.py``), the job is decided and the old
one's files wiped or checked (``recovery.py``), and only then is the new fence written, before
any child publishes a shard.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from prefetchd.config import Config
from prefetchd.exactly_once.host_positions import HostPositions, read_host_positions
from prefetchd.exactly_once.markers import first_epoch_without, mark_complete, mark_downloaded
from prefetchd.exactly_once.recovery import recover, write_disks
from prefetchd.fence import remove_fence, write_fence
from prefetchd.layout import Layout, is_own_file
from prefetchd.owner import Ownership, claim_dirs
from prefetchd.supervise.job import JobStart, decide, save_job

# the supervisor's lines keep their logger name (it is in every line): operators filter on it
log = logging.getLogger("prefetchd.supervise.supervisor")


@dataclass(frozen=True)
class JobIdentity:
    """The job this daemon runs, and what it said about it (the status record shows all three)."""

    job_id: str | None = None
    note: str | None = None  # the daemon's first log line: resumed or new, and why
    resumed: str | None = None  # sharding.resume_from: which job, which epoch


@dataclass(frozen=True)
class Started:
    """What start-up leaves the supervisor: its directories, its job, and the fence it holds
    (``None`` with ``failure``: recovery found something lost, and nothing may start)."""

    ownership: Ownership
    job: JobIdentity
    fence: int | None
    failure: str | None = None


class Startup:
    """Owns everything a run does once, before its children: the claim of the three
    directories, the job decision (resume, new, or a new one resuming other hosts' job),
    the sweep of an old job's files or the recovery check of a resumed one, and the fence."""

    def __init__(self, config: Config, layout: Layout) -> None:
        self.config = config
        self.layout = layout

    def start(self) -> Started:
        ownership = claim_dirs(self.layout, self.config)
        # First: no trainer claims again until we know whose shards ram_dir holds (fence.py)
        remove_fence(self.layout.job_fence)
        self.layout.create()
        start, job = self._prepare_state()
        if start.resume:
            reason = recover(self.layout, ownership)
            if reason is not None:
                return Started(ownership, job, None, reason)  # nothing starts; status says why
        write_disks(self.layout, ownership)
        # what stays is decided: trainers may claim (before any child publishes a shard)
        fence = write_fence(self.layout.job_fence, job.job_id or "", job.note or "")
        return Started(ownership, job, fence)

    def _prepare_state(self) -> tuple[JobStart, JobIdentity]:
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
        resumed = None
        if rehost is not None:
            resumed = (
                f"resumed epoch {rehost.epoch} of a job of {rehost.num_workers} hosts "
                f"(positions in {self.config.sharding.resume_from})"
            )
        removed, foreign = (0, []) if start.resume else self._wipe()
        if rehost is not None and not start.resume:
            self._resume_hosts(rehost)
        for stale in self.layout.children.iterdir():
            stale.unlink()
        save_job(self.layout, start)
        note = start.note(
            epoch=first_epoch_without(self.layout.complete_marker),
            count=self.config.epochs.count,
            removed=removed,
        )
        log.info("%s", note)
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
        return start, JobIdentity(start.job, note, resumed)

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
