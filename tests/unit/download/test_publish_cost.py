"""Issue #12 bar 2 (small objects cost too much daemon CPU per object): what the downloader's
publish path and a writer's claim of an object cost, counted in syscalls, with no timing.

On 64-200 KiB objects the daemon's CPU per object is mostly fixed work per object, and most of
that is syscalls and the Python around them. These tests pin the count per object, so a later
change cannot add per-object work without someone deciding it is worth it (raise the budget
here, with the reason, if it is).
"""

from __future__ import annotations

import builtins
import collections
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prefetchd import spares as spares_module
from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.download.downloader import Downloader
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from prefetchd.download.plan import EpochProgress
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.write import arrivals as arrivals_module
from prefetchd.write.writer import Writer
from tests.unit.configs import unit_config

OBJECTS = 20
SIZE = 64 * 1024

# Every os call that reaches the kernel on these paths (os.fdopen and pathlib's helpers end in
# these too: os.fdopen in fstat, Path.read_text in open + fstat + read).
COUNTED = (
    "open",
    "read",
    "write",
    "close",
    "rename",
    "replace",
    "unlink",
    "stat",
    "lstat",
    "fstat",
    "listdir",
    "scandir",
    "fsync",
    "link",
    "fdopen",  # a buffered file object on an fd: fstat, lseek and a wrapper more per call
)

# Per published object: its meta (open, write, close: written in place, no temp name to
# rename), its download-log line (one write on the log kept open), and the rename into ready/.
PUBLISH_BUDGET = {"open": 1, "write": 2, "close": 1, "rename": 1}
# Per claimed object (raw format): the rename out of ready/, its meta read (open, read, close),
# the object opened, its size taken (fstat: checked against output.max_record_size and the
# frame's size), read straight into its frame (one pread, inside the C kernel or twin: not
# counted here) and closed; ready/ is listed twice for them all (to find them, and to find it
# empty).
CLAIM_BUDGET = {"rename": 1, "open": 2, "read": 1, "close": 2, "fstat": 1}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return unit_config(tmp_path, source={"format": "raw"}, output={"writers": 1, "mix": 1})


@pytest.fixture
def layout(config: Config) -> Layout:
    layout = Layout.of(config)
    layout.create()
    return layout


class Syscalls:
    """Counts the calls of each ``COUNTED`` os function while ``counting()`` is active, made by
    the thread that started counting: the paths measured here run on it, and a thread another
    test left behind in this process (a trainer's releaser freeing one last shard, say) must
    not be billed to them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self._monkeypatch = monkeypatch
        self._thread = threading.get_ident()

    def counting(self) -> Syscalls:
        for name in COUNTED:
            self._monkeypatch.setattr(os, name, self._counted(name, getattr(os, name)))
        # A file object's open is an openat too (its fstat, reads and close are not counted).
        self._monkeypatch.setattr(builtins, "open", self._counted("open", builtins.open))
        return self

    def __enter__(self) -> Syscalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self._monkeypatch.undo()

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._thread:
                self.calls[name] += 1
            return fn(*args, **kwargs)

        return call

    def per(self, count: int) -> dict[str, float]:
        return {name: n / count for name, n in sorted(self.calls.items())}


def fetched_jobs(config: Config, layout: Layout, downloader: Downloader) -> Iterator[Job]:
    """``OBJECTS`` jobs of epoch 0 as a transfer leaves them: bytes in ``.tmp/``, verified."""
    downloader.epochs[0] = EpochProgress(OBJECTS, bytearray(OBJECTS), scheduled=True)
    for seq in range(OBJECTS):
        obj = SourceObject(f"prefix/sample-{seq:04d}.bin", SIZE, "0" * 32)
        name = object_name(0, seq, key_hash(config.source.bucket, obj.key))
        job = Job(0, seq, obj, name, layout.download_part(name))
        job.tmp.write_bytes(bytes([seq]) * SIZE)
        downloader.window.reserve(name, SIZE)
        downloader.active[name] = job
        yield job


def test_publishing_a_small_object_costs_five_syscalls(
    config: Config, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    # .tmp is looked at for spares once here (none: the metas are created); again only after
    # RELIST_AFTER, which is about time, not this count.
    monkeypatch.setattr(spares_module, "RELIST_AFTER", 3600.0)
    downloader = Downloader(ChildContext("downloader", config))
    jobs = list(fetched_jobs(config, layout, downloader))
    with Syscalls(monkeypatch).counting() as syscalls:
        for job in jobs:  # as the transfer threads hand each one over, then the main loop
            downloader._transfer_done(job)
        downloader._drain_queue()
    # The user-visible outcome first: every object published once, logged, with its meta,
    # and the epoch marked downloaded (its log closed: one open + close per epoch).
    assert sorted(os.listdir(layout.cache_ready)) == sorted(job.name for job in jobs)
    assert os.listdir(layout.cache_tmp) == []
    assert downloader.counters["objects_downloaded"] == OBJECTS
    assert json.loads((layout.cache_meta / f"{jobs[0].name}.json").read_text())["size"] == SIZE
    assert layout.downloaded_marker(0).exists()
    per_object = syscalls.per(OBJECTS)
    # Once per epoch: its log opened, its size looked at (a log a crash cut short is ended
    # before the first line) and closed, epochs/0.downloaded checked and written; once per
    # run here: .tmp listed for spares.
    epoch_end = {
        "open": 2,
        "fstat": 1,
        "write": 1,
        "close": 2,
        "rename": 1,
        "stat": 1,
        "listdir": 1,
    }
    for name, count in per_object.items():
        budget = PUBLISH_BUDGET.get(name, 0) + epoch_end.get(name, 0) / OBJECTS
        assert count <= budget, f"os.{name}: {count:.2f} per published object > {budget:.2f}"


def writer_over_published(config: Config, layout: Layout) -> tuple[Downloader, Writer]:
    """A downloader that published every object of ``fetched_jobs``, and writer 0."""
    downloader = Downloader(ChildContext("downloader", config))
    for job in fetched_jobs(config, layout, downloader):
        downloader._transfer_done(job)
    downloader._drain_queue()
    return downloader, Writer(ChildContext("writer-0", config), 0)


def test_claiming_a_small_object_costs_a_bounded_number_of_syscalls(
    config: Config, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, writer = writer_over_published(config, layout)
    with Syscalls(monkeypatch).counting() as syscalls:
        opened = 0
        while (name := writer._claim_next()) is not None:
            writer._open(name, resume_at=0)
            opened += 1
    assert opened == OBJECTS  # each object claimed once, none skipped
    assert len(os.listdir(layout.cache_claimed)) == OBJECTS
    per_object = syscalls.per(OBJECTS)
    for name, count in per_object.items():
        budget = CLAIM_BUDGET.get(name, 0) + (2 / OBJECTS if name == "listdir" else 0)
        assert count <= budget, f"os.{name}: {count:.2f} per claimed object > {budget:.2f}"


def test_a_writer_waiting_on_an_empty_ready_dir_lists_it_only_when_something_arrives(
    config: Config, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The regression: a writer keeping up with the downloader finds its listing empty on
    # nearly every loop, and listed ready/ again each time (3 listings per object).
    writer = Writer(ChildContext("writer-0", config), 0)
    with Watch(layout.cache_ready, IN_MOVED_TO) as arrivals:
        writer.arrivals.watch = arrivals
        with Syscalls(monkeypatch).counting() as syscalls:
            for _ in range(100):
                assert writer._claim_next() is None
            assert syscalls.calls["listdir"] <= 1
            downloader = Downloader(ChildContext("downloader", config))
            for job in fetched_jobs(config, layout, downloader):
                downloader._transfer_done(job)
                break  # one object published
            downloader._drain_queue()
            name = writer._claim_next()  # the arrival is seen at once, not after a timeout
    assert name is not None
    assert os.listdir(layout.cache_claimed) == [Path(writer.arrivals.claimed(name)).name]


def test_a_writer_claims_each_arrival_by_the_name_inotify_gave_without_listing_ready(
    config: Config, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The regression: every arrival made both writers list ready/ again (open, fstat, two
    # getdents, close: 5 syscalls per object per writer) to find the one name inotify had
    # already reported. The age limit of a listing (a missed event) is lifted here so that
    # the count does not depend on how fast this runs.
    monkeypatch.setattr(arrivals_module, "LISTING_MAX_AGE", 3600.0)
    writer = Writer(ChildContext("writer-0", config), 0)
    downloader = Downloader(ChildContext("downloader", config))
    downloader.publisher.spares.works = False  # its listings of .tmp are not the writer's
    with Watch(layout.cache_ready, IN_MOVED_TO) as arrivals:
        writer.arrivals.watch = arrivals
        assert writer._claim_next() is None  # the first look lists ready/ (empty)
        claimed = []
        with Syscalls(monkeypatch).counting() as syscalls:
            for job in fetched_jobs(config, layout, downloader):
                downloader._transfer_done(job)
                downloader._drain_queue()  # one object published...
                writer.arrivals.wait(timeout=5)
                name = writer._claim_next()  # ...and claimed by the name inotify gave
                assert name == job.name
                claimed.append(name)
            assert syscalls.calls["listdir"] == 0
            assert writer._claim_next() is None  # nothing left, and still no listing
            assert syscalls.calls["listdir"] == 0
    assert sorted(os.listdir(layout.cache_claimed)) == sorted(
        Path(writer.arrivals.claimed(name)).name for name in claimed
    )


# Per finished object, a writer's delete: its meta and its bytes each emptied (open with
# O_TRUNC, close) and renamed into the spare pool (prefetchd/spares.py), not unlinked: ext4
# frees no inode, and the downloader's next meta and .part are made from them.
DELETE_BUDGET = {"open": 2, "close": 2, "rename": 2}


def test_in_steady_state_an_object_makes_no_new_inode_for_its_meta(
    config: Config, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28: on ext4 without a journal, making an inode checked every recently freed one
    # of its group first; two made and two freed per small object were 37 % of the
    # downloader's CPU (perf, docs/benchmarks.md).
    downloader, writer = writer_over_published(config, layout)
    names = []
    while (name := writer._claim_next()) is not None:
        names.append(name)
    with Syscalls(monkeypatch).counting() as syscalls:
        for name in names:  # each object finished: its records are in a committed shard
            writer.reader.delete(name)
    assert os.listdir(layout.cache_claimed) == []
    assert os.listdir(layout.cache_meta) == []
    per_object = syscalls.per(OBJECTS)
    for name, count in per_object.items():
        budget = DELETE_BUDGET.get(name, 0)
        assert count <= budget, f"os.{name}: {count:.2f} per deleted object > {budget:.2f}"

    # The next objects' metas take those inodes: no file is created per object.
    created = 0
    real_open = os.open

    def counting_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        nonlocal created
        created += bool(flags & os.O_CREAT) and "/meta/" in str(path)
        return real_open(path, flags, *args, **kwargs)

    jobs = list(fetched_jobs(config, layout, downloader))
    monkeypatch.setattr(spares_module, "RELIST_AFTER", 0.0)  # Syscalls undid it
    monkeypatch.setattr(os, "open", counting_open)
    for job in jobs:
        downloader._transfer_done(job)
    downloader._drain_queue()
    monkeypatch.undo()
    assert created == 0
    assert sorted(os.listdir(layout.cache_ready)) == sorted(job.name for job in jobs)
    meta = json.loads((layout.cache_meta / f"{jobs[0].name}.json").read_text())
    assert meta["key"] == jobs[0].obj.key and meta["size"] == SIZE
