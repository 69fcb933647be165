"""The benchmark's pure parts: medians, ratios, the issue's bars, the run order, tc script."""

from __future__ import annotations

from typing import Any

from bench.drivers import readers
from bench.harness import network, report, runner
from bench.studies import sweep
from prefetchd.kernel.framing import frame


def run(loader: str, mb_s: float, cpu: float | None = None, **more: Any) -> dict[str, Any]:
    return {
        "network": "shaped",
        "dataset": "large",
        "loader": loader,
        "mb_s": mb_s,
        "trainer_cpu_s_per_gb": cpu,
        **more,
    }


def test_summary_takes_the_median_of_repeats_and_ignores_failed_runs() -> None:
    runs = [
        run("baseline", 60),
        run("baseline", 80),
        run("baseline", 70),
        run("baseline", 1000, error="boom"),
    ]
    row = report.summarize(runs)[("shaped", "large", "baseline")]
    assert row["mb_s"] == 70
    assert row["runs"] == 3


def test_ratios_compare_prefetchd_with_ceiling_baseline_and_floor() -> None:
    runs = [
        run("ceiling", 400),
        run("baseline", 80, cpu=20.0),
        run("prefetchd", 360, cpu=2.4, daemon_rss_peak_mib=150.0),
        run("floor", 900, cpu=2.0),
    ]
    summary = report.summarize(runs)
    r = report.ratios(summary)[("shaped", "large", "prefetchd")]
    assert r["vs_ceiling"] == 0.9
    assert r["vs_baseline"] == 4.5
    assert r["cpu_vs_floor"] == 1.2
    assert r["vs_s3fs"] is None  # not measured: no ratio rather than a made-up one


def test_bars_name_what_was_missed() -> None:
    runs = [
        run("ceiling", 400),
        run("baseline", 150, cpu=20.0),
        run("prefetchd", 360, cpu=3.0, daemon_rss_peak_mib=450.0),
        run("floor", 900, cpu=2.0),
    ]
    summary = report.summarize(runs)
    checked = {b["bar"]: b["met"] for b in report.bars(summary, report.ratios(summary))}
    assert checked == {
        "shaped/large/prefetchd: ÷ baseline": False,  # 2.4 < 3
        "shaped/large/prefetchd: ÷ ceiling": True,  # 0.9 >= 0.8
        "shaped/large/prefetchd: trainer CPU/GB ÷ floor": False,  # 1.5 > 1.25
        "shaped/large/prefetchd: daemon peak RSS MiB": False,  # 450 > 400
    }


def test_loopback_small_objects_have_their_own_ceiling_bar() -> None:
    runs = [
        {**run("ceiling", 100), "network": "loopback", "dataset": "small"},
        {**run("prefetchd", 65), "network": "loopback", "dataset": "small"},
    ]
    summary = report.summarize(runs)
    (bar,) = report.bars(summary, report.ratios(summary))
    assert bar["limit"] == 0.6 and bar["met"]


def test_table_has_one_row_per_loader_in_a_fixed_order() -> None:
    runs = [run("floor", 900, cpu=2.0), run("prefetchd", 360, cpu=2.4), run("ceiling", 400)]
    summary = report.summarize(runs)
    text = report.table(summary, report.ratios(summary))
    rows = [line.split("|")[3].strip() for line in text.splitlines()[2:]]
    assert rows == ["ceiling", "prefetchd", "floor"]
    assert "0.90" in text  # prefetchd ÷ ceiling


def test_runs_are_interleaved_and_rotated() -> None:
    plan = runner.plan_runs(["large", "small"], ["a", "b", "c"], repeats=2, seed=0)
    assert plan[:3] == [(0, "large", "a"), (0, "large", "b"), (0, "large", "c")]
    assert [p[2] for p in plan if p[0] == 1 and p[1] == "large"] == ["b", "c", "a"]
    assert len(plan) == 2 * 2 * 3


def test_shaping_script_caps_only_the_stores_port_one_class_per_bucket() -> None:
    script = network.shaping_batch(8333, 600)
    assert "match ip sport 8333 0xffff flowid 1:2" in script
    assert script.count("htb rate 600mbit ceil 600mbit") == network.HASH_BUCKETS
    assert "hashkey mask 0x000000ff at 20 link 9:" in script


def test_baseline_splits_tfrecord_files_into_their_records() -> None:
    records = [b"", b"a", b"x" * 70000]
    assert readers.split_tfrecords(b"".join(frame(r) for r in records)) == records


def test_sweep_points_vary_one_knob_at_a_time() -> None:
    pts = sweep.points(quick=True)
    assert {p[0] for p in pts} == set(sweep.QUICK_KNOBS)
    assert ("download.concurrency", "download__concurrency", 32) in pts


def test_ratio_to_ceiling_uses_the_faster_of_the_two_ceilings() -> None:
    runs = [run("ceiling", 300), run("ceiling-crt", 450), run("prefetchd", 360)]
    summary = report.summarize(runs)
    assert report.ratios(summary)[("shaped", "large", "prefetchd")]["vs_ceiling"] == 0.8
