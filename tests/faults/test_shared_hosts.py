"""A real host: reboots that empty the RAM disk, two jobs naming the same directory, other
processes reading or deleting prefetchd's files. docs/reliability.md invariants 1, 7 and 9,
each against the real daemon and a moto server on 127.0.0.1: every record of the epoch exactly
once, or a loud failure (state ``failed``, exit 1, the reason) — never ``done`` with records
missing."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.trainers import delivered, log_tail
from tests.faults.faultkit import (
    SIZES,
    finish_reader,
    read_status,
    start_reader,
    state_dir,
    wait_status,
)

pytestmark = pytest.mark.e2e


def ram_dir(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["output"]["ram_dir"])


def cache_dir(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["download"]["cache_dir"])


def boot(tmp_path: Path, boot_id: str) -> dict[str, str]:
    """The environment that makes a daemon believe it runs in boot ``boot_id``."""
    source = tmp_path / f"boot-{boot_id}"
    source.write_text(boot_id + "\n")
    return {"PREFETCHD_BOOT_ID_FILE": str(source)}


def delivered_lines(config: Path) -> int:
    path = state_dir(config) / "shards" / "e0.delivered"
    try:
        return len(path.read_text().split())
    except FileNotFoundError:
        return 0


def reboot(daemon: Any, config: Path) -> None:
    """SIGKILL the whole daemon and take its RAM disk away, as a reboot does."""
    daemon.kill_group(signal.SIGKILL)
    daemon.proc.wait(30)
    shutil.rmtree(ram_dir(config))


def one_line_error(daemon: Any) -> str:
    lines: list[str] = [ln for ln in daemon.stderr.read_text().splitlines() if ln.strip()]
    assert lines, daemon.output()
    assert "Traceback" not in daemon.stderr.read_text(), daemon.output()
    return lines[-1]


# --- reboots ----------------------------------------------------------------------------------


def test_reboot_before_any_shard_was_read_starts_the_epoch_again_exactly_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=131)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    first = run_daemon(config, env=boot(tmp_path, "boot-a"))
    wait_status(config, lambda s: s["shards_written"] >= 3, 90, "3 shards written")
    reboot(first, config)
    second = run_daemon(config, env=boot(tmp_path, "boot-b"))
    out = tmp_path / "t.json"
    result = finish_reader(start_reader(config, out), out)
    assert second.wait(120) == 0, second.output()
    assert delivered([result], 0) == Counter(dataset["ids"])
    assert "starting epoch 0 again" in second.output()
    assert "boot id changed" in second.output()


def test_reboot_after_trainers_read_part_of_the_epoch_fails_loudly_never_done(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The records trainers read cannot be told apart from those lost without re-reading
    them, so exactly once is out of reach: the daemon says so instead of finishing short."""
    upload("tfrecord", SIZES, seed=132)
    # A RAM budget of 8 shards: the reader catches up with the writers and waits. A shard read
    # faster than the releaser's scans is freed (noted delivered) when its trainer next waits
    # (consume/releaser.py); with the whole epoch on the RAM disk at once, as a fast download
    # makes it, the reader would never wait and no shard would be noted read before the kill.
    config = write_config(
        tmp_path, epochs__count=1, output__shard_size="128KiB", output__ram_budget="1MiB"
    )
    first = run_daemon(config, env=boot(tmp_path, "boot-a"))
    out = tmp_path / "t.json"
    # ~40 shards at 3 s each: the epoch cannot end (nor its ledger be forgotten) before the
    # reader is killed, however slow this machine is
    reader = start_reader(config, out, "--delay", "3.0")
    wait_status(config, lambda s: s["shards_written"] >= 4, 90, "4 shards written")
    wait_status(config, lambda s: delivered_lines(config) >= 1, 90, "a shard read")
    reader.kill()
    reader.wait(30)
    reboot(first, config)
    second = run_daemon(config, env=boot(tmp_path, "boot-b"))
    assert second.wait(60) == 1, second.output()
    status = read_status(config)
    assert status is not None and status["state"] == "failed", status
    reason = status["reason"]
    assert "published shards of epoch 0" in reason and "boot id changed" in reason, reason
    assert reason in second.output()
    late = start_reader(config, tmp_path / "late.json", "--timeout", "30")
    assert late.wait(60) != 0
    assert "prefetchd failed" in log_tail(tmp_path / "late.json")
    # and it keeps saying so: a restart does not turn the loss into "done"
    third = run_daemon(config, env=boot(tmp_path, "boot-b"))
    assert third.wait(60) == 1, third.output()


# --- two jobs, one directory ------------------------------------------------------------------


@pytest.mark.parametrize("shared", ["ram_dir", "cache_dir"])
def test_a_second_config_naming_a_directory_in_use_is_refused_and_the_first_is_unharmed(
    shared: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=133)
    config = write_config(tmp_path / "one", epochs__count=1, output__shard_size="128KiB")
    first = run_daemon(config)
    out = tmp_path / "t.json"
    reader = start_reader(config, out, "--delay", "0.05")
    wait_status(config, lambda s: s["shards_written"] >= 1, 90, "the first shard")
    section = "output" if shared == "ram_dir" else "download"
    key = {
        f"{section}__{shared}": str(ram_dir(config) if shared == "ram_dir" else cache_dir(config))
    }
    other = write_config(tmp_path / "two", epochs__count=1, **key)
    second = run_daemon(other)
    assert second.wait(60) == 1, second.output()
    line = one_line_error(second)
    assert "another prefetchd is already running" in line, line
    assert f"{section}.{shared}" in line and str(key[f"{section}__{shared}"]) in line, line
    assert str(config) in line and f"pid {first.pid}" in line, line
    result = finish_reader(reader, out)
    assert first.wait(120) == 0, first.output()
    assert delivered([result], 0) == Counter(dataset["ids"])


def test_an_existing_foreign_directory_is_refused_never_chmodded_or_wiped(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", SIZES[:2], seed=134)
    foreign = tmp_path / "someone-elses"
    foreign.mkdir()
    foreign.chmod(0o750)
    (foreign / "thesis.tex").write_text("years of work")
    config = write_config(tmp_path, download__cache_dir=str(foreign))
    daemon = run_daemon(config)
    assert daemon.wait(60) == 1, daemon.output()
    line = one_line_error(daemon)
    assert "download.cache_dir" in line and str(foreign) in line and "thesis.tex" in line, line
    assert os.listdir(foreign) == ["thesis.tex"]
    assert (foreign / "thesis.tex").read_text() == "years of work"
    assert stat.S_IMODE(foreign.stat().st_mode) == 0o750
    check = subprocess.run(
        [*daemon.proc.args[:3], "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "thesis.tex" in check.stdout + check.stderr, check
    assert os.listdir(foreign) == ["thesis.tex"]


# --- other processes touching prefetchd's files ----------------------------------------------


def test_a_reader_that_cats_every_claimed_shard_frees_nothing_early(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """A backup or virus scanner opening and closing each claimed shard: the shard is freed
    only once its trainer has read it, and every record arrives exactly once."""
    dataset = upload("tfrecord", SIZES, seed=135)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    daemon = run_daemon(config)
    claimed = ram_dir(config) / "claimed"
    stop = threading.Event()
    cats = Counter[str]()

    def scanner() -> None:
        while not stop.is_set():
            for name in sorted(os.listdir(claimed)) if claimed.is_dir() else []:
                done = subprocess.run(["cat", str(claimed / name)], capture_output=True)
                cats[name] += done.returncode == 0
            stop.wait(0.01)

    thread = threading.Thread(target=scanner, daemon=True)
    thread.start()
    out = tmp_path / "t.json"
    try:
        result = finish_reader(start_reader(config, out, "--delay", "0.2"), out)
    finally:
        stop.set()
        thread.join(30)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result], 0) == Counter(dataset["ids"])
    assert sum(cats.values()) >= len(result["shards"]), "the scanner did not get to the shards"


def test_cache_files_deleted_under_a_running_daemon_are_fetched_again_exactly_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Objects deleted from ``cache_dir/ready/`` before a writer read them (a cleaner, an
    emptied cache): fetched again, counted in ``objects_refetched``, never a hang."""
    dataset = upload("tfrecord", SIZES, seed=136)
    config = write_config(
        tmp_path,
        epochs__count=1,
        output__writers=1,
        output__mix=1,
        output__shard_size="128KiB",
        output__ram_budget="1MiB",  # no trainer yet: the writer soon waits for RAM
    )
    daemon = run_daemon(config)
    ready = cache_dir(config) / "ready"
    wait_status(
        config, lambda s: len(os.listdir(ready)) >= 3, 90, "objects waiting in cache ready/"
    )
    deleted = 0
    for name in os.listdir(ready):
        try:
            os.unlink(ready / name)
            deleted += 1
        except FileNotFoundError:
            continue  # a writer claimed it meanwhile
    assert deleted >= 1
    out = tmp_path / "t.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result], 0) == Counter(dataset["ids"])
    final = read_status(config)
    assert final is not None and final["objects_refetched"] >= deleted, final


@pytest.mark.parametrize("what", ["a ready shard", "the whole RAM disk"])
def test_shards_deleted_under_a_running_daemon_fail_it_with_the_reason(
    what: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Published shards no trainer read, deleted by another process: never ``done``."""
    upload("tfrecord", SIZES, seed=137)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    daemon = run_daemon(config)
    ready = ram_dir(config) / "ready"
    wait_status(config, lambda s: s["shards_written"] >= 2, 90, "2 shards written")
    if what == "a ready shard":
        os.unlink(ready / sorted(os.listdir(ready))[0])
    else:
        # as ``rm -rf ram/* ram/.*`` would, in name order (the marker before ready/)
        for entry in sorted(os.scandir(ram_dir(config)), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    assert daemon.wait(60) == 1, daemon.output()
    status = read_status(config)
    assert status is not None and status["state"] == "failed", status
    expected = "was deleted from ready/" if what == "a ready shard" else "was emptied"
    assert expected in status["reason"], status["reason"]
