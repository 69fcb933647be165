"""``python -m bench --keep-sweep``: the per-epoch arithmetic, the table, and the counting proxy's
request kinds."""

from __future__ import annotations

from dataclasses import dataclass

from bench.studies.keep_sweep import epoch_row, keep_table
from testkit.proxy import request_kind


@dataclass
class DS:
    bytes: int


def counts(get: int, get_bytes: int) -> dict[str, int]:
    return {"get": get, "get_bytes": get_bytes, "list": 0, "head": 0, "other": 0}


def test_an_epoch_row_is_the_difference_of_the_figures_at_its_ends() -> None:
    row = epoch_row(
        DS(2 * 10**9), 0.5, 1, (10.0, counts(5, 10**9), 3.0), (14.0, counts(9, 2 * 10**9), 5.0), "x"
    )
    assert row["mb_s"] == 500.0 and row["gets"] == 4 and row["gb_fetched"] == 1.0
    assert row["cpu_s_per_gb"] == 1.0 and row["seconds"] == 4.0


def test_the_table_has_epoch_0_later_epochs_the_whole_run_and_the_simulated_rows() -> None:
    def measured(fraction: float, epoch: int, gets: int) -> dict[str, object]:
        return {
            "keep_fraction": fraction,
            "epoch": epoch,
            "mb_s": 100.0,
            "gets": gets,
            "gb_fetched": 0.1,
            "cpu_s_per_gb": 2.0,
            "hit_ratio": 1.0 if epoch > 0 else 0.0,
        }

    rows = [measured(f, e, 10 if e <= 0 else 0) for f in (0.0, 0.5, 1.0) for e in (0, 1, 2, -1)]
    rows.append(
        {"policy": "lru (simulated)", "keep_fraction": 0.5, "epoch": "1+", "hit_ratio": 0.2}
    )
    table = keep_table(rows).splitlines()
    assert len(table) == 2 + 3 * 3 + 1
    assert table[3].startswith("| 0% | 1-2 (mean) | 100 | 0 |")
    assert table[4].startswith("| 0% | all 3, whole run | 100 | 10 |")
    assert table[-1] == "| 50%, lru (simulated) | 1+ | | | | | 20% |"


def test_requests_are_told_apart_by_method_and_key() -> None:
    assert request_kind("GET", "/bench/data/0001.tfrecord") == "get"
    assert request_kind("GET", "/bench?list-type=2&prefix=data/") == "list"
    assert request_kind("HEAD", "/bench/data/0001.tfrecord") == "head"
    assert request_kind("PUT", "/bench/data/x") == "other"
