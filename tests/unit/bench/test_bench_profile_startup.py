"""bench.profile.startup's report (pure): each phase's median and minimum, and the total's."""

from __future__ import annotations

from bench.profile.startup import summary


def test_summary_gives_median_and_minimum_of_each_phase_and_of_the_total() -> None:
    runs = [
        {"main": 0.10, "import": 0.20},
        {"main": 0.30, "import": 0.10},
        {"main": 0.20, "import": 0.40},
    ]
    assert summary(runs) == ("main 0.200 (0.100), import 0.200 (0.100), total 0.400 (0.300)")
