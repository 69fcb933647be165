"""The trainer side frees a claimed shard once its own process has read it, never because
another process (``cat``, a backup, a virus scanner) opened and closed it; and it costs a few
system calls per shard, none per record."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prefetchd.consume.releaser import ShardReleaser
from prefetchd.layout import Layout, claim_name, shard_name


@pytest.fixture
def releaser(tmp_path: Path) -> Iterator[ShardReleaser]:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    yield ShardReleaser(layout)


def claimed(releaser: ShardReleaser, counter: int, size: int = 4096) -> Path:
    """A shard claimed by this process: renamed into ``claimed/`` as a claim is, written under
    another name first. Written in place, its own open and close would be events of the claim;
    a releaser thread slow to read them (a loaded machine) would then see a claim opened and
    closed before any scan, doubtful, and free it at the next wait."""
    name = claim_name(releaser.claimant, shard_name(0, 0, counter))
    path = releaser.directory / name
    part = releaser.directory / f".{name}.part"
    part.write_bytes(b"r" * size)
    part.rename(path)
    releaser.track(name)
    return path


def wait_gone(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not path.exists()


def read_in_process(releaser: ShardReleaser, path: Path, reads: int = 1) -> None:
    """Open, let the releaser see it open, read, close: as a trainer reading a large shard."""
    with open(path, "rb", buffering=0) as f:
        releaser.flush()
        for _ in range(reads):
            f.read(4096 // reads or 1)
            f.seek(0)
    releaser.flush()


def test_a_cat_of_a_claimed_shard_does_not_free_it(releaser: ShardReleaser) -> None:
    path = claimed(releaser, 0)
    for _ in range(3):
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    releaser.flush()
    time.sleep(0.3)  # give the background thread its chance to get it wrong
    releaser.flush()
    assert path.exists(), "freed by another process's open and close"
    read_in_process(releaser, path)
    assert wait_gone(path), "not freed after its claimant read it"


def test_a_shard_the_claimant_still_reads_is_not_freed_by_another_close(
    releaser: ShardReleaser,
) -> None:
    path = claimed(releaser, 1)
    with open(path, "rb") as f:
        releaser.flush()
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        releaser.flush()
        time.sleep(0.2)
        assert path.exists()
        assert f.read() == b"r" * 4096
    releaser.flush()
    assert wait_gone(path)


def read_unseen(releaser: ShardReleaser, path: Path) -> None:
    """Open, read and close within one batch of events: the releaser never sees it open."""
    with releaser._lock:  # the thread cannot look in between
        with open(path, "rb") as f:
            f.read()
        releaser._apply(releaser._watch.read_now())


def test_a_shard_read_before_the_releaser_saw_it_open_is_kept_until_exit(
    releaser: ShardReleaser,
) -> None:
    """Opened and closed within one batch of events: another process's, or a read faster than
    the releaser thread; kept (never taken from a trainer that has yet to open it), then freed
    at exit."""
    path = claimed(releaser, 2)
    read_unseen(releaser, path)
    assert path.exists()
    releaser._at_exit()
    assert not path.exists()


def test_a_doubtful_shard_is_freed_once_its_claimant_reads_a_later_one(
    releaser: ShardReleaser,
) -> None:
    """A fast sequential reader (small shards, pure Python) finishes a shard before the
    releaser looks: its next shard settles it, so RAM never fills with read shards."""
    first, later = claimed(releaser, 3), claimed(releaser, 4)
    read_unseen(releaser, first)
    assert first.exists()
    read_in_process(releaser, later)
    assert wait_gone(first) and wait_gone(later)


def test_a_doubtful_shard_is_freed_when_its_claimant_waits_for_more(
    releaser: ShardReleaser,
) -> None:
    """The last shard a fast reader read, with no later shard to settle it: once the trainer
    asks for more, it is freed (else a small RAM budget would fill and nothing move)."""
    path = claimed(releaser, 7)
    read_unseen(releaser, path)
    assert path.exists()
    releaser.begin_wait(False)
    releaser.end_wait(True)
    assert not path.exists()


def test_a_shard_found_doubtful_after_its_claimant_began_to_wait_is_freed_on_its_next_poll(
    releaser: ShardReleaser,
) -> None:
    """The race the e2e run hit under load: the trainer read its last shard and began to wait
    before this thread saw the shard's events. Kept, it would hold the RAM budget the writers
    need for the next shard, and the trainer would wait for ever."""
    path = claimed(releaser, 8)
    waiting = releaser.begin_wait(False)  # nothing doubtful yet: the events are not seen
    read_unseen(releaser, path)  # ... now they are: opened and closed, doubtful
    assert path.exists()
    releaser.begin_wait(waiting)  # the next poll of the same wait
    releaser.end_wait(True)
    assert not path.exists()


def test_a_doubtful_shard_stays_while_only_earlier_claims_are_read(
    releaser: ShardReleaser,
) -> None:
    earlier, catted = claimed(releaser, 5), claimed(releaser, 6)
    subprocess.run(["cat", str(catted)], stdout=subprocess.DEVNULL, check=True)
    releaser.flush()
    read_in_process(releaser, earlier)
    assert wait_gone(earlier)
    assert catted.exists(), "freed before its claimant opened it"


def counting(calls: dict[str, int], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if str(args[0]).startswith("/proc/self/fd"):
            calls[name] += 1
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("reads", [1, 256])
def test_the_releaser_costs_a_few_scans_per_shard_and_nothing_per_read(
    releaser: ShardReleaser, monkeypatch: pytest.MonkeyPatch, reads: int
) -> None:
    calls = {"listdir": 0, "readlink": 0}
    monkeypatch.setattr(os, "listdir", counting(calls, "listdir", os.listdir))
    monkeypatch.setattr(os, "readlink", counting(calls, "readlink", os.readlink))
    shards = 10
    for i in range(shards):
        path = claimed(releaser, 10 + i)
        read_in_process(releaser, path, reads)
        assert wait_gone(path)
    fds = len(os.listdir("/proc/self/fd")) + 2
    # one scan when it is seen open, one when it is seen closed; the background thread may
    # split a batch in two, never more (and never per read)
    assert calls["listdir"] <= 3 * shards, calls
    assert calls["readlink"] <= calls["listdir"] * fds, calls


def test_a_forked_child_never_waits_on_or_touches_its_parents_releaser(
    releaser: ShardReleaser, tmp_path: Path
) -> None:
    """A DataLoader worker forked while a thread of the trainer held the releaser's lock, and
    there the garbage collector closes a ``records()`` stream the trainer leaked: its finally
    calls the inherited releaser. It must return at once (it waited for ever on a lock whose
    holder does not exist in the child), and leave the parent's claims and events alone."""
    path = claimed(releaser, 0)
    with releaser._lock:  # as the releaser's thread holds it while it applies events
        pid = os.fork()
        if pid == 0:  # the child: every call returns, nothing of the parent's is touched
            ok = False
            try:
                releaser.flush()
                releaser.finished(path.name)
                releaser.wants_more()
                releaser.end_wait(releaser.begin_wait(False), claimed=1)
                releaser.track("another")
                ok = path.exists() and releaser.pending() == 0
                layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
                ok = ok and ShardReleaser.for_layout(layout) is not releaser
            finally:
                os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for ever on its parent's releaser")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the child touched its parent's releaser"
    assert path.exists() and releaser.pending() == 1, "the parent's claim is still its own"
