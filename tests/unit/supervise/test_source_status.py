"""Each source of a job of several (``sources:``) in ``prefetchd status`` and the metrics."""

from __future__ import annotations

from prefetchd.messages.source_status import SourceStatus
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.metrics import StatusCollector
from prefetchd.supervise.status_table import render_table

SOURCES = (
    SourceStatus("web", 0.6, 10, 6_000_000, 2_000_000.0, 3 * 2**20, 12_000_000, 6_000_000, 0.6),
    SourceStatus("books", 0.4, 4, 4_000_000, 1_000_000.0, 2**20, 8_000_000, 4_000_000, 0.4),
)


def test_the_table_has_a_line_per_source() -> None:
    lines = render_table(StatusRecord("running", sources=SOURCES)).splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("  sources"))
    web, books = lines[at + 1], lines[at + 2]
    assert web.split()[:3] == ["web", "60.0%", "60.0%"] and "2.0 MB/s" in web
    assert books.split()[0] == "books" and "3.0 MiB" in web
    assert not [ln for ln in render_table(StatusRecord("running")).splitlines() if "sources" in ln]


def test_the_metrics_carry_a_source_label() -> None:
    samples = {
        (s.name, tuple(s.labels.items())): s.value
        for m in StatusCollector(lambda: StatusRecord("running", sources=SOURCES)).collect()
        for s in m.samples
    }
    assert samples[("prefetchd_source_downloaded_bytes_total", (("source", "web"),))] == 6e6
    assert samples[("prefetchd_source_share", (("source", "books"),))] == 0.4
    assert samples[("prefetchd_source_window_bytes", (("source", "web"),))] == 3 * 2**20
    assert samples[("prefetchd_source_weight", (("source", "web"),))] == 0.6
    assert samples[("prefetchd_source_bytes_per_second", (("source", "books"),))] == 1e6
