"""Issue 28 (the daemon's CPU per small object): the Python calls the downloader's main loop
makes per object, counted, with no timing.

On 96-160 KiB objects the downloader's CPU is mostly fixed work per object, and on its main
thread most of that is Python calls: the loop's turn, the plan's job, the window, the meta,
the download-log line and the publish. The real ``Downloader._loop`` is driven here over a few
hundred objects with a transfer that fetches at once, under ``sys.setprofile``; the calls of
the fake transfer (this file's and its base in ``loop_harness.py``) are not counted (a real
transfer's are pinned by ``tests/functional/test_native_small_object_cost.py``). Raise the
budget only with a reason.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path
from types import FrameType

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.download.downloader import Downloader
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from prefetchd.download.publish import render_meta
from prefetchd.download.share import ShareTable
from prefetchd.inotify import IN_DELETE, IN_MOVED_FROM, Watch
from prefetchd.layout import Layout
from tests.unit.configs import unit_config
from tests.unit.download import loop_harness

OBJECTS = 300
# Measured 38 (2026-12-05; 70 before the loop's per-turn checks were made due-times, the
# one-source plan's job built inline, the meta rendered without json's encoder and the publish
# steps folded). Of those, ~10 are pathlib's join of each job's ``.part`` path and ~2 are once
# per epoch or run (the order's shuffle, the listing's identity), spread over the objects.
CALLS_PER_OBJECT = 42


class InstantTransfer(loop_harness.NoStoreTransfer):
    """Fetches each object at once, in the caller's thread (an empty ``.part``)."""

    def submit_parts(self, job: Job, timeout: float) -> bool:
        os.close(os.open(job.tmp, os.O_CREAT | os.O_WRONLY, 0o600))
        self.done(job)
        return True


FAKES = {__file__, loop_harness.__file__}  # whose calls are the test's, not the loop's


class UntilPublished(ChildContext):
    """Stops the loop (as a stop signal would: its flag) once ``objects`` are published."""

    downloader: Downloader

    def __init__(self, config: Config, objects: int) -> None:
        self.objects = objects
        super().__init__("downloader", config)

    @property
    def stopping(self) -> bool:
        return self._stopping or self.downloader.counters["objects_downloaded"] >= self.objects

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self._stopping = value


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return unit_config(
        tmp_path,
        source={"format": "raw"},
        epochs={"count": 1, "shuffle": True},
        download={"window": 1 << 40},
    )


def test_the_loop_makes_few_python_calls_per_small_object(config: Config) -> None:
    layout = Layout.of(config)
    layout.create()
    ctx = UntilPublished(config, OBJECTS)
    downloader = ctx.downloader = Downloader(ctx)
    objects = [SourceObject(f"prefix/{i:05d}.bin", 100 + i, f'"{i:032x}"') for i in range(OBJECTS)]
    downloader.plan.share = ShareTable.of(objects)
    downloader.transfer = InstantTransfer(downloader._transfer_done)
    calls: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename not in FAKES:
            code = frame.f_code
            calls[f"{Path(code.co_filename).name}:{code.co_name}"] += 1

    with (
        Watch(layout.cache_claimed, IN_DELETE | IN_MOVED_FROM) as deletions,
        Watch(layout.cache_ready, IN_DELETE) as vanished,
    ):
        downloader.admission.watch(deletions, vanished)
        sys.setprofile(profile)
        try:
            downloader._loop()
        finally:
            sys.setprofile(None)
        downloader.download_log.close_all()

    # What a user relies on first: every object published once, in ready/, logged, with its
    # meta (the same bytes json.dumps wrote), and the epoch marked downloaded.
    ready = sorted(os.listdir(layout.cache_ready))
    assert len(ready) == OBJECTS and downloader.counters["objects_downloaded"] == OBJECTS
    assert layout.downloaded_marker(0).exists()
    logged = layout.download_log(0).read_text().splitlines()
    assert sorted(logged) == sorted(f"P {name.rpartition('-')[2]}" for name in ready)
    by_key = {obj.key: obj for obj in objects}
    for name in ready[:20]:
        meta = json.loads(Path(layout.meta_file(name)).read_text())
        obj = by_key[meta["key"]]
        assert meta == {"key": obj.key, "size": obj.size, "etag": obj.etag, "epoch": 0}
    per_object = sum(calls.values()) / OBJECTS
    heaviest = ", ".join(f"{name} {n / OBJECTS:.1f}" for name, n in calls.most_common(12))
    assert per_object <= CALLS_PER_OBJECT, (
        f"{per_object:.1f} Python calls per object > {CALLS_PER_OBJECT}: {heaviest}"
    )


@pytest.mark.parametrize(
    ("key", "etag", "skip", "records_ok", "mixed"),
    [
        ("prefix/a.bin", '"abc"', None, False, False),
        ('we"ird\\key\n\t\x00é€😀', None, None, False, False),
        ("k\udcff-surrogate", '"e"', [[0, 3], [7, 9]], True, True),
        ("k", '"e"', [], True, False),
    ],
)
def test_a_meta_is_the_same_bytes_json_dumps_wrote(
    tmp_path: Path,
    key: str,
    etag: str | None,
    skip: list[list[int]] | None,
    records_ok: bool,
    mixed: bool,
) -> None:
    """The writers parse metas with ``json``; the renderer must not change a byte of them."""
    job = Job(3, 7, SourceObject(key, 123456, etag), "e00003-000000007-x", tmp_path / "p")
    job.source, job.skip, job.records_ok = 1 if mixed else 0, skip, records_ok
    meta: dict[str, object] = {"key": key, "size": 123456, "etag": etag, "epoch": 3}
    if mixed:
        meta["source"] = job.source
    if skip:
        meta["skip"] = skip
    if records_ok:
        meta["records_ok"] = True
    assert render_meta(job, mixed) == json.dumps(meta).encode()


def test_the_writers_deletions_free_their_room_in_one_batch(config: Config) -> None:
    """Each object a writer deleted from ``claimed/`` gives its room back to the account that
    held it (downloads or kept copies), however many one read of the watch returns; an object
    not in the window, or a file that is no claim, frees nothing."""
    layout = Layout.of(config)
    layout.create()
    downloader = Downloader(ChildContext("downloader", config))
    admission, window = downloader.admission, downloader.window
    handoff = admission.handoff
    names = [f"e00000-{seq:09d}-{seq:024x}" for seq in range(5)]
    for name in names[:4]:
        window.reserve(name, 1000)
    handoff.reserve(names[4], 700)
    later = "e00001-000000000-" + "f" * 24
    window.reserve(later, 50)  # of the next epoch: not deleted
    claims = [layout.writer_claims(0) + name for name in names]
    for claim in [*claims, f"{layout.cache_claimed}/stray"]:
        Path(claim).touch()
    with (
        Watch(layout.cache_claimed, IN_DELETE | IN_MOVED_FROM) as deletions,
        Watch(layout.cache_ready, IN_DELETE) as vanished,
    ):
        admission.watch(deletions, vanished)
        for claim in [*claims[1:], f"{layout.cache_claimed}/stray"]:
            os.unlink(claim)
        admission.apply_deletions(timeout=5)
    assert window.used == 1000 + 50 and set(window.held) == {names[0], later}
    assert handoff.used == 0 and not handoff.held
