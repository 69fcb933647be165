"""Sizes as people write them in the config: ``16GiB``, ``512MiB``, ``1GB``, plain bytes."""

from __future__ import annotations

import pytest

from prefetchd.sizes import format_size, parse_size

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GiB", 1536 * MiB),
        ("1GB", 10**9),
        ("1.5KB", 1500),
        ("1.001KB", 1001),  # regression: float arithmetic rejected this as "not whole"
        ("2.007MB", 2_007_000),
        ("64KiB", 64 * KiB),
        ("2TiB", 2 * TiB),
        ("3tb", 3 * 10**12),
        ("8k", 8000),
        ("16gib", 16 * GiB),
        (" 8 MiB ", 8 * MiB),
        ("4096", 4096),
        ("4096B", 4096),
        ("0", 0),
        ("18014398509481985", 2**54 + 1),  # regression: digits beyond float precision
        (4096, 4096),
        (0, 0),
    ],
)
def test_parse_size_accepts_what_people_write(text: object, expected: int) -> None:
    assert parse_size(text) == expected
    assert type(parse_size(text)) is int


@pytest.mark.parametrize(
    "bad",
    [
        "16XB",
        "16 G iB",
        "GiB",
        "",
        "-1GiB",
        "1e9",
        ".5GiB",
        "1.5",  # 1.5 bytes
        "0.1KiB",  # 102.4 bytes
        "16PiB",  # no such unit here
        -1,
        True,
        False,
        1.5,
        16.0,
        None,
        [1],
        {"GiB": 1},
    ],
)
def test_parse_size_rejects_non_sizes_with_a_one_line_reason(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(bad)
    message = str(info.value)
    assert message
    assert "\n" not in message


def test_parse_size_explains_fractional_bytes() -> None:
    with pytest.raises(ValueError, match="whole number of bytes"):
        parse_size("1.5")
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * MiB, "1.5 GiB"),
        (16 * GiB, "16.0 GiB"),
        (1024 * TiB, "1024.0 TiB"),  # TiB is the largest unit
        (-2048, "-2.0 KiB"),
        (250.5 * MiB, "250.5 MiB"),
    ],
)
def test_format_size_is_readable(n: float, expected: str) -> None:
    assert format_size(n) == expected


@pytest.mark.parametrize("text", ["1.5GiB", "512.0MiB", "16.0GiB", "3.5TiB"])
def test_format_size_output_parses_back(text: str) -> None:
    n = parse_size(text)
    assert parse_size(format_size(n).replace(" ", "")) == n
