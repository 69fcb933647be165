"""A writer process: claim downloaded objects, draw their records at random, write shards.

Writer ``i`` claims raw objects by renaming ``cache/ready/<obj>`` to ``cache/claimed/w<i>-<obj>``
(``arrivals.py``: its turn by seq first, another writer's after it waited), keeps up to
``output.mix`` of them open (``objects.py``), and writes each next record from a randomly chosen
open object (seeded per epoch and writer, ``mixing.py``) into the current shard. A shard holds
records of one epoch only and is published when it reaches ``output.shard_size``, or earlier
by the flush clock (``flush.py``): when its epoch has nothing left to give, when input dried
up, or when the trainers have nothing to read. Epochs are taken in the order trainers read
them (``epoch_order.py``). The commit that publishes a shard, and the roll-forward after a
crash that makes every record of an epoch published exactly once, are ``publish.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging

from prefetchd.budget import Interrupted, RamBudget, ram_chunk
from prefetchd.child.context import ChildContext
from prefetchd.config import REPLAYABLE
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.kernel import choice
from prefetchd.messages.activity import Activity
from prefetchd.messages.counters import WriterCounters
from prefetchd.write.arrivals import Arrivals
from prefetchd.write.choices import Choices
from prefetchd.write.epoch_order import EpochOrder
from prefetchd.write.flush import FlushClock
from prefetchd.write.formats import (
    get_format,
)
from prefetchd.write.formats.plugin import PluginFormat, PluginHeartbeat
from prefetchd.write.mixing import STEP_BYTES, Mixer
from prefetchd.write.objects import MIX_MEMORY, ObjectReader, batch_bytes
from prefetchd.write.publish import Publisher
from prefetchd.write.replay import ReplayOrder

log = logging.getLogger(__name__)

MALLOC_KEEP = 32 * 1024 * 1024  # freed memory a writer keeps for reuse (_reuse_freed_memory)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _reuse_freed_memory() -> None:
    """Have glibc keep freed batch buffers for reuse instead of unmapping them.

    A writer allocates and frees buffers of 0.1-4 MiB all the time. By default glibc maps
    each such buffer afresh or trims the heap after freeing one, and the page faults of touching
    fresh memory then cost more than the copies themselves (a 200 KiB copy into fresh memory
    ran at 1.5 GB/s instead of 17). Fixed thresholds keep up to ``MALLOC_KEEP`` freed bytes:
    a bounded, stated cost in RSS. A no-op where mallopt is missing (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_TRIM_THRESHOLD, MALLOC_KEEP)
    mallopt(_M_MMAP_THRESHOLD, MALLOC_KEEP)


def _counters() -> WriterCounters:
    return WriterCounters(
        records_written=0,
        shards_written=0,
        bytes_written=0,
        objects_consumed=0,
        errors=0,
        epoch=None,
        ram_wait_s=0.0,
        objects_open=0,
        activity=Activity.STARTING,
        objects_quarantined=0,
        bytes_quarantined=0,
        quarantined_corrupt=0,
        quarantined_too_large=0,
        quarantined_timeout=0,
        quarantined_plugin_error=0,
    )


class Writer:
    """Writer ``index``'s main loop, composed of the parts that own its state: ``arrivals``
    (which objects it takes out of ready/), ``reader`` (its claimed objects, read batch by
    batch), ``mixer`` (the open objects and the records drawn across them), ``clock`` (when a
    shard is cut early, when to draw before the mix is full), ``epochs`` (epochs in the
    trainers' order) and ``publisher`` (the shard and its commit)."""

    def __init__(self, ctx: ChildContext, index: int) -> None:
        self.ctx = ctx
        self.index = index
        self.config = config = ctx.config
        self.layout = layout = ctx.layout
        out = config.output
        self.counters = ctx.counters = _counters()
        # one per source (sources:), each object parsed by its source's (its meta says which)
        self.formats = [
            get_format(
                src.format,
                max_record_size=out.max_record_size,
                parse_timeout=src.parse_timeout,
                batch_bytes=batch_bytes(out.mix),
            )
            for src in config.sources
        ]
        self.budget = RamBudget(
            layout, out.ram_budget, ram_chunk(out.shard_size), self._waiting_for_ram, self._headroom
        )
        self.arrivals = Arrivals(layout, index, out.writers)
        self.epochs = EpochOrder(layout, self.arrivals, out.writers)
        self.reader = ObjectReader(
            ctx, self.counters, self.formats, layout, index, self.arrivals.claimed, self._report
        )
        self.mixer = Mixer(self.reader, self.counters, Choices(config.epochs.seed, index))
        self.replay: ReplayOrder | None = None  # epochs.order: replayable (set in _recover)
        self.clock = FlushClock(layout, out.mix)
        self.publisher = Publisher(
            layout,
            index,
            self.budget,
            self.mixer,
            self.reader,
            self.clock,
            self.counters,
            gzip=out.compression == "gzip",
            shard_size=out.shard_size,
        )

    # --- boot and recovery --------------------------------------------------------------------

    def run(self) -> None:
        log.info("writer %d: record framing and mixing in %s", self.index, choice.ACTIVE)
        _reuse_freed_memory()
        self._recover()
        self.ctx.settled()
        with Watch(self.layout.cache_ready, IN_MOVED_TO) as watch, self._plugin_heartbeat():
            self.arrivals.watch = watch
            with contextlib.suppress(Interrupted):
                self._loop()
            self._stop()

    def _plugin_heartbeat(self) -> contextlib.AbstractContextManager[object]:
        """With a plugin format, a thread that reports while the plugin's code runs (a slow
        object within ``source.parse_timeout`` must not look like a hung writer)."""
        stack = contextlib.ExitStack()
        for fmt in self.formats:
            if isinstance(fmt, PluginFormat):
                stack.enter_context(PluginHeartbeat(fmt, lambda: self.ctx.report(force=True), 1.0))
        return stack

    def _recover(self) -> None:
        """Roll the last commit forward (``Publisher.recover``), then reopen every object this
        writer had claimed, each after its journalled position."""
        fresh = self.publisher.journal.last() is None
        positions = self.publisher.recover()
        claimed = self.arrivals.claimed_names()
        if self.config.epochs.order == REPLAYABLE:
            self.replay = ReplayOrder(self.layout, self.arrivals, fresh=fresh)
            self.publisher.order_state = self._order_state
            last = self.publisher.journal.last()
            if last is None:  # nothing committed: what it had claimed comes first, in order
                self.replay.resume({}, claimed)
                return
            if last.replay is not None:
                self._resume_order(last.replay, positions, claimed)
                return
        for name in claimed:
            self._open(name, resume_at=positions.get(name, 0))
        if claimed:
            log.info("resuming %d claimed objects after a restart", len(claimed))

    def _order_state(self) -> dict[str, object]:
        """The replayable order's state a commit records (``replay.py``)."""
        assert self.replay is not None
        return {**self.replay.state(), "mixer": self.mixer.order_state()}

    def _resume_order(
        self, saved: dict[str, object], positions: dict[str, int], claimed: list[str]
    ) -> None:
        """After a restart in the replayable order: the commit's open objects in the order they
        were opened, at their positions, the choices as they were, and the objects claimed
        since kept for their turn."""
        assert self.replay is not None
        on_disk = set(claimed)
        for name in positions:  # the journal keeps the order they were opened in
            if name in on_disk:
                self._open(name, resume_at=positions[name])
        self.replay.resume(saved, [n for n in claimed if n not in positions])
        mixer = saved.get("mixer")
        if isinstance(mixer, dict):
            self.mixer.restore_order(mixer)
        log.info("resuming the replayable order after a restart (%d objects open)", len(positions))

    # --- main loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.ctx.should_stop():
            self._refill()
            if not self.mixer.open:
                self._idle()
                continue
            if self._filling():
                self.counters["activity"] = Activity.WAITING_TO_MIX
                self._report()
                want = self.config.output.mix - len(self.mixer.open)
                self.arrivals.wait(0.05, gather=self.clock.gather(), want=want)
                continue
            self._step()
            shard = self.publisher.shard
            if shard is not None and (
                shard.size >= self.publisher.shard_size
                or (self.replay is None and self.clock.trainers_starved())
            ):
                self.publisher.publish()
            self._report()

    def _step(self) -> None:
        """Write the next records, drawn at random across the open objects, into the shard
        (at most ``STEP_BYTES``, and never past ``shard_size``, up to the first pick of an
        object whose batch ran out); then refill the objects whose batch ran out."""
        self.mixer.resume_waiting()
        if not self.mixer.open:
            return  # the waiting objects were drained
        mixable = self.mixer.mixable()
        epoch = mixable[0].epoch
        room = self.publisher.room(epoch)
        limit = min(STEP_BYTES, room)
        if self.mixer.large_ahead(mixable, room):
            # one record at a time; one that does not fit in the rest of the shard starts a
            # shard of its own (config.record_size_limit counts on it)
            limit = 1
            if self.mixer.next_frame(mixable) > room and self.publisher.holds_records(epoch):
                self.publisher.publish()
                # The next step starts afresh with the new shard's room, as a writer restarted
                # from this commit does: a draw of one record here instead drained an object
                # used up by it earlier than that writer would, and the choices drawn ahead
                # were thrown away at another point (the replayable order left the
                # uninterrupted one after a SIGKILL, write/replay.py).
                return
        drawn = self.mixer.draw(mixable, limit)
        if drawn.records:
            # `taken` counts only written records: shard_for may journal it (publishing a
            # shard of another epoch), and the write may be interrupted waiting for RAM
            self.publisher.shard_for(epoch).write_frames(drawn.parts, drawn.records)
            choices = self.mixer.choices
            assert choices.picks_from is not None  # draw() drew them
            self.publisher.composition.step(
                mixable,
                choices.picks_from,
                drawn.stop - drawn.records,
                drawn.stop,
                choices.draw_from,
            )
        self.mixer.advance(mixable, drawn)

    def _filling(self) -> bool:
        """Whether to wait for more objects before drawing (``FlushClock.filling``); not once
        the open objects hold ``MIX_MEMORY``: no other would be opened."""
        mixer = self.mixer
        if len(mixer.open) < self.config.output.mix and mixer.held_bytes() >= MIX_MEMORY:
            return False
        if self.replay is not None:
            return self._replay_filling()
        return self.clock.filling(len(mixer.open), mixer.open[0].epoch, mixer.holding_large)

    def _refill(self) -> None:
        """Open objects up to ``output.mix`` while they hold less than ``MIX_MEMORY``, but none
        while one is holding a large batch."""
        mix, mixer = self.config.output.mix, self.mixer
        # ``held_bytes()`` read as the attribute it returns: this condition is checked once
        # per object claimed (``holding_large`` stays a call: tests turn the bound off by it)
        while (
            len(mixer.open) < mix
            and not mixer.holding_large()
            and (not mixer.open or mixer.held_total < MIX_MEMORY)
        ):
            name = self._claim_next()
            if name is None:
                return
            if self.replay is not None and self.reader.tombstone(name):
                self.reader.delete(name)  # a skipped object's turn (replay.py)
                continue
            self._open(name, resume_at=0)
            self.clock.input_arrived()

    def _idle(self) -> None:
        """Nothing open: publish a partial shard if its epoch is over, input dried up, or the
        trainers wait for it (``FlushClock.trainers_starved``)."""
        shard = self.publisher.shard
        if shard is not None and shard.records:
            epoch_over = self.epochs.exhausted(self.publisher.shard_epoch)
            if epoch_over or (self.replay is None and self._early()):
                self.publisher.publish()
        elif self.mixer.finished:
            self.publisher.publish()
        self.counters["activity"] = Activity.WAITING_FOR_DOWNLOADS
        self._report()
        self.arrivals.wait(0.1)

    def _early(self) -> bool:
        """Whether to publish a partial shard now: input dried up, or trainers starve."""
        return self.clock.dried_up() or self.clock.trainers_starved()

    def _claim_next(self) -> str | None:
        """Claim the next object this writer may take now (``Arrivals.claim_next``; in the
        replayable order, ``ReplayOrder.claim_next``)."""
        open_ = self.mixer.open
        current = open_[0].epoch if open_ else self.publisher.shard_epoch
        if self.replay is not None:
            return self.replay.claim_next(current, self._switch)
        return self.arrivals.claim_next(current, self._switch)

    def _replay_filling(self) -> bool:
        """In the replayable order, whether to wait for the next object before drawing: until
        ``output.mix`` are open, their files take half of ``download.window`` (the window
        keeps room for the next), or nothing more of the epoch can come (``replay.py``)."""
        assert self.replay is not None
        mixer = self.mixer
        if len(mixer.open) >= self.config.output.mix or mixer.holding_large():
            return False
        on_disk = sum(int(str(o.meta.get("size", 0) or 0)) for o in mixer.open)
        if 2 * on_disk >= self.config.download.window:
            return False
        return not self.replay.epoch_over(mixer.open[0].epoch)

    def _switch(self, epoch: int) -> bool:
        """Whether to move on to an object of ``epoch``, not the one being written: only once
        this writer has nothing open and nothing left to publish, and the epochs' order allows
        it (``EpochOrder.may_switch``); the last shard is published first."""
        publisher = self.publisher
        if self.mixer.open or self.mixer.finished:
            return False  # finish this epoch's shard before starting another
        if not self.epochs.may_switch(epoch, publisher.shard_epoch):
            return False
        publisher.publish()
        publisher.shard_epoch = None
        return True

    def _open(self, name: str, *, resume_at: int) -> None:
        self.mixer.add(self.reader.open(name, resume_at=resume_at))

    # --- what the RAM budget and status ask -----------------------------------------------------

    def _headroom(self) -> int:
        """Room a shard of a later epoch leaves for the oldest incomplete one."""
        return self.epochs.headroom(self.publisher.shard_epoch, self.budget)

    def _waiting_for_ram(self) -> bool:
        """Called while blocked on the RAM budget: stay visibly alive; say whether to stop."""
        self.counters["activity"] = Activity.WAITING_FOR_RAM
        self.counters["objects_open"] = len(self.mixer.open)
        self.counters["ram_wait_s"] = round(self.budget.waited, 3)
        self.ctx.report()
        return self.ctx.should_stop()

    def _report(self) -> None:
        self.counters["ram_wait_s"] = round(self.budget.waited, 3)
        self.counters["objects_open"] = len(self.mixer.open)
        if self.mixer.open:
            self.counters["activity"] = Activity.WRITING
        self.ctx.report()

    def _stop(self) -> None:
        """Drain: publish what is written so far so no record is stranded in a temp file, and
        delete the spare files in the cache's ``.tmp`` (a stopped daemon leaves nothing
        there)."""
        self.publisher.stop()
        self.reader.spares.clear()
        self.counters["activity"] = Activity.STOPPED
        self.ctx.report(force=True)
