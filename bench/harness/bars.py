"""The bars of the issue "the data path at the machine's limit", checked against a run's medians.

Each bar is a row of ``BARS``: its number, what it compares, its threshold and which way is
better. ``check(summary)`` computes every bar the run can answer, for each prefetchd variant
(``download.client`` classic and crt), from the medians of ``bench.harness.report.summarize``:

1. data-path CPU/GB (daemon CPU after its first GET) ÷ ceiling-crt's (its CPU after its first
   GET), loopback, on ``CPU_PER_GB_DATASETS``: ≤ 1.5;
2. data-path CPU per object ÷ ceiling-crt's, loopback, on ``small``: ≤ 2;
3. data-path CPU per record, loopback, on ``lines``, and per member file on ``tarsmall``
   (``tar``'s 10-60 KiB images cost more than that per file in the ceiling alone): ≤ 2 µs;
4. delivered MB/s ÷ the lean design limit's, loopback, on ``tfrecord16``: ≥ 0.85;
5. trainer CPU/GB ÷ the lean trainer's (where lean ran) and ÷ the floor's, loopback: ≤ 1.25;
6. start-up CPU (``prefetchd run`` to its first GET), loopback: ≤ 1 CPU-s; ``prefetchd
   status`` wall time, measured in the GIL runs: ≤ 0.3 s;
7. delivered MB/s, time to first batch included, ÷ the in-trainer baseline's, paced network:
   ≥ 2.5 on ``large`` and ``medium``, ≥ 8 on ``small``;
8. daemon peak RSS, every network: ≤ 400 MiB.

A bar whose inputs were not measured is listed with no value ("not measured"), so a run shows
what it could not judge. Pure: no I/O, unit-tested in ``tests/unit/bench``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.harness.contenders import PREFETCHD

Key = tuple[str, str, str]  # (network, dataset, loader)
Summary = dict[Key, dict[str, Any]]

LOOPBACK, PACED = "loopback", "paced"
CPU_PER_GB_DATASETS = ("tfrecord16", "medium")
PER_RECORD = {"lines": "data_cpu_us_per_record", "tarsmall": "data_cpu_us_per_file"}
PACED_LIMITS = {"large": 2.5, "medium": 2.5, "small": 8.0}


@dataclass(frozen=True)
class Bar:
    number: int
    what: str
    limit: float
    higher_is_better: bool

    def verdict(self, value: float | None) -> bool | None:
        """Met (True), missed (False) or not measured (None)."""
        if value is None:
            return None
        return value >= self.limit if self.higher_is_better else value <= self.limit


CPU_GB = Bar(1, "daemon data-path CPU/GB ÷ ceiling-crt's", 1.5, False)
CPU_OBJECT = Bar(2, "daemon data-path CPU per object ÷ ceiling-crt's", 2.0, False)
CPU_RECORD = Bar(3, "daemon data-path CPU µs per record", 2.0, False)
CPU_FILE = Bar(3, "daemon data-path CPU µs per tar member file", 2.0, False)
VS_LEAN = Bar(4, "MB/s ÷ lean design limit's", 0.85, True)
TRAINER_VS_LEAN = Bar(5, "trainer CPU/GB ÷ lean trainer's", 1.25, False)
TRAINER_VS_FLOOR = Bar(5, "trainer CPU/GB ÷ floor's", 1.25, False)
STARTUP = Bar(6, "start-up CPU-s to the first GET", 1.0, False)
STATUS = Bar(6, "`prefetchd status` wall s", 0.3, False)
PACED_BARS = {
    name: Bar(7, "MB/s ÷ in-trainer baseline's (1st batch in)", limit, True)
    for name, limit in PACED_LIMITS.items()
}
RSS = Bar(8, "daemon peak RSS MiB", 400.0, False)
BARS: tuple[Bar, ...] = (
    *(CPU_GB, CPU_OBJECT, CPU_RECORD, CPU_FILE, VS_LEAN, TRAINER_VS_LEAN, TRAINER_VS_FLOOR),
    *(STARTUP, STATUS, *PACED_BARS.values(), RSS),
)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def check(summary: Summary) -> list[dict[str, Any]]:
    """Every bar this run can speak to, for every prefetchd row, in bar order."""
    rows = [row for key in sorted(summary) if key[2] in PREFETCHD for row in _rows(summary, key)]
    return sorted(rows, key=lambda r: r["number"])


def _rows(summary: Summary, key: Key) -> Iterator[dict[str, Any]]:
    network, dataset, loader = key
    row = summary[key]

    def other(name: str, metric: str) -> Any:
        return (summary.get((network, dataset, name)) or {}).get(metric)

    def out(bar: Bar, value: float | None) -> dict[str, Any]:
        where = f"{network}/{dataset}/{loader}"
        return {"number": bar.number, "bar": bar.what, "where": where, "value": value,
                "limit": bar.limit, "higher_is_better": bar.higher_is_better,
                "met": bar.verdict(value)}  # fmt: skip

    if dataset.endswith("/gil"):
        if row.get("status_s") is not None or network == LOOPBACK:
            yield out(STATUS, row.get("status_s"))
        return
    if network == LOOPBACK:
        yield from _loopback_rows(row, dataset, other, out)
    if network == PACED and dataset in PACED_BARS:
        yield out(PACED_BARS[dataset], ratio(row["mb_s"], other("baseline", "mb_s")))
    yield out(RSS, row.get("daemon_rss_peak_mib"))


def _loopback_rows(row: dict[str, Any], dataset: str, other: Any, out: Any) -> Iterator[Any]:
    """Bars 1-6 (but status) of one prefetchd row on the loopback network."""
    if dataset in CPU_PER_GB_DATASETS:
        metric = "data_cpu_s_per_gb"
        yield out(CPU_GB, ratio(row.get(metric), other("ceiling-crt", metric)))
    if dataset == "small":
        metric = "data_cpu_ms_per_object"
        yield out(CPU_OBJECT, ratio(row.get(metric), other("ceiling-crt", metric)))
    if dataset in PER_RECORD:
        yield out(CPU_RECORD if dataset == "lines" else CPU_FILE, row.get(PER_RECORD[dataset]))
    if dataset == "tfrecord16":
        yield out(VS_LEAN, ratio(row["mb_s"], other("lean", "mb_s")))
    lean_cpu = other("lean", "trainer_cpu_s_per_gb")
    if lean_cpu is not None or dataset == "tfrecord16":
        yield out(TRAINER_VS_LEAN, ratio(row.get("trainer_cpu_s_per_gb"), lean_cpu))
    floor_cpu = other("floor", "trainer_cpu_s_per_gb")
    yield out(TRAINER_VS_FLOOR, ratio(row.get("trainer_cpu_s_per_gb"), floor_cpu))
    yield out(STARTUP, row.get("startup_cpu_s"))


def _value(row: dict[str, Any]) -> str:
    value = row["value"]
    if value is None:
        return "not measured"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The bars as a Markdown table: bar, where, value, threshold, met or MISSED."""
    lines = ["| # | bar | network/dataset/loader | value | threshold | verdict |"]
    lines.append("|---|---|---|---|---|---|")
    for r in rows:
        sign = "≥" if r["higher_is_better"] else "≤"
        verdict = {True: "met", False: "**MISSED**", None: "-"}[r["met"]]
        cells = [str(r["number"]), r["bar"], r["where"], _value(r), f"{sign} {r['limit']:g}"]
        lines.append("| " + " | ".join([*cells, verdict]) + " |")
    met = sum(1 for r in rows if r["met"])
    judged = sum(1 for r in rows if r["met"] is not None)
    lines.append("")
    lines.append(f"{met} of {judged} bars met ({len(rows) - judged} not measured).")
    return "\n".join(lines)
