"""``bench.profile.download``'s pure parts: in-order delivery times, the ceiling's output, CPU by
role and the report line."""

from __future__ import annotations

from pathlib import Path

from bench.harness import runner
from bench.profile import download as profile_download
from bench.profile.download import DATASETS


def test_in_order_waits_for_an_unbroken_prefix_of_the_order() -> None:
    # Object 1 lands last: half the bytes (objects 0 and 1) are in order only when it does.
    published = [(0, 1.0), (2, 1.5), (1, 3.0), (3, 2.0)]
    assert profile_download.in_order(published, [10, 10, 10, 10]) == (1.0, 3.0, 3.0)


def test_in_order_of_an_object_never_published_is_infinite() -> None:
    first, half, full = profile_download.in_order([(0, 0.5)], [30, 10])
    assert (first, half) == (0.5, 0.5)
    assert full == float("inf")


def test_the_ceiling_counts_its_transfer_not_its_listing_or_start() -> None:
    got = profile_download.ceiling_result("24 1073741824 2.500 0.900 1.250 2.100\n")
    assert got == {"cpu": 1.25, "wall": 2.1, "objects": 24}


def test_cpu_by_role_sums_pids_and_names_strangers_other() -> None:
    seen = {10: 1.0, 11: 2.0, 12: 0.5, 99: 0.25}
    roles = {10: "supervisor", 11: "writer", 12: "writer"}
    assert profile_download.cpu_by_role(seen, roles) == {
        "supervisor": 1.0,
        "writer": 2.5,
        "other": 0.25,
    }


def test_line_gives_per_object_per_gb_and_the_ratio_with_what_the_runs_carry() -> None:
    ds = DATASETS["large"]  # 24 objects
    runs = [
        {"cpu": 2.4, "wall": 2.0, "cpu_start": 0.5, "order": [0.1, 1.0, 2.0]},
        {"cpu": 4.8, "wall": 4.0, "cpu_start": 0.7, "order": [0.3, 1.2, 2.2]},
    ]
    text = profile_download.line("prefetchd crt", runs, 2 * 10**9, ds, ceil=1.8)
    assert "150.00 ms/object" in text
    assert "1.80 CPU-s/GB" in text
    assert "x 2.00 of ceiling" in text
    assert "start 0.60 CPU-s" in text
    assert "in order: first 0.20s, 50% 1.10s, 100% 2.10s" in text
    assert "[" not in text  # no roles: the downloader mode


def test_line_lists_roles_and_their_start() -> None:
    runs = [{"cpu": 1.0, "wall": 1.0, "roles": {"writer": 0.5}, "start_roles": {"writer": 0.1}}]
    text = profile_download.line("prefetchd classic", runs, 10**9, DATASETS["small"], ceil=1.0)
    assert text.endswith("[writer 0.50 CPU-s]  start [writer 0.10]")


def test_the_main_bench_still_reads_the_ceilings_start_up_from_its_fourth_field() -> None:
    assert runner.ceiling_startup_cpu("24 1073741824 2.500 0.900 1.250 2.100\n") == 0.9


def test_the_user_layout_puts_the_cache_on_its_disk_with_its_writers_and_mix(
    tmp_path: Path,
) -> None:
    from bench.harness.layout import BENCH, Layout

    ds = DATASETS["small"]
    bench = profile_download.job_config("http://s3", ds, "crt", tmp_path / "run", "2GiB")
    assert bench["download"]["cache_dir"] == str(tmp_path / "run" / "cache")
    assert bench["output"]["writers"] == BENCH.writers and bench["output"]["mix"] == BENCH.mix
    user = Layout("user", tmp_path / "disk", 1, 32, "prefetchd init for 2 cores", "ext4")
    config = profile_download.job_config("http://s3", ds, "crt", tmp_path / "run", "2GiB", user)
    assert config["download"]["cache_dir"] == str(tmp_path / "disk" / "run")
    assert config["output"]["writers"] == 1 and config["download"]["concurrency"] == 32
    assert "mix" not in config["output"]  # the daemon's default


def test_the_roles_line_splits_out_the_kernel_time() -> None:
    runs = [
        {"cpu": 3.0, "roles": {"downloader": 2.0, "writer": 1.0}, "start_roles": {},
         "roles_sys": {"downloader": 1.25, "writer": 0.5}},
    ]  # fmt: skip
    text = profile_download._roles(runs)
    assert "[downloader 2.00, writer 1.00 CPU-s]" in text
    assert "of which system [downloader 1.25, writer 0.50]" in text
