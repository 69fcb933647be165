"""What ``check`` and ``run`` say when the listing shows raw objects over the record limit."""

from __future__ import annotations

from prefetchd.config import config_from_dict, record_size_limit
from prefetchd.oversize import Oversized, budget_for

MIB = 1024**2


def test_the_raw_objects_over_the_limit_are_counted_named_and_a_fix_given() -> None:
    cfg = config_from_dict(
        {
            "source": {"url": "s3://bkt/p/", "format": "raw"},
            "output": {"ram_budget": "5MiB", "shard_size": "512KiB"},
        }
    )
    over = Oversized(cfg)
    for n in range(10):
        over.add(f"p/{n}.bin", MIB)
    for n in range(5):
        over.add(f"p/big{n}.bin", 3 * MIB)
    over.add("p/packed.bin.gz", 50 * MIB)  # compressed: its record size is not known
    text = over.message()
    assert text is not None and "\n" not in text
    assert text.startswith("5 of 16 objects (15.0 MiB) are over output.max_record_size")
    assert (
        "s3://bkt/p/big0.bin (3.0 MiB), s3://bkt/p/big1.bin (3.0 MiB)" in text
        and "big3" not in text
    )
    assert "set output.max_record_size: 3MiB and output.ram_budget: 7MiB or more" in text
    # what it advises does hold the objects
    bigger = config_from_dict(
        {
            "source": {"url": "s3://bkt/p/", "format": "raw"},
            "output": {"ram_budget": "7MiB", "shard_size": "512KiB", "max_record_size": "3MiB"},
        }
    )
    assert bigger.output.max_record_size == 3 * MIB
    assert record_size_limit(bigger.output) >= 3 * MIB
    assert budget_for(cfg, 3 * MIB) <= 7 * MIB


def test_nothing_is_said_for_formats_whose_records_are_parts_of_objects() -> None:
    cfg = config_from_dict({"source": {"url": "s3://bkt/p/", "format": "tar"}})
    over = Oversized(cfg)
    over.add("p/huge.tar", 10 * 1024 * MIB)
    assert over.message() is None
