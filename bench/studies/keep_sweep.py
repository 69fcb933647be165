"""``python -m bench --keep-sweep``: ``download.keep`` at 0, 50 % and 100 % of the share, for
docs/benchmarks.md.

One daemon run per keep size, ``EPOCHS`` epochs each, on the first ``--datasets`` dataset,
between the daemon and the store a request-counting proxy (``testkit.proxy``; every
row goes through it, so it costs every row alike). A reader in this process claims each epoch's
shards with ``ready_files(epoch=k)`` and reads them whole; per epoch it records:

- MB/s: the dataset's bytes over the epoch's wall time (from the reader's first claim of the
  epoch to its last shard read);
- GETs and bytes fetched: what the proxy passed to the store during the epoch (the daemon runs
  ahead of the reader by at most ``download.window``, an eighth of the dataset here, plus the
  RAM budget of 64 MiB, so some objects of the next epoch land in this one's count);
- daemon CPU per GB: CPU seconds of the daemon's processes during the epoch, per GB delivered;
- hit ratio: the daemon's own figure (``keep_epochs`` in status).

A last row per keep size covers the whole run from the daemon's start (its GETs and bytes are
exact, whatever epoch they belong to; MB/s is the run's ``EPOCHS`` x dataset over its time).

LRU cannot be configured in prefetchd; its row is simulated (``download.keep.lru_epoch_hits``)
over the same seeded orders and sizes, beside the same simulation of prefetchd's fixed subset.
Writes ``keep.json`` and ``keep.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.harness.environment import ROOT
from bench.harness.runner import BUCKET
from prefetchd.config import default_client
from testkit.proxy import CountingProxy

FRACTIONS = (0.0, 0.5, 1.0)
EPOCHS = 3
EPOCH_TIMEOUT = 900.0
RAM_BUDGET = 64 * 2**20  # (writers + 1) x SHARD_SIZE = 48 MiB, and a little slack
SHARD_SIZE = 16 * 2**20
GB = 1e9


def keep_sweep(
    args: argparse.Namespace,
    bench: Any,
    ds: Any,
    out: Path,
    meta: dict[str, Any],
    network: str,
    log: Callable[[str], None],
) -> int:
    """Every keep size on ``ds``, then the simulated rows; 0 if every run finished."""
    rows: list[dict[str, Any]] = []
    failed = 0
    with CountingProxy(bench.endpoint) as proxy:
        runner = dataclasses.replace(bench, endpoint=proxy.url)
        for fraction in FRACTIONS:
            try:
                rows += run_keep(runner, ds, fraction, proxy, network, log)
            except Exception as exc:  # the other keep sizes still run; the row says why
                failed += 1
                rows.append({"keep_fraction": fraction, "network": network, "error": str(exc)})
                log(f"keep {fraction:.0%}: failed: {exc}")
            (out / "keep.json").write_text(json.dumps({**meta, "keep": rows}, indent=1) + "\n")
    rows += simulated_rows(bench.endpoint, ds, network)
    (out / "keep.json").write_text(json.dumps({**meta, "keep": rows}, indent=1) + "\n")
    text = keep_table(rows)
    print("\n" + text)
    (out / "keep.md").write_text(text + "\n")
    return 1 if failed else 0


def run_keep(
    bench: Any, ds: Any, fraction: float, proxy: CountingProxy, network: str, log: Any
) -> list[dict[str, Any]]:
    """One daemon run of ``EPOCHS`` epochs with ``download.keep`` = ``fraction`` of ``ds``."""
    from prefetchd import ready_files

    run_dir = bench.work / f"keep-{int(fraction * 100)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    keep = int(fraction * ds.bytes)
    # A window and RAM budget small beside the dataset, so that the daemon cannot run far
    # ahead of the reader: each epoch's time is then its own, not the previous one's slack.
    window = max(32 * 2**20, ds.bytes // 8)
    config = bench.daemon_config(
        ds,
        default_client(),
        run_dir,
        epochs__count=EPOCHS,
        download__keep=keep,
        download__window=window,
        output__ram_budget=RAM_BUDGET,
        output__shard_size=SHARD_SIZE,
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(run_dir / "daemon.log", "wb"),  # noqa: SIM115
        env=bench.env,
        cwd=ROOT,
        start_new_session=True,
    )
    rows = []
    start = (time.monotonic(), proxy.counts(), 0.0)
    try:
        for epoch in range(EPOCHS):
            before = (time.monotonic(), proxy.counts(), tree_cpu(daemon.pid))
            read = sum(
                _read(path) for path in ready_files(config, epoch=epoch, timeout=EPOCH_TIMEOUT)
            )
            after = (time.monotonic(), proxy.counts(), tree_cpu(daemon.pid))
            row = epoch_row(ds, fraction, epoch, before, after, network)
            row["shard_bytes_read"] = read
            rows.append(row)
            log(
                f"keep {fraction:.0%} epoch {epoch}: {row['mb_s']:.0f} MB/s, {row['gets']} GETs, "
                f"{row['cpu_s_per_gb']:.2f} CPU s/GB"
            )
        whole = epoch_row(ds, fraction, -1, start, after, network)
        whole.update(
            mb_s=round(EPOCHS * whole["mb_s"], 1),
            cpu_s_per_gb=round(whole["cpu_s_per_gb"] / EPOCHS, 2),
        )
        rows.append(whole)  # epoch -1: the whole run, from the daemon's start
        status = json.loads((run_dir / "state" / "status.json").read_text())
        ratios = {e["epoch"]: e["hit_ratio"] for e in status.get("keep_epochs", [])}
        for row in rows:
            row["hit_ratio"] = ratios.get(row["epoch"]) or 0.0
        whole["hit_ratio"] = status.get("keep_hit_ratio") or 0.0
        daemon.wait(120)
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        shutil.rmtree(bench.cache_root / run_dir.name, ignore_errors=True)
        shutil.rmtree(bench.ram / run_dir.name, ignore_errors=True)
    return rows


def _read(path: str) -> int:
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 * 2**20):
            total += len(chunk)
    return total


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def epoch_row(
    ds: Any,
    fraction: float,
    epoch: int,
    before: tuple[float, dict[str, int], float],
    after: tuple[float, dict[str, int], float],
    network: str,
) -> dict[str, Any]:
    """One measured row from the figures at the epoch's start and end (pure)."""
    seconds = max(after[0] - before[0], 1e-9)
    cpu = after[2] - before[2]
    return {
        "keep_fraction": fraction,
        "network": network,
        "epoch": epoch,
        "seconds": round(seconds, 3),
        "mb_s": round(ds.bytes / seconds / 1e6, 1),
        "gets": after[1]["get"] - before[1]["get"],
        "gb_fetched": round((after[1]["get_bytes"] - before[1]["get_bytes"]) / GB, 3),
        "cpu_s_per_gb": round(cpu / (ds.bytes / GB), 2),
    }


def simulated_rows(endpoint: str, ds: Any, network: str) -> list[dict[str, Any]]:
    """LRU and prefetchd's fixed subset over the dataset's seeded orders (no daemon)."""
    from prefetchd.download.keep import choose_kept, keep_rank, lru_epoch_hits, subset_epoch_hits
    from prefetchd.download.order import epoch_permutation
    from testkit import sample_data

    client = sample_data.make_client(endpoint)
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=ds.prefix):
        objects += [(o["Key"], int(o["Size"])) for o in page.get("Contents", ())]
    objects.sort()
    sizes = [size for _, size in objects]
    total = sum(sizes)
    orders = [  # the bench config's epochs.seed is 0
        list(epoch_permutation(len(sizes), seed=0, epoch=e, shuffle=True)) for e in range(EPOCHS)
    ]
    rows = []
    for fraction in FRACTIONS[1:]:
        capacity = int(fraction * total)
        flags = choose_kept([keep_rank(k) for k, _ in objects], sizes, capacity)
        for policy, hits in (
            ("lru (simulated)", lru_epoch_hits(orders, sizes, capacity)),
            ("prefetchd (simulated)", subset_epoch_hits(orders, sizes, flags)),
        ):
            later = hits[1:]
            rows.append(
                {
                    "policy": policy,
                    "keep_fraction": fraction,
                    "network": network,
                    "epoch": "1+",
                    "hit_ratio": round(sum(later) / (total * len(later)), 3),
                }
            )
    return rows


def keep_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``rows``: measured epoch 0, measured later epochs (mean), and
    the simulated hit ratios (pure)."""
    lines = [
        "| keep | epoch | MB/s | GETs to the store | GB fetched | daemon CPU s/GB | hit ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for fraction in FRACTIONS:
        measured = [r for r in rows if r["keep_fraction"] == fraction and "policy" not in r]
        if any("error" in r for r in measured):
            lines.append(f"| {fraction:.0%} | failed: {measured[0]['error']} | | | | | |")
            continue
        for label, group in (
            ("0", [r for r in measured if r["epoch"] == 0]),
            (f"1-{EPOCHS - 1} (mean)", [r for r in measured if r["epoch"] > 0]),
            (f"all {EPOCHS}, whole run", [r for r in measured if r["epoch"] == -1]),
        ):
            if group:
                lines.append(_row(f"{fraction:.0%}", label, group))
    for r in rows:
        if "policy" in r:
            lines.append(
                f"| {r['keep_fraction']:.0%}, {r['policy']} | {r['epoch']} | | | | | "
                f"{r['hit_ratio']:.0%} |"
            )
    return "\n".join(lines)


def _row(keep: str, label: str, group: list[dict[str, Any]]) -> str:
    def mean(key: str) -> float:
        return sum(float(r[key]) for r in group) / len(group)

    return (
        f"| {keep} | {label} | {mean('mb_s'):.0f} | {mean('gets'):.0f} | "
        f"{mean('gb_fetched'):.2f} | {mean('cpu_s_per_gb'):.2f} | {mean('hit_ratio'):.0%} |"
    )
