"""Issue #12 bar 2: the downloader keeps what its start-up built out of later garbage collections
(``gc.freeze``), and collects the garbage of start-up first, so nothing unreachable is kept."""

from __future__ import annotations

import gc
import weakref

from prefetchd.download.downloader import _freeze_boot_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_start_up_garbage_is_collected_and_the_rest_is_frozen() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    kept = _Node()
    try:
        _freeze_boot_heap()
        assert gone() is None  # collected before the freeze, not kept for ever
        assert gc.get_freeze_count() > 0  # the live heap (this test's objects too) is frozen
        assert not any(obj is kept for gen in range(3) for obj in gc.get_objects(gen))
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
