"""``python -m bench --sweep``: prefetchd's knobs one at a time, for docs/tuning.md.

Around the bench's base config (concurrency 32, part_size 8 MiB, writers 2, shard_size 32 MiB,
mix 8, ram_budget 1 GiB, trainer cycle_length 4), each knob takes each of its values while the
others stay at the base; every point is one prefetchd (classic) run per dataset, measured like
any bench run (delivered MB/s, trainer CPU, daemon RSS, peak RAM disk, time to first batch).
Writes ``sweep.json`` and ``sweep.png`` (one panel per knob) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024**2

# knob -> (config override key or "trainer:<spec key>", values, label of each value)
KNOBS: dict[str, tuple[str, list[Any]]] = {
    "download.concurrency": ("download__concurrency", [4, 8, 16, 32, 64]),
    "download.part_size": ("download__part_size", ["2MiB", "8MiB", "32MiB"]),
    "output.writers": ("output__writers", [1, 2, 3]),
    "output.shard_size": ("output__shard_size", ["8MiB", "32MiB", "128MiB"]),
    "output.mix": ("output__mix", [1, 8, 32]),
    "output.ram_budget": ("output__ram_budget", ["128MiB", "256MiB", "1GiB"]),
    "trainer cycle_length": ("trainer:cycle_length", [1, 4, 8]),
}
QUICK_KNOBS = ("download.concurrency", "output.writers")


def points(quick: bool) -> list[tuple[str, str, Any]]:
    """(knob, override key, value) for every sweep point, in order (pure)."""
    chosen = QUICK_KNOBS if quick else tuple(KNOBS)
    return [(knob, KNOBS[knob][0], value) for knob in chosen for value in KNOBS[knob][1]]


def sweep(
    args: argparse.Namespace,
    bench: Any,
    datasets: dict[str, Any],
    out: Path,
    meta: dict[str, Any],
    network: str,
    log: Callable[[str], None],
) -> int:
    results: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for knob, key, value in points(args.quick):
            for name, ds in datasets.items():
                overrides: dict[str, Any] = {}
                trainer: dict[str, Any] = {}
                if key.startswith("trainer:"):
                    trainer[key.partition(":")[2]] = value
                else:
                    overrides[key] = value
                row: dict[str, Any] = {
                    "knob": knob,
                    "value": value,
                    "dataset": name,
                    "network": network,
                    "repeat": repeat,
                    "load_before": os.getloadavg(),
                }
                try:
                    row.update(bench.run_trainer(ds, "prefetchd", trainer=trainer, **overrides))
                except Exception as exc:
                    row["error"] = str(exc)
                results.append(row)
                status = row.get("error") or (
                    f"{row['mb_s']:.0f} MB/s, RSS {row['daemon_rss_peak_mib']:.0f} MiB, "
                    f"RAM disk {row['ram_peak_mib']:.0f} MiB, "
                    f"1st batch {row['first_batch_s']:.2f} s"
                )
                log(f"sweep {network} {name} {knob}={value}: {status}")
                (out / "sweep.json").write_text(
                    json.dumps({**meta, "sweep": results}, indent=1, default=str) + "\n"
                )
    text = sweep_table(results)
    print("\n" + text)
    (out / "sweep.md").write_text(text + "\n")
    try:
        plot_sweep(results, str(out / "sweep.png"))
    except Exception as exc:  # the numbers are in sweep.json either way
        log(f"no sweep plot: {exc}")
    return 1 if any(r.get("error") for r in results) else 0


def medians(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(knob, value, dataset) -> median of each metric over repeats (pure)."""
    import statistics

    from bench.harness.report import steady_mb_s

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        if not r.get("error"):
            row = {**r, "steady_mb_s": steady_mb_s(r) or 0.0}
            groups.setdefault((r["knob"], str(r["value"]), r["dataset"]), []).append(row)
    metrics = (
        "mb_s",
        "steady_mb_s",
        "daemon_rss_peak_mib",
        "ram_peak_mib",
        "first_batch_s",
        "daemon_cpu_s_per_gb",
    )
    return {
        key: {m: statistics.median(float(g[m]) for g in group) for m in metrics}
        for key, group in groups.items()
    }


def sweep_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| knob | value | dataset | MB/s | steady MB/s | daemon CPU s/GB | daemon RSS MiB "
        "| RAM disk MiB | 1st batch s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (knob, value, dataset), m in medians(results).items():
        lines.append(
            f"| {knob} | {value} | {dataset} | {m['mb_s']:.0f} | {m['steady_mb_s']:.0f} "
            f"| {m['daemon_cpu_s_per_gb']:.1f} "
            f"| {m['daemon_rss_peak_mib']:.0f} | {m['ram_peak_mib']:.0f} "
            f"| {m['first_batch_s']:.2f} |"
        )
    return "\n".join(lines)


def plot_sweep(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = medians(results)
    knobs = list(dict.fromkeys(k[0] for k in table))
    datasets = list(dict.fromkeys(k[2] for k in table))
    fig, axes = plt.subplots(1, len(knobs), figsize=(3.6 * len(knobs), 3.4), squeeze=False)
    for ax, knob in zip(axes[0], knobs, strict=True):
        values = list(dict.fromkeys(k[1] for k in table if k[0] == knob))
        for dataset in datasets:
            ys = [table.get((knob, v, dataset), {}).get("mb_s", float("nan")) for v in values]
            ax.plot(values, ys, marker="o", label=dataset)
        ax.set_title(knob, fontsize="small")
        ax.set_ylabel("delivered MB/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
