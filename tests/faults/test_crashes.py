"""SIGKILL and SIGSTOP at any point: every record of the epoch is delivered exactly once, hung
children are replaced, a crash loop ends in ``failed`` and children never outlive the daemon."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.trainers import delivered
from tests.faults.faultkit import HERE, SIZES, finish_reader, read_status, start_reader, wait_status

pytestmark = pytest.mark.e2e


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def child_pid(config: Path, name: str) -> int:
    status = wait_status(
        config, lambda s: bool(s["children"].get(name, {}).get("alive")), 60, f"{name} alive"
    )
    return int(status["children"][name]["pid"])


def test_sigkilled_downloader_is_restarted_and_nothing_is_lost_or_doubled(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=21)
    # Small shards, a small RAM budget and a slow trainer hold the downloader back on its
    # window, so the kill lands while it still has objects to fetch (with a fast pipeline
    # both epochs were downloaded within the status interval, before the kill).
    config = write_config(
        tmp_path,
        download__window="2MiB",
        download__concurrency=2,
        output__shard_size="128KiB",
        output__ram_budget="1MiB",
    )
    daemon = run_daemon(config)
    out = tmp_path / "t.json"
    reader = start_reader(config, out, "--delay", "0.1")
    status = wait_status(config, lambda s: s["objects_downloaded"] >= 2, 60, "the first downloads")
    os.kill(status["children"]["downloader"]["pid"], signal.SIGKILL)
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    final = read_status(config)
    assert final is not None and final["children"]["downloader"]["restarts"] == 1


@pytest.mark.parametrize("when", [1, 4])
def test_sigkilled_daemon_restarted_with_the_same_config_delivers_exactly_once(
    when: int,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The whole process group dies (OOM killer, node drain); a fresh ``prefetchd run``
    resumes the job: shards in ready/ survive, temp files are swept, and a trainer that kept
    running rides the restart out."""
    dataset = upload("tfrecord", SIZES, seed=22)
    config = write_config(tmp_path, output__shard_size="128KiB", download__window="2MiB")
    first = run_daemon(config)
    out = tmp_path / "t.json"
    reader = start_reader(config, out, "--delay", "0.05")
    wait_status(config, lambda s: s["shards_written"] >= when, 60, f"{when} shards written")
    first.kill_group(signal.SIGKILL)
    first.proc.wait(30)
    ram = Path(first.config.read_text().split("ram_dir: ")[1].split("\n")[0])
    survivors = set(os.listdir(ram / "ready"))
    second = run_daemon(config)
    result = finish_reader(reader, out)
    assert second.wait(120) == 0, second.output()
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    assert survivors <= {s for s in result["shards"]}, "a published shard was lost in the crash"
    assert "resuming job " in second.output()


def test_children_stop_when_the_supervisor_is_killed(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", SIZES[:4], seed=23)
    config = write_config(tmp_path)
    daemon = run_daemon(config)
    status = wait_status(config, lambda s: s["state"] == "running", 60, "the daemon to run")
    children = [int(c["pid"]) for c in status["children"].values()]
    os.kill(daemon.pid, signal.SIGKILL)  # the supervisor only, not its group
    daemon.proc.wait(30)
    deadline = time.monotonic() + 30
    while not all(pid_gone(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in children if not pid_gone(p)]
    assert not alive, f"children {alive} outlived their supervisor"


def test_hung_writer_is_detected_by_heartbeat_and_replaced(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """SIGSTOP a writer holding claimed objects: after the heartbeat timeout (30 s) it is
    killed and restarted, and the records it held still arrive exactly once."""
    dataset = upload("tfrecord", SIZES, seed=24)
    config = write_config(
        tmp_path, epochs__count=1, output__shard_size="256KiB", output__ram_budget="1MiB"
    )
    daemon = run_daemon(config)
    victim = child_pid(config, "writer-0")
    claimed = Path(str(yaml.safe_load(config.read_text())["download"]["cache_dir"])) / "claimed"
    # No trainer yet: the writers fill the RAM budget and wait, holding claimed objects.
    deadline = time.monotonic() + 60
    while not any(n.startswith("w0-") for n in os.listdir(claimed)):
        assert time.monotonic() < deadline, "writer-0 never claimed an object"
        time.sleep(0.05)
    os.kill(victim, signal.SIGSTOP)
    out = tmp_path / "t.json"
    reader = start_reader(config, out)
    status = wait_status(
        config,
        lambda s: s["children"]["writer-0"]["restarts"] >= 1,
        90,
        "the hung writer to be replaced",
    )
    assert status["children"]["writer-0"]["pid"] != victim
    assert pid_gone(victim)
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    assert "stopped reporting" in daemon.output()


def test_a_child_that_keeps_crashing_fails_the_daemon_with_the_reason(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", SIZES[:6], seed=25)
    config = write_config(tmp_path, epochs__count=1, source__format="crashing_plugin:dies")
    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    daemon = run_daemon(config, env={"PYTHONPATH": pythonpath})
    out = tmp_path / "t.json"
    reader = start_reader(config, out)
    assert daemon.wait(120) == 1, daemon.output()
    status = read_status(config)
    assert status is not None and status["state"] == "failed"
    assert "crashed 5 times in a row" in status["reason"], status["reason"]
    assert reader.wait(120) != 0
    assert "DaemonFailed" in out.with_suffix(".log").read_text()
