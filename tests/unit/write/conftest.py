"""Fixtures of the writer tests: ``clock``, the ``time`` of the writer's modules that read the
clock (its arrivals and its flush clock) replaced by one ``FakeClock``."""

from __future__ import annotations

import pytest

from prefetchd.write import arrivals, flush
from tests.unit.write.writerkit import FakeClock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    for module in (arrivals, flush):
        monkeypatch.setattr(module, "time", fake)
    return fake
