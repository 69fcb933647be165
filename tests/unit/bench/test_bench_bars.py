"""The data-path issue's bars: each one's arithmetic, its verdict, and the table it prints."""

from __future__ import annotations

from typing import Any

import pytest

from bench.drivers import paced_proxy as proxy
from bench.harness import bars, report, runner
from bench.harness.report import cpu_split


def row(network: str, dataset: str, loader: str, repeat: int = 0, **metrics: Any) -> dict[str, Any]:
    return {"network": network, "dataset": dataset, "loader": loader, "repeat": repeat, **metrics}


def checked(*runs: dict[str, Any]) -> dict[tuple[int, str, str], Any]:
    rows = bars.check(list(runs))
    return {(r["number"], r["bar"], r["where"]): (r["median"], r["met"]) for r in rows}


def test_cpu_split_divides_the_data_path_cpu_by_each_unit() -> None:
    split = cpu_split(3.0, nbytes=2_000_000_000, objects=1000, records=1_500_000, files=3_000_000)
    assert split == {
        "data_cpu_s_per_gb": 1.5,
        "data_cpu_ms_per_object": 3.0,
        "data_cpu_us_per_record": 2.0,
        "data_cpu_us_per_file": 1.0,
    }
    assert set(cpu_split(None, nbytes=1, objects=1, records=1, files=1).values()) == {None}


def test_daemon_split_takes_the_start_up_out_of_the_data_path() -> None:
    from bench.harness.datasets import DatasetSpec, Uploaded

    ds = Uploaded(
        DatasetSpec("x", "raw", 10, 1, 1), "x/", 10, 10**9, 10, __import__("pathlib").Path("."), 10
    )
    split = runner.daemon_split(ds, 5.0, 1.0)
    assert split["startup_cpu_s"] == 1.0 and split["data_cpu_s_per_gb"] == 4.0
    assert runner.daemon_split(ds, 5.0, None)["data_cpu_s_per_gb"] is None


def test_cpu_bars_compare_with_the_crt_ceilings_data_path() -> None:
    got = checked(
        row("loopback", "medium", "ceiling-crt", data_cpu_s_per_gb=1.0),
        row("loopback", "medium", "prefetchd", mb_s=100, data_cpu_s_per_gb=1.4),
        row("loopback", "small", "ceiling-crt", data_cpu_ms_per_object=0.5),
        row("loopback", "small", "prefetchd-crt", mb_s=50, data_cpu_ms_per_object=1.5),
        row("loopback", "lines", "prefetchd", mb_s=50, data_cpu_us_per_record=2.5),
        row("loopback", "tarsmall", "prefetchd", mb_s=50, data_cpu_us_per_file=1.5),
        row("loopback", "tar", "prefetchd", mb_s=50, data_cpu_us_per_file=40.0),
    )
    assert got[(1, bars.CPU_GB.what, "loopback/medium/prefetchd")] == (pytest.approx(1.4), True)
    assert got[(2, bars.CPU_OBJECT.what, "loopback/small/prefetchd-crt")] == (3.0, False)
    assert got[(3, bars.CPU_RECORD.what, "loopback/lines/prefetchd")] == (2.5, False)
    assert got[(3, bars.CPU_FILE.what, "loopback/tarsmall/prefetchd")] == (1.5, True)
    # tar's images cost more per file than the bar in the ceiling alone: judged on tarsmall
    assert not any(key[0] == 3 and key[2] == "loopback/tar/prefetchd" for key in got)
    assert (6, bars.STARTUP.what, "loopback/tar/prefetchd") in got, "tar keeps its other rows"


def test_lean_floor_start_up_and_rss_bars() -> None:
    got = checked(
        row("loopback", "tfrecord16", "lean", mb_s=300, trainer_cpu_s_per_gb=2.0),
        row("loopback", "tfrecord16", "floor", mb_s=900, trainer_cpu_s_per_gb=1.0),
        row(
            "loopback",
            "tfrecord16",
            "prefetchd",
            mb_s=270,
            trainer_cpu_s_per_gb=2.4,
            startup_cpu_s=1.2,
            daemon_rss_peak_mib=300.0,
        ),
    )
    where = "loopback/tfrecord16/prefetchd"
    assert got[(4, bars.VS_LEAN.what, where)] == (0.9, True)
    assert got[(5, bars.TRAINER_VS_LEAN.what, where)] == (pytest.approx(1.2), False)  # > 1.1
    assert got[(5, bars.TRAINER_VS_FLOOR.what, where)] == (2.4, False)
    assert got[(6, bars.STARTUP.what, where)] == (1.2, False)
    assert got[(8, bars.RSS.what, where)] == (300.0, True)
    assert got[(1, bars.CPU_GB.what, where)] == (None, None)  # no ceiling-crt: not measured


def test_paced_bars_are_steady_state_against_the_baseline_with_their_own_limits() -> None:
    def paced(dataset: str, loader: str, mb: float, first_batch_s: float) -> dict[str, Any]:
        size = 10**9
        return row("paced", dataset, loader, mb_s=mb, bytes=size, records=8000,
                   wall_s=size / 1e6 / mb, first_batch_s=first_batch_s)  # fmt: skip

    got = checked(
        paced("small", "baseline", 10, 1.0),
        paced("small", "prefetchd", 70, 5.0),
        paced("tfrecord16", "baseline", 100, 0.5),
        paced("tfrecord16", "prefetchd", 260, 0.5),
        paced("large", "baseline", 100, 0.5),
        paced("large", "prefetchd", 260, 0.5),
    )
    small = got[(7, bars.PACED_STEADY["small"].what, "paced/small/prefetchd")]
    # steady: 1000 MB in 100 s - 1 s against 1000 MB in 14.3 s - 5 s: 10.6, where the rates
    # with the first batch in (7) would miss
    assert small == (pytest.approx((100 - 1) / (1000 / 70 - 5)), True)
    samples = got[(7, bars.PACED_SAMPLES.what, "paced/small/prefetchd")]
    assert samples == (pytest.approx(8000 / (1000 / 70 - 5)), True)  # 862 samples/s
    tf16 = got[(7, bars.PACED_STEADY["tfrecord16"].what, "paced/tfrecord16/prefetchd")]
    assert tf16[1] is True
    large = got[(7, bars.PACED_FIRST_BATCH.what, "paced/large/prefetchd")]
    assert large == (pytest.approx(2.6), True)  # large keeps its first-batch-in bar
    assert not any(key[0] in (1, 5, 6) for key in got)  # the loopback bars stay on loopback


def test_ratios_pair_each_repeat_with_the_run_beside_it() -> None:
    runs = [
        row("paced", "large", "baseline", 0, mb_s=50),
        row("paced", "large", "prefetchd", 0, mb_s=150),
        row("paced", "large", "baseline", 1, mb_s=200),
        row("paced", "large", "prefetchd", 1, mb_s=500),
        row("paced", "large", "baseline", 2, mb_s=100),
        row("paced", "large", "prefetchd", 2, mb_s=280),
    ]
    (judged,) = [r for r in bars.check(runs) if r["bar"] == bars.PACED_FIRST_BATCH.what]
    assert judged["values"] == [3.0, 2.5, 2.8]  # not 280 ÷ 100 of the medians
    assert (judged["median"], judged["worst"], judged["verdict"]) == (2.8, 2.5, bars.MET)


def test_a_failed_repeat_is_counted_and_not_paired() -> None:
    runs = [
        row("paced", "large", "baseline", 0, mb_s=100),
        row("paced", "large", "prefetchd", 0, mb_s=300),
        row("paced", "large", "baseline", 1, error="boom"),
        row("paced", "large", "prefetchd", 1, mb_s=1000),
        row("paced", "large", "prefetchd", 2, error="boom"),
    ]
    (judged,) = [r for r in bars.check(runs) if r["bar"] == bars.PACED_FIRST_BATCH.what]
    assert (judged["values"], judged["repeats"]) == ([3.0], 3)
    assert "| 1/3 |" in bars.table([judged])


@pytest.mark.parametrize(
    ("bar", "values", "verdict"),
    [
        (bars.PACED_STEADY["small"], [8.5, 8.1, 7.3], bars.MET),  # worst ≥ 7.2
        (bars.PACED_STEADY["small"], [8.5, 8.1, 7.1], bars.MISSED_WORST),
        (bars.PACED_STEADY["small"], [7.9, 9.0, 7.8], bars.MISSED),
        (bars.CPU_OBJECT, [1.9, 2.0, 2.2], bars.MET),  # worst ≤ 2.2
        (bars.CPU_OBJECT, [1.9, 2.0, 2.25], bars.MISSED_WORST),
        (bars.CPU_OBJECT, [2.1, 1.0, 2.1], bars.MISSED),
        (bars.CPU_OBJECT, [], bars.NOT_MEASURED),
    ],
)
def test_met_means_the_median_meets_it_and_the_worst_is_within_10_percent(
    bar: bars.Bar, values: list[float], verdict: str
) -> None:
    median, worst, got = bars.judge(bar, values)
    assert got == verdict
    if values:
        assert median == sorted(values)[1]
        assert worst == (min(values) if bar.higher_is_better else max(values))


def test_status_is_judged_from_the_gil_runs_only() -> None:
    got = checked(
        row("loopback", "medium/gil", "prefetchd", mb_s=100, status_s=0.25),
        row("loopback", "medium", "prefetchd", mb_s=100),
    )
    assert got[(6, bars.STATUS.what, "loopback/medium/gil/prefetchd")] == (0.25, True)
    assert not any(key[1] == bars.STATUS.what and "gil" not in key[2] for key in got)


def test_bars_table_shows_median_worst_threshold_and_the_verdict() -> None:
    rows = bars.check(
        [
            row("paced", "medium", "baseline", 0, mb_s=100),
            row("paced", "medium", "prefetchd", 0, mb_s=300, daemon_rss_peak_mib=390.0),
            row("paced", "medium", "baseline", 1, mb_s=100),
            row("paced", "medium", "prefetchd", 1, mb_s=220, daemon_rss_peak_mib=450.0),
            row("paced", "medium", "prefetchd-crt", 0, mb_s=200),
        ]
    )
    text = bars.table(rows)
    paced = "| 7 | MB/s (1st batch in) ÷ the in-trainer baseline's | paced/medium/prefetchd"
    assert f"{paced} | 2.60 | 2.20 | 2/2 | ≥ 2.5 (worst ≥ 2.25) | **MISSED**: met by median" in text
    rss = "| 8 | daemon peak RSS MiB | paced/medium/prefetchd | 420 | 450 | 2/2 | ≤ 400"
    assert f"{rss} (worst ≤ 440) | **MISSED** |" in text
    crt_rss = "| 8 | daemon peak RSS MiB | paced/medium/prefetchd-crt | - | - | 0/1 |"
    assert f"{crt_rss} ≤ 400 (worst ≤ 440) | not measured |" in text
    assert text.splitlines()[-1] == (
        "0 of 3 bars met (1 not measured); met = the median meets the bar and the worst run "
        "is within 10 % of it."
    )
    assert [r["number"] for r in rows] == sorted(r["number"] for r in rows)


def test_issue_table_has_every_row_of_the_issue_in_its_order() -> None:
    runs = [
        row("loopback", "tfrecord16", "lean", mb_s=300, trainer_cpu_s_per_gb=2.0),
        row("loopback", "tfrecord16", "prefetchd-crt", mb_s=270, trainer_cpu_s_per_gb=2.1),
    ]
    rows = bars.issue_rows(runs)
    assert [r["issue_row"] for r in rows] == [
        words for words, judged in bars.ISSUE_TABLE for _ in judged
    ]
    by_bar = {(r["bar"], r["where"]): r["verdict"] for r in rows}
    assert by_bar[(bars.VS_LEAN.what, "loopback/tfrecord16/prefetchd-crt")] == bars.MET
    assert by_bar[(bars.TRAINER_VS_LEAN.what, "loopback/tfrecord16/prefetchd-crt")] == bars.MET
    paced = (bars.PACED_STEADY["small"].what, "paced/small/prefetchd-crt")
    assert by_bar[paced] == bars.NOT_MEASURED  # the paced phase did not run
    text, x = bars.issue_table(rows), bars.X  # the issue's own words, its sign included
    first = text.splitlines()[2]
    assert first.startswith(
        f"| behind 75 MiB/s per connection + 30 ms per request, 96 {x} 16 MiB TFRecords, "
        f"steady state ≥ 2.5{x} | steady-state MB/s ÷ the in-trainer baseline's "
        "| paced/tfrecord16/prefetchd-crt |"
    )
    assert f"| trainer CPU per GB ≤ 1.1{x} the lean trainer's |" in text
    assert text.splitlines()[-1].startswith("2 of 2 bars met (7 not measured)")


def test_steady_rates_leave_out_the_time_to_the_first_batch() -> None:
    run = {"bytes": 4_000_000, "records": 100, "wall_s": 3.0, "first_batch_s": 1.0}
    steady = report.with_steady(run)
    assert (steady["steady_mb_s"], steady["steady_records_s"]) == (2.0, 50.0)
    assert report.steady_records_s({"records": 1, "wall_s": 1.0, "first_batch_s": 1.0}) is None


def test_cpu_table_shows_the_daemon_beside_the_ceiling_and_lean() -> None:
    summary = report.summarize(
        [
            row("loopback", "lines", "prefetchd", mb_s=40, data_cpu_us_per_record=9.0),
            row("loopback", "lines", "baseline", mb_s=30),
            row("loopback", "lines", "ceiling-crt", mb_s=400, data_cpu_s_per_gb=1.0),
        ]
    )
    lines = report.cpu_table(summary).splitlines()[2:]
    assert [line.split("|")[3].strip() for line in lines] == ["ceiling-crt", "prefetchd"]
    assert "9.0" in lines[1]


def test_pacing_arithmetic_holds_the_first_byte_and_keeps_the_rate() -> None:
    assert proxy.first_byte_wait(10.0, 0.03, 10.01) == pytest.approx(0.02)
    assert proxy.first_byte_wait(10.0, 0.03, 10.05) == 0.0
    assert proxy.first_byte_wait(None, 0.03, 10.0) == 0.0
    rate = 75 * 1024**2
    assert proxy.pace_due(0.0, 5.0, rate, rate) == 6.0  # an idle link: from now
    assert proxy.pace_due(7.0, 5.0, rate // 2, rate) == 7.5  # a busy one: after what is due
