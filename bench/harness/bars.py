"""The bars of the data path (issues "the data path at the machine's limit" and 28, "the data
path with margin"), judged on every repeat of a run: the median and the worst run.

Each bar is a row of ``BARS``: its number, what it measures (worded as the issues word it), the
metric of the prefetchd run, the contender it is divided by if it is a ratio, where it applies
(networks, datasets), its threshold and which way is better. ``check(runs)`` judges every bar
the runs can answer, for each prefetchd variant (``download.client`` classic and crt):

- a **ratio** is computed per repeat: repeat r of prefetchd ÷ repeat r of its baseline or
  ceiling, which ran next to it in the interleaved plan (``bench.harness.runner.plan_runs``),
  then summarised; the worst is the worst of these paired ratios, not a ratio of extremes;
- a bar is **met** when the median meets it and the worst run is within ``MARGIN`` (10 %) of it:
  ≥ 8 needs a median ≥ 8 and a worst ≥ 7.2, ≤ 2 a median ≤ 2 and a worst ≤ 2.2. A median
  that meets it with a worst outside the margin is a miss ("met by median, worst outside
  10 %"); a bar whose inputs were not measured says so ("not measured").

The bars:

1. data-path CPU/GB (daemon CPU after its first GET) ÷ ceiling-crt's (its CPU after its first
   GET), loopback, on ``tfrecord16`` (64 KiB TFRecord records) and ``medium``: ≤ 1.5;
2. data-path CPU per object ÷ ceiling-crt's, loopback, on ``small``: ≤ 2; and absolute, on
   loopback and behind the paced network: ≤ 0.4 ms;
3. data-path CPU per record, loopback, on ``lines``, and per member file on ``tarsmall``: ≤ 2 µs;
4. delivered MB/s ÷ the lean design limit's, loopback, on ``tfrecord16``: ≥ 0.85;
5. trainer CPU/GB ÷ the lean trainer's (TFRecord datasets): ≤ 1.1; ÷ the floor's: ≤ 1.25;
6. start-up CPU (``prefetchd run`` to its first GET), loopback: ≤ 1 CPU-s; ``prefetchd
   status`` wall time, measured in the GIL runs: ≤ 0.3 s;
7. behind the paced network: steady-state MB/s (after the first batch) ÷ the in-trainer
   baseline's, ≥ 2.5 on ``tfrecord16`` and ≥ 8 on ``small``, where the steady samples/s must
   also reach 800; MB/s with the first batch in ÷ the baseline's, ≥ 2.5 on ``large`` and
   ``medium``;
8. daemon peak RSS, every network: ≤ 400 MiB.

``ISSUE_TABLE`` is issue 28's table, row by row; ``issue_table`` prints it from the judged rows.
Pure: no I/O, unit-tested in ``tests/unit/bench``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness.contenders import PREFETCHD
from bench.harness.datasets import BY_NAME as DATASETS
from bench.harness.report import with_steady

Key = tuple[str, str, str]  # (network, dataset, loader)

LOOPBACK, PACED = "loopback", "paced"
GIL = "/gil"
MARGIN = 0.10  # the worst run may miss a bar by this fraction of it
MET, MISSED, MISSED_WORST, NOT_MEASURED = "met", "MISSED", "MISSED (worst)", "not measured"
VERDICT_TEXT = {
    MET: "met",
    MISSED: "**MISSED**",
    MISSED_WORST: "**MISSED**: met by median, worst outside 10 %",
    NOT_MEASURED: "not measured",
}
TFRECORD = tuple(name for name, d in DATASETS.items() if d.kind == "tfrecord")


@dataclass(frozen=True)
class Bar:
    """One bar: what it measures on which runs, its threshold and which way is better."""

    number: int
    what: str
    limit: float
    higher_is_better: bool
    metric: str  # of the prefetchd run
    networks: tuple[str, ...] | None = (LOOPBACK,)  # None: every network
    datasets: tuple[str, ...] | None = None  # None: every dataset
    versus: str | None = None  # a ratio to this contender's run of the same repeat
    gil: bool = False  # judged on the GIL runs (``<dataset>/gil``) instead of the others

    def applies(self, network: str, dataset: str) -> bool:
        """Whether this bar judges a prefetchd run on ``network`` and ``dataset``."""
        if dataset.endswith(GIL) != self.gil:
            return False
        name = dataset.removesuffix(GIL)
        return (self.networks is None or network in self.networks) and (
            self.datasets is None or name in self.datasets
        )

    def edge(self) -> float:
        """What the worst run must reach: the threshold with ``MARGIN`` of slack."""
        return self.limit * (1 - MARGIN if self.higher_is_better else 1 + MARGIN)

    def meets(self, value: float, limit: float) -> bool:
        return value >= limit if self.higher_is_better else value <= limit

    def worst(self, values: Sequence[float]) -> float:
        return min(values) if self.higher_is_better else max(values)


CPU_GB = Bar(
    1,
    "daemon CPU per GB ÷ the crt ceiling's",
    1.5,
    False,
    "data_cpu_s_per_gb",
    datasets=("tfrecord16", "medium"),
    versus="ceiling-crt",
)
CPU_OBJECT = Bar(
    2,
    "daemon CPU per small object ÷ the ceiling's",
    2.0,
    False,
    "data_cpu_ms_per_object",
    datasets=("small",),
    versus="ceiling-crt",
)
CPU_OBJECT_MS = Bar(
    2,
    "daemon CPU ms per small object",
    0.4,
    False,
    "data_cpu_ms_per_object",
    networks=(LOOPBACK, PACED),
    datasets=("small",),
)
CPU_RECORD = Bar(
    3, "daemon CPU µs per record", 2.0, False, "data_cpu_us_per_record", datasets=("lines",)
)
CPU_FILE = Bar(
    3,
    "daemon CPU µs per tar member file",
    2.0,
    False,
    "data_cpu_us_per_file",
    datasets=("tarsmall",),
)
VS_LEAN = Bar(
    4, "MB/s ÷ the lean design limit's", 0.85, True, "mb_s", datasets=("tfrecord16",), versus="lean"
)
TRAINER_VS_LEAN = Bar(
    5,
    "trainer CPU per GB ÷ the lean trainer's",
    1.1,
    False,
    "trainer_cpu_s_per_gb",
    datasets=TFRECORD,
    versus="lean",
)
TRAINER_VS_FLOOR = Bar(
    5, "trainer CPU per GB ÷ the floor's", 1.25, False, "trainer_cpu_s_per_gb", versus="floor"
)
STARTUP = Bar(6, "start-up CPU-s to the first GET", 1.0, False, "startup_cpu_s")
STATUS = Bar(6, "`prefetchd status` wall s", 0.3, False, "status_s", networks=None, gil=True)
PACED_STEADY = {
    name: Bar(
        7,
        "steady-state MB/s ÷ the in-trainer baseline's",
        limit,
        True,
        "steady_mb_s",
        networks=(PACED,),
        datasets=(name,),
        versus="baseline",
    )
    for name, limit in (("tfrecord16", 2.5), ("small", 8.0))
}
PACED_SAMPLES = Bar(
    7,
    "steady-state samples/s",
    800.0,
    True,
    "steady_records_s",
    networks=(PACED,),
    datasets=("small",),
)
PACED_FIRST_BATCH = Bar(
    7,
    "MB/s (1st batch in) ÷ the in-trainer baseline's",
    2.5,
    True,
    "mb_s",
    networks=(PACED,),
    datasets=("large", "medium"),
    versus="baseline",
)
RSS = Bar(8, "daemon peak RSS MiB", 400.0, False, "daemon_rss_peak_mib", networks=None)
BARS: tuple[Bar, ...] = (
    *(CPU_GB, CPU_OBJECT, CPU_OBJECT_MS, CPU_RECORD, CPU_FILE, VS_LEAN),
    *(TRAINER_VS_LEAN, TRAINER_VS_FLOOR, STARTUP, STATUS),
    *(*PACED_STEADY.values(), PACED_SAMPLES, PACED_FIRST_BATCH, RSS),
)
# Issue 28's table, row by row: its words, then the bars (and where) that answer it.
X = "\u00d7"  # the issue's multiplication sign
ISSUE_TABLE: tuple[tuple[str, tuple[tuple[Bar, str, str], ...]], ...] = (
    (
        f"behind 75 MiB/s per connection + 30 ms per request, 96 {X} 16 MiB TFRecords, "
        f"steady state ≥ 2.5{X}",
        ((PACED_STEADY["tfrecord16"], PACED, "tfrecord16"),),
    ),
    (
        f"same network, 3,000 raw objects of 96-160 KiB, steady state ≥ 8{X} (and ≥ 800 samples/s)",
        ((PACED_STEADY["small"], PACED, "small"), (PACED_SAMPLES, PACED, "small")),
    ),
    (
        f"daemon CPU per GB, 64 KiB TFRecord records ≤ 1.5{X} the crt ceiling's",
        ((CPU_GB, LOOPBACK, "tfrecord16"),),
    ),
    (
        f"daemon CPU per small object ≤ 2{X} the ceiling's (and ≤ 0.4 ms absolute)",
        (
            (CPU_OBJECT, LOOPBACK, "small"),
            (CPU_OBJECT_MS, LOOPBACK, "small"),
            (CPU_OBJECT_MS, PACED, "small"),
        ),
    ),
    (
        f"loopback 16 MiB TFRecords ≥ 0.85{X} the lean design limit",
        ((VS_LEAN, LOOPBACK, "tfrecord16"),),
    ),
    (
        f"trainer CPU per GB ≤ 1.1{X} the lean trainer's",
        ((TRAINER_VS_LEAN, LOOPBACK, "tfrecord16"),),
    ),
)


def by_repeat(runs: Iterable[dict[str, Any]]) -> dict[Key, dict[int, dict[str, Any]]]:
    """Every run by (network, dataset, loader) and repeat, with its steady-state rates; a
    failed run stays in, with no metrics but its error, so its repeat counts as not measured."""
    out: dict[Key, dict[int, dict[str, Any]]] = {}
    for run in runs:
        key = (run["network"], run["dataset"], run["loader"])
        row = {"error": run["error"]} if run.get("error") else with_steady(run)
        out.setdefault(key, {})[int(run.get("repeat", 0))] = row
    return out


def per_repeat(
    bar: Bar, mine: dict[int, dict[str, Any]], theirs: dict[int, dict[str, Any]]
) -> list[float]:
    """The bar's value in every repeat both ran: the prefetchd run's metric, or its ratio to
    the ``versus`` run of the same repeat (pure)."""
    values = []
    for repeat in sorted(mine):
        value = mine[repeat].get(bar.metric)
        if value is None:
            continue
        if bar.versus is not None:
            other = theirs.get(repeat, {}).get(bar.metric)
            if other is None or other == 0:
                continue
            value = value / other
        values.append(float(value))
    return values


def judge(bar: Bar, values: Sequence[float]) -> tuple[float | None, float | None, str]:
    """The median, the worst and the verdict: met when the median meets the bar and the worst
    is within ``MARGIN`` of it (pure)."""
    if not values:
        return None, None, NOT_MEASURED
    median, worst = statistics.median(values), bar.worst(values)
    if not bar.meets(median, bar.limit):
        return median, worst, MISSED
    if not bar.meets(worst, bar.edge()):
        return median, worst, MISSED_WORST
    return median, worst, MET


def row(bar: Bar, key: Key, grouped: dict[Key, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """One judged bar on one prefetchd run's repeats (pure)."""
    network, dataset, loader = key
    mine = grouped.get(key, {})
    theirs = grouped.get((network, dataset, bar.versus), {}) if bar.versus else {}
    values = per_repeat(bar, mine, theirs)
    median, worst, verdict = judge(bar, values)
    return {
        "number": bar.number,
        "bar": bar.what,
        "where": f"{network}/{dataset}/{loader}",
        "versus": bar.versus,
        "values": values,
        "repeats": len(mine),
        "median": median,
        "worst": worst,
        "limit": bar.limit,
        "edge": bar.edge(),
        "higher_is_better": bar.higher_is_better,
        "verdict": verdict,
        "met": None if verdict == NOT_MEASURED else verdict == MET,
    }


def check(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every bar that applies to a prefetchd variant's runs, in bar order (pure)."""
    grouped = by_repeat(runs)
    rows = [
        row(bar, key, grouped)
        for bar in BARS
        for key in sorted(grouped)
        if key[2] in PREFETCHD and bar.applies(key[0], key[1])
    ]
    return sorted(rows, key=lambda r: r["number"])


def _value(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"


def _cells(r: dict[str, Any]) -> list[str]:
    """Median, worst, paired repeats, threshold (and the worst's edge), verdict."""
    sign = "≥" if r["higher_is_better"] else "≤"
    limit = f"{sign} {r['limit']:g} (worst {sign} {r['edge']:.3g})"
    runs = f"{len(r['values'])}/{r['repeats']}"
    return [_value(r["median"]), _value(r["worst"]), runs, limit, VERDICT_TEXT[r["verdict"]]]


def _count(rows: Sequence[dict[str, Any]]) -> str:
    met = sum(1 for r in rows if r["met"])
    judged = sum(1 for r in rows if r["met"] is not None)
    return (
        f"{met} of {judged} bars met ({len(rows) - judged} not measured); met = the median "
        f"meets the bar and the worst run is within {MARGIN * 100:.0f} % of it."
    )


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Every judged bar as a Markdown table: median, worst, runs, threshold, verdict."""
    lines = [
        "| # | bar | network/dataset/loader | median | worst | runs | threshold | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [str(r["number"]), r["bar"], r["where"], *_cells(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", _count(rows)])


def issue_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 28's table from the runs: each of its rows' bars, for every prefetchd variant that
    ran, in the issue's order; a row whose dataset or network did not run is "not measured"."""
    grouped = by_repeat(runs)
    loaders = sorted({key[2] for key in grouped if key[2] in PREFETCHD})
    out = []
    for words, judged in ISSUE_TABLE:
        for bar, network, dataset in judged:
            for loader in loaders:
                out.append({"issue_row": words, **row(bar, (network, dataset, loader), grouped)})
    return out


def issue_table(rows: Sequence[dict[str, Any]]) -> str:
    """Issue 28's table, as a Markdown table: the issue's row, then each bar answering it."""
    lines = [
        "| issue 28's bar | measured | network/dataset/loader | median | worst | runs "
        "| threshold | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    previous = None
    for r in rows:
        words = r["issue_row"] if r["issue_row"] != previous else ""  # the same row again
        previous = r["issue_row"]
        lines.append("| " + " | ".join([words, r["bar"], r["where"], *_cells(r)]) + " |")
    return "\n".join([*lines, "", _count(rows)])
