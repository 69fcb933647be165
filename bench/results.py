"""Where a benchmark's numbers go: ``results.json`` (rewritten after every run, so an interrupted
benchmark keeps what it measured), ``results.md``, ``plot.png`` and the table on stdout. The
arithmetic is ``bench.report``'s."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from bench import report as arithmetic


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
    meta.setdefault("load_at_end", os.getloadavg())
    write_json(
        out,
        meta,
        runs,
        summary=[{"key": list(k), **v} for k, v in summary.items()],
        ratios=[{"key": list(k), **v} for k, v in rat.items()],
        bars=checked,
    )
    text = arithmetic.table(summary, rat)
    (out / "results.md").write_text(arithmetic.markdown(meta, text, checked) + "\n")
    title = (
        f"prefetchd bench, {meta['store']}, {meta['machine']['cores']} cores, "
        f"load {meta['load_at_start'][0]:.2f}→{meta['load_at_end'][0]:.2f}"
    )
    with contextlib.suppress(Exception):
        arithmetic.plot(summary, str(out / "plot.png"), title)
    print()
    print(text)
    print()
    print(arithmetic.bars_text(checked))
    failed = [r for r in runs if r.get("error")]
    print(
        f"\n{len(runs) - len(failed)} runs ok, {len(failed)} failed; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; results in {out}/"
        "results.json, results.md, plot.png"
    )
    return 1 if failed else 0


def rerender(results_json: Path) -> int:
    """``--report``: the table, results.md and plot again from a saved results.json."""
    import json

    saved = json.loads(results_json.read_text())
    runs = saved.pop("runs")
    for key in ("summary", "ratios", "bars"):
        saved.pop(key, None)
    return report(runs, saved, results_json.parent)
