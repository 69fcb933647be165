"""How objects are cut into ranged GETs, and which client runs them when the config names none."""

from __future__ import annotations

import importlib.util

import pytest

from prefetchd.config import config_from_dict
from prefetchd.download.parts import MIN_OBJECT_PART, object_part_size, slots_for

MiB = 1024**2


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (16 * MiB, 2 * MiB),  # 8 parts: 4 objects share 32 connections, not 16 objects
        (64 * MiB, 2 * MiB),  # 32 parts: one object takes every connection
        (256 * MiB, 8 * MiB),  # already enough parts at download.part_size
        (1024 * MiB, 8 * MiB),
        (150 * 1024, 2 * MiB),  # a small object is one request
    ],
)
def test_large_objects_take_every_connection_in_parts_no_finer_than_the_minimum(
    size: int, expected: int
) -> None:
    assert object_part_size(size, 8 * MiB, 32) == expected


def test_download_part_size_is_the_upper_bound_also_below_the_minimum() -> None:
    assert object_part_size(64 * MiB, 64 * 1024, 32) == 64 * 1024
    assert object_part_size(64 * MiB, 8 * MiB, 1) == 8 * MiB


@pytest.mark.parametrize("concurrency", [1, 4, 32, 1024])
@pytest.mark.parametrize("size", [0, 1, MIN_OBJECT_PART, 16 * MiB + 1, 5 * 1024 * MiB])
def test_an_object_never_holds_more_slots_than_there_are(size: int, concurrency: int) -> None:
    part = object_part_size(size, 8 * MiB, concurrency)
    slots = slots_for(size, part, concurrency)
    assert 1 <= slots <= concurrency
    assert slots * part >= size or slots == concurrency


def test_small_objects_hold_one_slot_each_so_many_are_in_flight() -> None:
    size = 200 * 1024
    assert slots_for(size, object_part_size(size, 8 * MiB, 32), 32) == 1


def test_the_default_client_follows_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """native for a plain-HTTP store where its C engine is built (docs/benchmarks.md: the least
    CPU per object and the most MB/s), crt for https where awscrt is installed, classic
    elsewhere; a client the config names is kept."""
    aws = {"url": "s3://bucket/prefix/"}
    plain = {**aws, "endpoint_url": "http://127.0.0.1:9000"}
    secure = {**aws, "endpoint_url": "https://rgw.example.com"}
    assert config_from_dict({"source": aws}).download.client == "crt"
    assert config_from_dict({"source": secure}).download.client == "crt"
    assert config_from_dict({"source": plain}).download.client == "native"
    named = {"source": plain, "download": {"client": "crt"}}
    assert config_from_dict(named).download.client == "crt"
    several = {"sources": [{"name": n, "weight": 1, **plain} for n in ("a", "b")]}
    assert config_from_dict(several).download.client == "native"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert config_from_dict({"source": plain}).download.client == "classic"
    assert config_from_dict({"source": aws}).download.client == "classic"
