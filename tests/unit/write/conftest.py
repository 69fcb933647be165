"""Fixtures of the writer tests: ``clock``, the writer module's ``time`` replaced by a
``FakeClock``."""

from __future__ import annotations

import pytest

from prefetchd.write import writer as writer_module
from tests.unit.write.writerkit import FakeClock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(writer_module, "time", fake)
    return fake
