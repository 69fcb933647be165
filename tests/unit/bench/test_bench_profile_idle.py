"""bench.profile.idle's arithmetic (pure): ms of CPU per second by process name."""

from __future__ import annotations

from bench.profile.idle import per_second


def test_cpu_per_second_by_name_adds_up_processes_and_leaves_out_one_gone() -> None:
    names = {1: "python", 2: "prefetchd-dl", 3: "prefetchd-w0", 4: "python", 5: "prefetchd-w1"}
    before = {1: 1.0, 2: 2.0, 3: 3.0, 4: 0.5, 5: 1.0}
    after = {1: 1.05, 2: 2.1, 3: 3.02, 4: 0.55}  # 5 exited meanwhile
    got = per_second(names, before, after, 10.0)
    assert got.keys() == {"python", "prefetchd-dl", "prefetchd-w0"}
    assert round(got["python"], 6) == 10.0  # (0.05 + 0.05) s over 10 s
    assert round(got["prefetchd-dl"], 6) == 10.0
    assert round(got["prefetchd-w0"], 6) == 2.0
