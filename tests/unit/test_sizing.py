"""What ``prefetchd check`` advises about sizes (prefetchd/commands/sizing.py) and a RAM disk
smaller than the budget (a container's /dev/shm): one line per problem, naming the key and the
value to use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefetchd.commands import sizing
from prefetchd.commands.check import small_tmpfs_advice
from prefetchd.config import Config, config_from_dict

MiB, GiB = 1024**2, 1024**3


def config(**sections: dict[str, Any]) -> Config:
    return config_from_dict({"source": {"url": "s3://bucket/p/"}, **sections})


def test_the_defaults_need_no_advice_on_a_gpu_host() -> None:
    assert sizing.advice(config(), cores=32, object_size=100 * MiB) == []


def test_a_ram_budget_without_a_ready_shard_per_writer_names_the_value_to_use() -> None:
    small = config(output={"writers": 2, "shard_size": "128MiB", "ram_budget": "512MiB"})
    line = sizing.ram_budget_advice(small)
    assert line is not None and "use output.ram_budget: 640MiB" in line
    assert sizing.ram_budget_advice(config(output={"ram_budget": "640MiB"})) is None


def test_a_window_too_small_for_large_objects_names_the_value_to_use() -> None:
    cfg = config(
        download={"window": "1GiB", "concurrency": 32, "part_size": "8MiB"}, output={"mix": 8}
    )
    # 2 writers x 8 mix x 200 MiB held + 32 x 8 MiB in flight = 3456 MiB
    assert sizing.window_need(cfg, 200 * MiB) == 3456 * MiB
    line = sizing.window_advice(cfg, 200 * MiB)
    assert line is not None and line.endswith("use download.window: 4GiB")
    assert sizing.window_advice(cfg, 0) is None  # nothing listed: nothing to say


def test_small_objects_count_whole_in_flight() -> None:
    cfg = config(download={"concurrency": 64, "part_size": "8MiB"})
    assert sizing.window_need(cfg, MiB) == 2 * 64 * MiB + 64 * MiB  # writers x mix + in flight


def test_few_requests_in_flight_and_too_many_writers_are_named() -> None:
    cfg = config(download={"concurrency": 4}, output={"writers": 6, "ram_budget": "8GiB"})
    lines = sizing.advice(cfg, cores=8, object_size=MiB)
    assert [line.split(" ", 1)[0] for line in lines] == [
        "download.concurrency",
        "output.writers",
    ]
    assert lines[1].endswith("use 4")
    assert all("\n" not in line for line in lines)


def test_a_docker_sized_dev_shm_says_how_to_grow_it() -> None:
    line = small_tmpfs_advice(Path("/dev/shm/prefetchd"), 64 * MiB, 4 * GiB)
    assert "tmpfs of 64.0 MiB" in line and "output.ram_budget 4.0 GiB" in line
    assert "--shm-size=5g" in line and "medium: Memory" in line and "sizeLimit: 5Gi" in line
    assert "\n" not in line
