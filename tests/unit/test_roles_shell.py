"""The child shell's process names: what ``top`` and ``pgrep -l prefetchd`` show for each
child (the running daemon's are checked in tests/e2e/test_operations.py)."""

from __future__ import annotations

from prefetchd.roles.shell import process_name


def test_each_child_process_is_named_by_its_role_within_the_kernels_15_bytes() -> None:
    assert process_name("downloader") == "prefetchd-dl"
    assert process_name("writer-0") == "prefetchd-w0"
    assert process_name("writer-12") == "prefetchd-w12"
    assert all(len(process_name(f"writer-{i}")) <= 15 for i in range(100_000))
