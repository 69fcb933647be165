"""The data-path issue's bars: each one's arithmetic, its verdict, and the table it prints."""

from __future__ import annotations

from typing import Any

import pytest

from bench.drivers import paced_proxy as proxy
from bench.harness import bars, report, runner
from bench.harness.report import cpu_split


def row(network: str, dataset: str, loader: str, **metrics: Any) -> dict[str, Any]:
    return {"network": network, "dataset": dataset, "loader": loader, **metrics}


def checked(*runs: dict[str, Any]) -> dict[tuple[int, str, str], Any]:
    rows = bars.check(report.summarize(list(runs)))
    return {(r["number"], r["bar"], r["where"]): (r["value"], r["met"]) for r in rows}


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
    assert got[(5, bars.TRAINER_VS_LEAN.what, where)] == (pytest.approx(1.2), True)
    assert got[(5, bars.TRAINER_VS_FLOOR.what, where)] == (2.4, False)
    assert got[(6, bars.STARTUP.what, where)] == (1.2, False)
    assert got[(8, bars.RSS.what, where)] == (300.0, True)
    assert got[(1, bars.CPU_GB.what, where)] == (None, None)  # no ceiling-crt: not measured


def test_paced_bars_are_against_the_baseline_with_their_own_limits() -> None:
    got = checked(
        row("paced", "small", "baseline", mb_s=10),
        row("paced", "small", "prefetchd", mb_s=70),
        row("paced", "large", "baseline", mb_s=100),
        row("paced", "large", "prefetchd", mb_s=260),
    )
    assert got[(7, bars.PACED_BARS["small"].what, "paced/small/prefetchd")] == (7.0, False)
    assert got[(7, bars.PACED_BARS["large"].what, "paced/large/prefetchd")] == (2.6, True)
    assert not any(key[0] in (1, 5, 6) for key in got)  # the loopback bars stay on loopback


def test_status_is_judged_from_the_gil_runs_only() -> None:
    got = checked(
        row("loopback", "medium/gil", "prefetchd", mb_s=100, status_s=0.25),
        row("loopback", "medium", "prefetchd", mb_s=100),
    )
    assert got[(6, bars.STATUS.what, "loopback/medium/gil/prefetchd")] == (0.25, True)
    assert not any(key[1] == bars.STATUS.what and "gil" not in key[2] for key in got)


def test_bars_table_says_met_missed_or_not_measured_and_counts_them() -> None:
    rows = bars.check(
        report.summarize(
            [
                row("paced", "medium", "baseline", mb_s=100),
                row("paced", "medium", "prefetchd", mb_s=300, daemon_rss_peak_mib=450.0),
                row("paced", "medium", "prefetchd-crt", mb_s=200),
            ]
        )
    )
    text = bars.table(rows)
    paced = "| 7 | MB/s ÷ in-trainer baseline's (1st batch in) | paced/medium/prefetchd"
    assert f"{paced} | 3.00 | ≥ 2.5 | met |" in text
    assert "| 8 | daemon peak RSS MiB | paced/medium/prefetchd | 450 | ≤ 400 | **MISSED** |" in text
    assert (
        "| 8 | daemon peak RSS MiB | paced/medium/prefetchd-crt | not measured | ≤ 400 | - |"
        in text
    )
    assert text.endswith("1 of 3 bars met (1 not measured).")
    assert [r["number"] for r in rows] == sorted(r["number"] for r in rows)


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
