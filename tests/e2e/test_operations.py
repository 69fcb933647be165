"""What an operator sees of a running daemon: Prometheus metrics on 127.0.0.1 with the same
figures as ``status --json``, private files, the trainers' wait time, ``status --watch``."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pty
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prefetchd import ready_files
from prefetchd.supervise.metrics import LABELLED, METRICS
from prefetchd.supervise.status import REQUIRED_KEYS
from testkit.s3server import free_port
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "status.md"
KIB = 1024


def scrape(port: int) -> dict[str, float]:
    """``{"name{label=value}": value}`` of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def status_file(config: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (Path(config["status"]["state_dir"]) / "status.json").read_text()
    )
    return data


def consistent_pair(config: dict[str, Any], port: int) -> tuple[dict[str, Any], dict[str, float]]:
    """A status record and a scrape taken while the daemon published no newer record."""
    for _ in range(20):
        before = status_file(config)
        metrics = scrape(port)
        after = status_file(config)
        if before["updated"] == after["updated"]:
            return after, metrics
        time.sleep(0.1)
    pytest.fail("the status record changed during every scrape")


def _get(config: dict[str, Any], key: str) -> int:
    try:
        return int(status_file(config).get(key) or 0)
    except (OSError, ValueError):
        return 0


def read_all(config_path: Path, shards: list[str]) -> None:
    """A trainer: claim every shard of the job and read it through (which frees it)."""
    for path in ready_files(config_path, timeout=120):
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        shards.append(path)


def test_metrics_status_wait_time_and_private_files(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", [256 * KIB] * 24, seed=2)  # 6 MiB: more than the RAM budget
    port = free_port()
    config_path = write_config(
        tmp_path,
        epochs__count=1,
        status__metrics_port=port,
        output__shard_size="128KiB",
        output__ram_budget="2MiB",
    )
    config = yaml.safe_load(config_path.read_text())
    daemon = run_daemon(config_path)
    wait_for(lambda: _get(config, "shards_written") >= 2, 60, "the first shards")
    status = status_file(config)
    writers = [status["children"][f"writer-{i}"]["pid"] for i in range(2)]
    # top and `pgrep -l prefetchd` name every child by its role, not one more "python"
    comms = {
        child: Path(f"/proc/{report['pid']}/comm").read_text().strip()
        for child, report in status["children"].items()
    }
    by_role = {"downloader": "prefetchd-dl", "writer-0": "prefetchd-w0", "writer-1": "prefetchd-w1"}
    assert comms == by_role

    # A trainer in this process reads every shard; with the writers paused it runs dry and
    # must wait, and that wait is what status reports.
    shards: list[str] = []
    trainer = threading.Thread(target=read_all, args=(config_path, shards), daemon=True)
    for pid in writers:
        os.kill(pid, signal.SIGSTOP)
    try:
        trainer.start()
        wait_for(lambda: _get(config, "consumers_waiting") >= 1, 30, "the trainer to wait")
        time.sleep(1.5)
        status = status_file(config)
        assert status["consumers"] == 1
        assert status["consumer_wait_s"] > 0
        assert 0 < status["consumer_wait_ratio"] <= 1
        # the trainer starves because the (paused) writers make no shards, and status says so
        assert status["bottleneck"]["verdict"] == "writer-bound", status["bottleneck"]
        # --- the same figures in metrics as in status
        status, metrics = consistent_pair(config, port)
        assert not [k for k in REQUIRED_KEYS if k not in status]
        for fig in METRICS:
            if status.get(fig.key) is None:
                continue
            name = fig.name + ("_total" if fig.kind == "counter" else "")
            assert metrics[name] == pytest.approx(float(status[fig.key])), name
        assert metrics[f"prefetchd_state{{state={status['state']}}}"] == 1
        verdict = status["bottleneck"]["verdict"]
        assert metrics[f"prefetchd_bottleneck{{verdict={verdict}}}"] == 1
        for child, info in status["children"].items():
            assert metrics[f"prefetchd_child_up{{child={child}}}"] == float(info["alive"])
        names = {key.partition("{")[0] for key in metrics}
        for name, kind, _, label in LABELLED:
            if label == "source" and not status.get("sources"):
                continue  # a job of several sources has them (unit/supervise/test_source_status.py)
            assert name + ("_total" if kind == "counter" else "") in names, name
        documented = set(re.findall(r"`(prefetchd_[a-z_]+)`", DOCS.read_text()))
        assert names <= documented, f"undocumented metrics: {sorted(names - documented)}"

        # --- listeners: 127.0.0.1 only
        listening = [
            c.laddr
            for c in psutil.Process(daemon.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening, "the metrics listener is not open"
        assert all(addr.ip == "127.0.0.1" for addr in listening), listening

        # --- private files and directories
        state = Path(config["status"]["state_dir"])
        files = [state / "status.json", state / "job.json", *state.glob("children/*.json")]
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        for root in (
            state,
            Path(config["download"]["cache_dir"]),
            Path(config["output"]["ram_dir"]),
        ):
            for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
                assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory

        watch_in_a_terminal(config_path)
    finally:
        for pid in writers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    trainer.join(120)
    assert daemon.wait(120) == 0, daemon.output()
    assert shards, "the trainer read no shard"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _read_terminal(leader: int, done: Callable[[bytes], bool], *, seconds: float) -> bytes:
    """What a program writes to the terminal ``leader`` until ``done(what it wrote)``, the
    program is gone (EIO) or ``seconds`` pass."""
    output = b""
    deadline = time.monotonic() + seconds
    while not done(output) and time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                output += os.read(leader, 65536)
            except OSError as exc:  # EIO once the process is gone
                if exc.errno != errno.EIO:
                    raise
                break
    return output


def watch_in_a_terminal(config_path: Path) -> None:
    """``status --watch`` on a terminal redraws in place and leaves on Ctrl-C with exit 0."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefetchd", "status", "--config", str(config_path), "--watch"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        # Ctrl-C as a shell's foreground program gets it: a test run started in the background
        # (`scripts/test.sh &`) ignores SIGINT, and an ignored signal stays ignored across exec
        preexec_fn=_default_sigint,
    )
    os.close(follower)
    try:
        output = _read_terminal(leader, lambda out: out.count(b"\x1b[H") >= 3, seconds=30)
        proc.send_signal(signal.SIGINT)
        # Go on reading until it has left: a program whose terminal is full blocks in its
        # last write (the cursor shown again) and would never exit.
        output += _read_terminal(leader, lambda _: proc.poll() is not None, seconds=20)
        code = proc.wait(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    text = output.decode(errors="replace")
    assert text.count("\x1b[H") >= 3, text[-2000:]
    assert "\x1b[2J" not in text, "--watch clears the whole screen (flicker) instead of redrawing"
    assert "bottleneck" in text and "throughput" in text
    assert code == 0


def test_metrics_port_in_use_is_a_clear_failure(
    tmp_path: Path, write_config: Callable[..., Path], upload: Callable[..., Any]
) -> None:
    upload("tfrecord", [4 * KIB])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path, status__metrics_port=port)
        proc = subprocess.run(
            [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"status.metrics_port {port}" in last and "already in use" in last
    assert "Traceback" not in proc.stderr
