"""The soak: three epochs under a seeded random schedule of store faults and SIGKILLs of
writers, the downloader, the whole daemon and the trainer. Afterwards every invariant holds
and the daemon's memory did not grow. Marked ``soak``: ``scripts/test.sh`` runs it (set
``PREFETCHD_SKIP_SOAK=1`` to skip), plain ``pytest`` does not (pass ``--soak``)."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from testkit.trainers import delivered, log_tail, ram_bytes, tree_bytes
from tests.faults.faultkit import read_status, start_reader
from tests.faults.faultproxy import FaultProxy, Rule

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

KIB, MIB = 1024, 1024**2
SEED = 20261202
PROXY_SEED = SEED  # the fault proxy's (the `proxy` fixture's)
EPOCHS = 3
EVENTS = 40  # SIGKILLs, at random moments
WINDOW, RAM_BUDGET = 3 * MIB, 3 * MIB


class Sampler(threading.Thread):
    """Samples the daemon's memory (supervisor and children) and the byte budgets."""

    def __init__(self, cache: Path, ram: Path) -> None:
        super().__init__(daemon=True)
        self.cache, self.ram = cache, ram
        self.pid = 0
        self.epoch = 0
        self.rss: dict[int, list[int]] = {}  # epoch -> samples of the daemon's total RSS
        self.max_ram = self.max_raw = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.25):
            self.max_ram = max(self.max_ram, ram_bytes(self.ram))
            raw = tree_bytes(self.cache, only=("ready", "claimed", ".tmp"))
            self.max_raw = max(self.max_raw, raw)
            try:
                proc = psutil.Process(self.pid)
                procs = [proc, *proc.children(recursive=True)]
                total = sum(p.memory_info().rss for p in procs)
            except psutil.Error:
                continue
            if len(procs) >= 4:  # supervisor, downloader and both writers are up
                self.rss.setdefault(self.epoch, []).append(total)


def test_soak_three_epochs_of_faults_and_kills(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    rng = random.Random(SEED)
    sizes = [rng.choice([2, 9, 40, 130, 300, 700, 1200]) * KIB for _ in range(64)]
    dataset = upload("tfrecord", sizes, seed=SEED)
    for rule in (
        Rule("error", status=503, code="SlowDown", probability=0.04, times=None),
        Rule("error", status=500, code="InternalError", probability=0.03, times=None),
        Rule("reset", probability=0.02, times=None),
        Rule("short", probability=0.02, times=None),
        Rule("flip", ranged=True, probability=0.02, times=None),
        Rule("stall", seconds=0.5, probability=0.02, times=None),
    ):
        proxy.add(rule)
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=EPOCHS,
        download__window=WINDOW,
        output__ram_budget=RAM_BUDGET,
        output__shard_size="128KiB",
        output__writers=2,
    )
    raw = yaml.safe_load(config.read_text())
    sampler = Sampler(Path(raw["download"]["cache_dir"]), Path(raw["output"]["ram_dir"]))
    daemon = run_daemon(config)
    sampler.pid = daemon.pid
    sampler.start()

    checkpoints: list[Path] = []

    def start_trainer() -> Any:
        ckpt = tmp_path / f"ckpt-{len(checkpoints)}.json"
        args = ["--checkpoint", str(ckpt), "--checkpoint-every", "2", "--delay", "0.1"]
        saved = [c for c in checkpoints if c.exists()]
        args += ["--resume", str(saved[-1])] if saved else ["--resumable"]
        checkpoints.append(ckpt)
        return start_reader(config, tmp_path / f"out-{len(checkpoints)}.json", *args)

    trainer = start_trainer()
    kills: Counter[str] = Counter()
    for _ in range(EVENTS):
        time.sleep(rng.uniform(1.0, 4.0))
        if trainer.poll() is not None:
            break
        status = read_status(config)
        sampler.epoch = int(status["epoch"]) if status else sampler.epoch
        kind = rng.choice(["writer", "writer", "downloader", "daemon", "trainer"])
        if kind == "daemon":
            daemon.kill_group(signal.SIGKILL)
            daemon.proc.wait(30)
            daemon = run_daemon(config)
            sampler.pid = daemon.pid
        elif kind == "trainer":
            trainer.kill()
            trainer.wait(30)
            trainer = start_trainer()
        elif status is not None:
            name = "downloader" if kind == "downloader" else f"writer-{rng.randrange(2)}"
            child = status["children"].get(name, {})
            if not child.get("alive"):
                continue
            try:
                os.kill(int(child["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                continue
        kills[kind] += 1

    deadline = time.monotonic() + 600
    while trainer.poll() is None and time.monotonic() < deadline:
        status = read_status(config)
        sampler.epoch = int(status["epoch"]) if status else sampler.epoch
        time.sleep(0.5)
    final_out = tmp_path / f"out-{len(checkpoints)}.json"
    assert trainer.poll() == 0, f"trainer did not finish:\n{log_tail(final_out)}"
    assert daemon.wait(120) == 0, daemon.output()
    sampler.halt.set()
    sampler.join()

    # every incarnation of the trainer: what its last checkpoint says it trained on
    results = [json.loads(c.read_text()) for c in checkpoints[:-1] if c.exists()]
    results.append(json.loads(final_out.read_text()))
    for epoch in range(EPOCHS):
        got = delivered(results, epoch)
        want = Counter(dataset["ids"])
        assert got == want, f"epoch {epoch}: lost {want - got}, doubled {got - want}"
    status = read_status(config)
    assert status is not None and status["objects_skipped"] == 0 and status["errors"] == 0
    assert sampler.max_ram <= RAM_BUDGET, f"RAM disk held {sampler.max_ram} bytes"
    # the window, plus at most one object per transfer slot caught mid-fetch by a SIGKILL
    assert sampler.max_raw <= WINDOW + max(sizes), f"cache held {sampler.max_raw} raw bytes"
    for root in (Path(raw["download"]["cache_dir"]), Path(raw["output"]["ram_dir"])):
        assert not list((root / ".tmp").iterdir()), f"temp files left in {root}/.tmp"
    # Memory: the last epoch's peak is not meaningfully above the first's.
    peaks = {e: max(v) for e, v in sampler.rss.items() if v}
    assert 0 in peaks and max(peaks) > 0, f"too few memory samples: {list(sampler.rss)}"
    first, last = peaks[0], peaks[max(peaks)]
    assert last <= first * 1.25 + 16 * MIB, f"daemon RSS grew from {first} to {last} bytes"
    print(f"soak: kills {dict(kills)}, faults {dict(proxy.faults_by_action())}, rss peaks {peaks}")
