"""The benchmark's pure part: medians of interleaved runs, ratios, the daemon's CPU split, the
tables and the first bars, on loopback and the shaped network (the data-path bars are
``bench.harness.bars``).

A run is a dict with at least ``network``, ``dataset``, ``loader`` and the metrics below; the
harness (``bench.harness.runner``) produces them, this module only computes. Nothing here measures
or imports TensorFlow, so the arithmetic is unit-tested (``tests/unit/bench/``).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench.harness.contenders import CEILINGS, LOADERS, PREFETCHD
from bench.harness.datasets import NAMES as DATASETS

METRICS = (
    "mb_s",
    "steady_mb_s",
    "records_s",
    "steady_records_s",
    "trainer_cpu_s_per_gb",
    "trainer_cpu_steady_s_per_gb",
    "daemon_cpu_s_per_gb",
    "startup_cpu_s",
    "data_cpu_s_per_gb",
    "data_cpu_ms_per_object",
    "data_cpu_us_per_record",
    "data_cpu_us_per_file",
    "status_s",
    "daemon_rss_peak_mib",
    "ram_peak_mib",
    "first_batch_s",
    "work_ms_median",
    "step_ms_median",
)
# The first bars (loopback and the shaped network).
BAR_VS_BASELINE = 3.0
BAR_VS_CEILING = 0.8
BAR_VS_CEILING_SMALL_LOOPBACK = 0.6
BAR_CPU_VS_FLOOR = 1.25
BAR_DAEMON_RSS_MIB = 400.0

Key = tuple[str, str, str]  # (network, dataset, loader)


def cpu_split(
    cpu_s: float | None, *, nbytes: int, objects: int, records: int, files: int
) -> dict[str, float | None]:
    """Data-path CPU seconds per GB, milliseconds per object, microseconds per record and per
    file inside the objects (a tar sample's members); all None without a CPU figure."""

    def per(unit: float, count: int) -> float | None:
        return None if cpu_s is None or count <= 0 else cpu_s * unit / count

    return {
        "data_cpu_s_per_gb": None if cpu_s is None or nbytes <= 0 else cpu_s / (nbytes / 1e9),
        "data_cpu_ms_per_object": per(1e3, objects),
        "data_cpu_us_per_record": per(1e6, records),
        "data_cpu_us_per_file": per(1e6, files),
    }


def median_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def steady_mb_s(run: dict[str, Any]) -> float | None:
    """MB/s after the first batch: the rate once the pipeline runs, without its start-up (the
    first batch's own bytes are counted in, so this is a slight overestimate)."""
    size = run.get("bytes")
    return None if size is None else _after_first_batch(run, float(size) / 1e6)


def steady_records_s(run: dict[str, Any]) -> float | None:
    """Records (samples) per second after the first batch, counted as ``steady_mb_s``."""
    records = run.get("records")
    return None if records is None else _after_first_batch(run, float(records))


def _after_first_batch(run: dict[str, Any], amount: float) -> float | None:
    wall, first = run.get("wall_s"), run.get("first_batch_s")
    if wall is None or first is None or wall <= first:
        return None
    return amount / (float(wall) - float(first))


def with_steady(run: dict[str, Any]) -> dict[str, Any]:
    """The run with its steady-state rates (``steady_mb_s``, ``steady_records_s``) added."""
    return {**run, "steady_mb_s": steady_mb_s(run), "steady_records_s": steady_records_s(run)}


def summarize(runs: Sequence[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Median of every metric over the repeats of each (network, dataset, loader)."""
    groups: dict[Key, list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("error"):
            continue
        run = with_steady(run)
        groups.setdefault((run["network"], run["dataset"], run["loader"]), []).append(run)
    out: dict[Key, dict[str, Any]] = {}
    for key, group in groups.items():
        row: dict[str, Any] = {"runs": len(group)}
        for metric in METRICS:
            row[metric] = median_or_none(r.get(metric) for r in group)
        out[key] = row
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def ratios(summary: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, float | None]]:
    """For each prefetchd variant: ÷ ceiling, ÷ baseline (MB/s), trainer CPU/GB ÷ floor, and
    the GIL measure: Python work time per step ÷ floor's."""
    out: dict[Key, dict[str, float | None]] = {}

    def get(network: str, dataset: str, name: str, metric: str) -> float | None:
        found = summary.get((network, dataset, name))
        return None if found is None else found.get(metric)

    for (network, dataset, loader), row in summary.items():
        if loader not in PREFETCHD:
            continue
        other = functools.partial(get, network, dataset)

        ceilings = [c for c in (other(name, "mb_s") for name in CEILINGS) if c is not None]
        out[(network, dataset, loader)] = {
            "vs_ceiling": ratio(row["mb_s"], max(ceilings) if ceilings else None),
            "vs_baseline": ratio(row["mb_s"], other("baseline", "mb_s")),
            "vs_s3fs": ratio(row["mb_s"], other("s3fs", "mb_s")),
            "cpu_vs_floor": ratio(
                row["trainer_cpu_s_per_gb"], other("floor", "trainer_cpu_s_per_gb")
            ),
            "steady_cpu_vs_floor": ratio(
                row["trainer_cpu_steady_s_per_gb"], other("floor", "trainer_cpu_steady_s_per_gb")
            ),
            "work_vs_floor": ratio(row["work_ms_median"], other("floor", "work_ms_median")),
        }
    return out


def bars(
    summary: dict[Key, dict[str, Any]], rat: dict[Key, dict[str, float | None]]
) -> list[dict[str, Any]]:
    """Each bar of the issue that this run measured: what, the value, the bar, met or not."""
    out: list[dict[str, Any]] = []

    def add(what: str, value: float | None, bar: float, higher_is_better: bool) -> None:
        if value is None:
            return
        met = value >= bar if higher_is_better else value <= bar
        out.append({"bar": what, "value": value, "limit": bar, "met": met})

    for (network, dataset, loader), r in sorted(rat.items()):
        if dataset.endswith("/gil"):
            continue  # the GIL runs do Python work per batch: they are not throughput runs
        if network == "paced":
            continue  # the first bars had no paced network; its bar there is bench.harness.bars' 7
        tag = f"{network}/{dataset}/{loader}"
        if network == "shaped":
            add(f"{tag}: ÷ baseline", r["vs_baseline"], BAR_VS_BASELINE, True)
            if dataset in ("large", "medium"):
                add(f"{tag}: ÷ ceiling", r["vs_ceiling"], BAR_VS_CEILING, True)
        else:
            limit = BAR_VS_CEILING_SMALL_LOOPBACK if dataset == "small" else BAR_VS_CEILING
            add(f"{tag}: ÷ ceiling", r["vs_ceiling"], limit, True)
        add(f"{tag}: trainer CPU/GB ÷ floor", r["cpu_vs_floor"], BAR_CPU_VS_FLOOR, False)
        rss = summary[(network, dataset, loader)]["daemon_rss_peak_mib"]
        add(f"{tag}: daemon peak RSS MiB", rss, BAR_DAEMON_RSS_MIB, False)
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def table(summary: dict[Key, dict[str, Any]], rat: dict[Key, dict[str, float | None]]) -> str:
    """A Markdown table (readable on a terminal too): one row per network/dataset/loader."""
    head = (
        "| network | dataset | loader | MB/s | steady MB/s | rec/s | trainer CPU s/GB "
        "| steady trainer CPU s/GB | daemon CPU s/GB "
        "| daemon RSS MiB | RAM disk MiB | 1st batch s | py work ms | step ms "
        "| ÷ceiling | ÷baseline | CPU÷floor | steady CPU÷floor | work÷floor |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = {name: i for i, name in enumerate(LOADERS)}
    keys = sorted(summary, key=lambda k: (k[0], k[1], order.get(k[2], 99)))
    for key in keys:
        row = summary[key]
        r = rat.get(key, {})
        lines.append(
            "| "
            + " | ".join(
                [
                    *key,
                    _fmt(row["mb_s"], 0),
                    _fmt(row["steady_mb_s"], 0),
                    _fmt(row["records_s"], 0),
                    _fmt(row["trainer_cpu_s_per_gb"], 2),
                    _fmt(row["trainer_cpu_steady_s_per_gb"], 2),
                    _fmt(row["daemon_cpu_s_per_gb"], 2),
                    _fmt(row["daemon_rss_peak_mib"], 0),
                    _fmt(row["ram_peak_mib"], 0),
                    _fmt(row["first_batch_s"], 2),
                    _fmt(row["work_ms_median"], 2),
                    _fmt(row["step_ms_median"], 2),
                    _fmt(r.get("vs_ceiling"), 2),
                    _fmt(r.get("vs_baseline"), 2),
                    _fmt(r.get("cpu_vs_floor"), 2),
                    _fmt(r.get("steady_cpu_vs_floor"), 2),
                    _fmt(r.get("work_vs_floor"), 2),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


CPU_LOADERS = ("ceiling", "ceiling-crt", *PREFETCHD, "lean")


def cpu_table(summary: dict[Key, dict[str, Any]]) -> str:
    """The daemon's CPU beside the ceilings' and the lean limit's, per network and dataset:
    total CPU/GB, start-up CPU to the first GET, the data path's (the rest) per GB, per object,
    per record and per file, ``prefetchd status``'s wall time, peak RSS."""
    head = (
        "| network | dataset | loader | MB/s | CPU s/GB | start-up CPU s | data CPU s/GB "
        "| data CPU ms/object | data CPU µs/record | data CPU µs/file | status s | RSS MiB |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = {name: i for i, name in enumerate(CPU_LOADERS)}
    keys = [k for k in summary if k[2] in order]
    for key in sorted(keys, key=lambda k: (k[0], k[1], order.get(k[2], 99))):
        row = summary[key]
        cells = [
            _fmt(row["mb_s"], 0),
            _fmt(row["daemon_cpu_s_per_gb"], 2),
            _fmt(row["startup_cpu_s"], 2),
            _fmt(row["data_cpu_s_per_gb"], 2),
            _fmt(row["data_cpu_ms_per_object"], 3),
            _fmt(row["data_cpu_us_per_record"], 1),
            _fmt(row["data_cpu_us_per_file"], 1),
            _fmt(row["status_s"], 2),
            _fmt(row["daemon_rss_peak_mib"], 0),
        ]
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    return "\n".join(lines)


def bars_text(checked: list[dict[str, Any]]) -> str:
    lines = []
    for b in checked:
        sign = "≥" if b["bar"].endswith(("baseline", "ceiling")) else "≤"
        verdict = "met" if b["met"] else "MISSED"
        lines.append(f"- {verdict}: {b['bar']} = {b['value']:.2f} (bar {sign} {b['limit']:g})")
    return "\n".join(lines)


def plot(summary: dict[Key, dict[str, Any]], path: str, title: str) -> None:
    """Bar charts of MB/s and trainer CPU s/GB per dataset, one panel per network."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = sorted({k[0] for k in summary})
    datasets = [d for d in DATASETS if any(k[1] == d for k in summary)]
    fig, axes = plt.subplots(2, len(networks), figsize=(6.5 * len(networks), 7.5), squeeze=False)
    width = 0.8 / len(LOADERS)
    for col, network in enumerate(networks):
        for row, (metric, label) in enumerate(
            (("mb_s", "delivered MB/s"), ("trainer_cpu_s_per_gb", "trainer CPU s/GB"))
        ):
            ax = axes[row][col]
            for i, loader in enumerate(LOADERS):
                values = [
                    (summary.get((network, d, loader)) or {}).get(metric) or 0.0 for d in datasets
                ]
                xs = [j + (i - len(LOADERS) / 2 + 0.5) * width for j in range(len(datasets))]
                ax.bar(xs, values, width, label=loader)
            ax.set_xticks(range(len(datasets)), datasets)
            ax.set_ylabel(label)
            ax.set_title(f"{network}: {label}")
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(
    meta: dict[str, Any],
    table_text: str,
    bars_list: list[dict[str, Any]],
    *sections: str,
) -> str:
    """The results section of docs/benchmarks.md: machine, versions, command, load, table,
    the first bars, then ``sections`` (the CPU table, the bars table) as given."""
    m = meta["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items()))
    load0 = " ".join(f"{x:.2f}" for x in meta["load_at_start"])
    load1 = " ".join(f"{x:.2f}" for x in meta.get("load_at_end", meta["load_at_start"]))
    sizes = ", ".join(
        f"{name}: {d['objects']} objects, {d['bytes'] / 2**20:.0f} MiB, {d['records']} records"
        for name, d in meta.get("datasets", {}).items()
    )
    return "\n".join(
        [
            f"- **When**: {meta['started']}; load average (1/5/15 min) {load0} at the start, "
            f"{load1} at the end",
            f"- **Machine**: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
            f"Linux {m['kernel']}, Python {m['python']}",
            f"- **Versions**: {versions}",
            f"- **Store**: {meta['store']} on 127.0.0.1; networks: {', '.join(meta['networks'])}"
            f" ({network_note(meta)})",
            f"- **Datasets**: {sizes}",
            f"- **Layout**: {layout_note(meta)}; {meta.get('repeats', '?')} repeats",
            f"- **Command**: `{meta['command']}`",
            "",
            table_text,
            "",
            bars_text(bars_list),
            *(part for section in sections for part in ("", section)),
        ]
    )


def repeats(meta: dict[str, Any], runs: Sequence[dict[str, Any]]) -> int:
    """The repeats a run asked for; from a run before they were recorded, as its plan numbered
    them."""
    if meta.get("repeats") is not None:
        return int(meta["repeats"])
    return 1 + max((int(r.get("repeat", 0)) for r in runs), default=0)


def layout_note(meta: dict[str, Any]) -> str:
    """The daemon's layout (``bench.harness.layout``), from the run's metadata; a run from
    before the layouts were recorded had the bench's, with its cache where ``cache_dir`` said."""
    layout = meta.get("layout")
    if isinstance(layout, dict):
        return str(layout["text"])
    cache = meta.get("cache_dir", "tmpfs")
    return f"bench (download.cache_dir on {cache}; output.writers 2, download.concurrency 32)"


def network_note(meta: dict[str, Any]) -> str:
    """What the shaped and paced networks were, from the run's metadata."""
    notes = []
    if "shaped" in meta.get("networks", []):
        notes.append(f"shaped = {meta['rate_mbit']} Mbit/s per connection")
    if "paced" in meta.get("networks", []):
        notes.append(
            f"paced = {meta.get('paced_rate_mib')} MiB/s per connection and "
            f"{meta.get('paced_first_byte_ms')} ms before each response's first byte"
        )
    if meta.get("host_network"):
        notes.append("on the host's loopback, no private namespace")
    return "; ".join(notes) or "loopback unshaped"
