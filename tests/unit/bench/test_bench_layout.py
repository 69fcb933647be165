"""The daemon's layout in the bench: a user's by default (cache on the local disk, writers and
connections as ``prefetchd init`` sizes them), the old tmpfs one on request, and recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.harness import cli, datasets, layout, report, results, runner
from prefetchd.commands import init_config

GiB = 1024**3
HOST = init_config.Host(cores=2, ram=24 * GiB, shm=12 * GiB, disk_free=80 * GiB)
BIG = init_config.Host(cores=64, ram=512 * GiB, shm=256 * GiB, disk_free=2000 * GiB)
MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vdb /var/cache xfs rw 0 0
/dev/vdc /mnt/my\\040disk ext4 rw 0 0
"""


def choose(name: str, host: init_config.Host, cache_dir: Path | None = None) -> layout.Layout:
    return layout.choose(
        name, host, cache_dir=cache_dir, disk_parent=Path("/var/cache"), ram=Path("/dev/shm/b")
    )


@pytest.mark.parametrize("host", [HOST, BIG])
def test_the_user_layout_takes_prefetchd_inits_sizes_and_the_local_disk(
    host: init_config.Host,
) -> None:
    plan = init_config.plan(host)
    got = choose("user", host)
    assert (got.writers, got.concurrency) == (plan.writers, plan.concurrency)
    assert got.cache_parent == Path("/var/cache")
    assert f"prefetchd init for {host.cores} cores" in got.describe()


def test_the_bench_layout_is_the_old_tmpfs_one_and_cache_dir_moves_either() -> None:
    got = choose("bench", BIG)
    assert (got.writers, got.concurrency, got.cache_parent) == (2, 32, Path("/dev/shm/b"))
    assert choose("user", HOST, Path("/dev/shm")).cache_parent == Path("/dev/shm")
    assert choose("bench", HOST, Path("/data")).cache_parent == Path("/data")
    with pytest.raises(ValueError, match="unknown layout 'fast'"):
        choose("fast", HOST)


@pytest.mark.parametrize(
    ("path", "fs"),
    [
        ("/var/cache/prefetchd-bench-cache-x", "xfs"),
        ("/var/cachex/y", "ext4"),  # a name that only starts like a mount point
        ("/dev/shm/prefetchd-bench-1/cache", "tmpfs"),
        ("/mnt/my disk/c", "ext4"),
        ("/root/.cache", "ext4"),
    ],
)
def test_the_cache_filesystem_is_the_longest_mount_above_it(path: str, fs: str) -> None:
    assert layout.filesystem(Path(path), MOUNTS) == fs
    assert layout.filesystem(Path(path), "") == "?"


def test_the_daemon_config_has_the_layouts_writers_concurrency_and_cache(tmp_path: Path) -> None:
    import yaml

    chosen = layout.Layout("user", tmp_path / "disk", 1, 24, "prefetchd init for 2 cores", "ext4")
    bench = runner.Bench(
        cli.parse_args([]), "http://127.0.0.1:1", tmp_path, tmp_path / "ram", {}, tmp_path,
        tmp_path / "disk", chosen,
    )  # fmt: skip
    spec = datasets.BY_NAME["small"].spec(3)
    ds = datasets.Uploaded(spec, "small/", 3, 300, 3, tmp_path / "floor")
    (tmp_path / "run-1").mkdir()
    config = yaml.safe_load(bench.daemon_config(ds, "crt", tmp_path / "run-1").read_text())
    assert config["download"]["cache_dir"] == str(tmp_path / "disk" / "run-1")
    assert (config["output"]["writers"], config["download"]["concurrency"]) == (1, 24)


def test_five_repeats_by_default_one_with_quick_and_the_user_layout() -> None:
    args = cli.parse_args([])
    assert (args.repeats, args.layout, args.cache_dir) == (5, "user", None)
    assert cli.parse_args(["--quick"]).repeats == 1
    assert cli.parse_args(["--layout", "bench", "--repeats", "2"]).repeats == 2


def test_the_layout_heads_the_bars_and_old_results_say_theirs() -> None:
    chosen = layout.Layout("user", Path("/var/cache/p-1"), 1, 32, "prefetchd init for 2 cores")
    meta: dict[str, Any] = {"layout": {**chosen.to_json()}, "repeats": 5}
    head = results.bars_header(meta)
    assert head.startswith("Layout: user (download.cache_dir under /var/cache/p-1, ?; ")
    assert "output.writers 1, download.concurrency 32: prefetchd init for 2 cores; " in head
    assert head.split(")")[0].endswith("output.mix default")
    assert "Median and worst of 5 repeats" in head
    assert "Median and worst of 1 repeat," in results.bars_header({**meta, "repeats": 1})
    old = report.layout_note({"cache_dir": "tmpfs"})
    assert old == "bench (download.cache_dir on tmpfs; output.writers 2, download.concurrency 32)"


def test_old_results_count_their_repeats_from_the_runs() -> None:
    runs = [{"repeat": 0}, {"repeat": 2}, {"repeat": 1}]
    assert report.repeats({}, runs) == 3
    assert report.repeats({"repeats": 5}, runs) == 5
    assert report.repeats({}, []) == 1


def test_resolve_makes_a_fresh_private_cache_directory_under_the_chosen_parent(
    tmp_path: Path,
) -> None:
    first = layout.resolve("user", str(tmp_path), tmp_path / "ram")
    second = layout.resolve("bench", str(tmp_path), tmp_path / "ram")
    assert first.cache_parent.parent == second.cache_parent.parent == tmp_path
    assert first.cache_parent != second.cache_parent and first.cache_parent.is_dir()
    assert first.cache_parent.name.startswith("prefetchd-bench-cache-")
    assert first.writers == init_config.plan(init_config.probe_host()).writers
    assert first.cache_fs != "?"  # named from /proc/mounts
