"""Where a benchmark's numbers go: ``results.json`` (rewritten after every run, so an interrupted
benchmark keeps what it measured), ``results.md``, ``plot.png`` and, on stdout, the table, the
daemon's CPU beside the ceilings' and the lean limit's, and the bars table last. The arithmetic
is ``bench.harness.report``'s and ``bench.harness.bars``'s."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from bench.harness import bars as issue_bars
from bench.harness import report as arithmetic
from bench.harness.environment import has


def write_json(out: Path, meta: dict[str, Any], runs: list[dict[str, Any]], **more: Any) -> None:
    """``out/results.json``: the run's metadata, every run so far and ``more``; atomically."""
    import json

    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps({**meta, "runs": runs, **more}, indent=1, default=str) + "\n")
    os.replace(tmp, out / "results.json")


def report(runs: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> int:
    """Summarize, write every output, print the table and the bars; 1 if any run failed."""
    summary = arithmetic.summarize(runs)
    rat = arithmetic.ratios(summary)
    checked = arithmetic.bars(summary, rat)
    bars = issue_bars.check(runs)
    issue = issue_bars.issue_rows(runs)
    meta.setdefault("load_at_end", os.getloadavg())
    meta["repeats"] = arithmetic.repeats(meta, runs)
    write_json(
        out,
        meta,
        runs,
        summary=[{"key": list(k), **v} for k, v in summary.items()],
        ratios=[{"key": list(k), **v} for k, v in rat.items()],
        bars=checked,
        issue_bars=bars,
        issue_28=issue,
    )
    text = arithmetic.table(summary, rat)
    cpu = "### Daemon CPU beside the ceilings' and the lean limit's\n\n" + arithmetic.cpu_table(
        summary
    )
    head = bars_header(meta)
    bars_section = f"### The bars\n\n{head}\n\n" + issue_bars.table(bars)
    issue_section = f"### Issue 28's table\n\n{head}\n\n" + issue_bars.issue_table(issue)
    md = arithmetic.markdown(meta, text, checked, cpu, bars_section, issue_section)
    (out / "results.md").write_text(md + "\n")
    plotted = write_plot(summary, meta, out)
    first_bars = (
        "The first bars (loopback, shaped; medians only, the judged bars are below):\n"
        + arithmetic.bars_text(checked)
    )
    medians = f"Layout: {arithmetic.layout_note(meta)}. Medians of {meta['repeats']} repeat(s)."
    for part in (medians, text, first_bars, cpu, bars_section, issue_section):
        print("\n" + part)
    failed = [r for r in runs if r.get("error")]
    print(
        f"\n{len(runs) - len(failed)} runs ok, {len(failed)} failed; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; results in {out}/"
        f"results.json, results.md{', plot.png' if plotted else ''}"
    )
    return 1 if failed else 0


def bars_header(meta: dict[str, Any]) -> str:
    """The line above the bars' tables: the daemon's layout and the repeats judged."""
    repeats = meta.get("repeats", "?")
    runs = "1 repeat" if repeats == 1 else f"{repeats} repeats"
    return (
        f"Layout: {arithmetic.layout_note(meta)}. Median and worst of {runs}, ratios paired "
        "repeat by repeat."
    )


def write_plot(summary: dict[Any, dict[str, Any]], meta: dict[str, Any], out: Path) -> bool:
    """``plot.png``, if matplotlib is there (else a message); whether it was written."""
    if not has("matplotlib"):
        print("\nno plot.png: matplotlib is not installed (pip install matplotlib)")
        return False
    title = (
        f"prefetchd bench, {meta['store']}, {meta['machine']['cores']} cores, "
        f"load {meta['load_at_start'][0]:.2f}→{meta['load_at_end'][0]:.2f}"
    )
    with contextlib.suppress(Exception):
        arithmetic.plot(summary, str(out / "plot.png"), title)
        return True
    return False


def rerender(results_json: Path) -> int:
    """``--report``: the table, results.md and plot again from a saved results.json."""
    import json

    saved = json.loads(results_json.read_text())
    runs = saved.pop("runs")
    for key in ("summary", "ratios", "bars", "issue_bars", "issue_28"):
        saved.pop(key, None)
    return report(runs, saved, results_json.parent)
