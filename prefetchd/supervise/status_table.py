"""The status table ``prefetchd status`` prints: a readable summary of a status record (is the
trainer waiting on data, and why?), from the record alone (``messages/status_record.py``).
"""

from __future__ import annotations

import time

from prefetchd.logs import escape_key
from prefetchd.messages.counters import Counts, quarantined_by_reason
from prefetchd.messages.status_record import StatusRecord
from prefetchd.sizes import format_size

BAR_WIDTH = 20
MAX_TEXT = 100  # longest key or message shown in the table (the JSON has them whole)


def _integrity(counts: Counts) -> str:
    """Verification figures for the table, shown only when there is something to see."""
    failed, unverified = counts.integrity_failures, counts.objects_unverified
    text = f", {failed} fetches failed verification" if failed else ""
    return text + (f", {unverified} objects checked for size only" if unverified else "")


def _bar(used: float, limit: float, width: int = BAR_WIDTH) -> str:
    frac = 0.0 if limit <= 0 else min(1.0, max(0.0, used / limit))
    filled = round(frac * width)
    return "[" + "#" * filled + "." * (width - filled) + f"] {frac * 100:3.0f}%"


def _safe(text: object, limit: int = MAX_TEXT) -> str:
    """One printable line: object keys and error messages may hold newlines, escapes or
    right-to-left overrides that would garble (or forge lines of) a terminal."""
    out = escape_key(str(text))
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def render_table(status: StatusRecord) -> str:
    """A readable summary of a status record: is the trainer waiting on data, and why?

    Depends only on the record (and the local time zone for error times), so a recorded
    status always renders the same table.
    """
    return "\n".join(
        [
            *_header(status),
            "",
            *_throughput(status),
            *_sources(status),
            "",
            *_budgets(status),
            *_keep(status),
            "",
            *_epochs(status),
            "",
            *_children(status),
            *_errors(status),
        ]
    )


def _header(status: StatusRecord) -> list[str]:
    lines = [
        f"prefetchd {status.state}"
        + (f" ({status.outcome})" if status.outcome else "")
        + (f": {_safe(status.reason, 300)}" if status.reason else "")
        + f"   pid {status.pid or '-'}, up {_duration(status.uptime_s)}"
        + (f", version {status.prefetchd_version}" if status.prefetchd_version else ""),
        f"  config        {_safe(status.config or '?', 300)}",
    ]
    if status.job:
        lines.append(f"  job           {_safe(status.job, 300)}")
    if status.outcome_summary:
        lines.append(f"  outcome       {_safe(status.outcome_summary, 300)}")
    verdict = status.bottleneck
    if verdict is not None:
        lines.append(f"  bottleneck    {verdict.verdict}: {verdict.summary}")
        lines += [f"                - {_safe(e)}" for e in verdict.evidence]
    return lines


def _throughput(s: StatusRecord) -> list[str]:
    counts = s.counts
    return [
        "  throughput    last 10 s       since start",
        f"    download    {s.download_bytes_per_s / 1e6:8.1f} MB/s  "
        f"{s.download_bytes_per_s_avg / 1e6:8.1f} MB/s   "
        f"{counts.objects_downloaded} objects, {format_size(counts.bytes_downloaded)}",
        f"    write       {s.write_records_per_s:8.0f} rec/s "
        f"{s.write_records_per_s_avg:8.0f} rec/s    "
        f"{counts.records_written} records, {counts.shards_written} shards",
        f"    trainers    waiting {_pct(s.consumer_wait_ratio)} of the last 10 s, "
        f"{_duration(s.consumer_wait_s)} in all; "
        f"{s.consumers} reading, {s.consumers_waiting} waiting now",
        f"    writers     blocked on RAM {_pct(s.writer_ram_wait_ratio)} of the last "
        f"10 s, {_duration(s.writer_ram_wait_s)} in all (summed over writers)",
        *([f"    resumed     {_safe(s.trainers_resumed)}"] if s.trainers_resumed else []),
        *([f"    job         {_safe(s.job_resumed)}"] if s.job_resumed else []),
    ]


def _sources(s: StatusRecord) -> list[str]:
    """A line per source of a job of several (``sources:``): weight, share of the epoch's
    bytes downloaded so far, rate, bytes in the window."""
    if not s.sources:
        return []
    width = max(len(src.name) for src in s.sources)
    lines = ["  sources       weight  share   last 10 s     window      this epoch"]
    for src in s.sources:
        share = "   -  " if src.share is None else f"{src.share * 100:5.1f}%"
        lines.append(
            f"    {_safe(src.name):<{width}}  {src.weight * 100:5.1f}%  {share} "
            f"{src.bytes_per_s / 1e6:8.1f} MB/s  {format_size(src.window_bytes):>10}  "
            f"{format_size(src.epoch_bytes_done)} of {format_size(src.epoch_bytes)}"
        )
    return lines


def _budgets(s: StatusRecord) -> list[str]:
    return [
        f"  window        {_bar(s.window_bytes, s.window_limit)}"
        f"  {format_size(s.window_bytes)} of {format_size(s.window_limit)}"
        + (
            f", {format_size(s.window_fetching_bytes)} downloading"
            if s.window_fetching_bytes
            else ""
        ),
        f"  RAM disk      {_bar(s.ram_bytes, s.ram_budget)}"
        f"  {format_size(s.ram_bytes)} of {format_size(s.ram_budget)}",
        f"  shards        {s.shards_ready} ready, {s.shards_claimed} being read",
        *_requests(s),
    ]


def _requests(s: StatusRecord) -> list[str]:
    """Requests in flight allowed now (adaptive), throttling seen, the budgets."""
    if not s.concurrency:
        return []  # a record from before these figures
    budgets = []
    if s.max_requests_per_s:
        budgets.append(f"{s.max_requests_per_s:g} requests/s")
    if s.max_bytes_per_s:
        budgets.append(f"{format_size(s.max_bytes_per_s)}/s")
    budget = (
        f"; budget {', '.join(budgets)}, held back {_duration(s.budget_wait_s)}" if budgets else ""
    )
    limit = s.concurrency_limit or s.concurrency
    return [
        f"  requests      {limit} of {s.concurrency} in flight allowed, "
        f"{s.counts.throttled} throttled{budget}"
    ]


def _keep(s: StatusRecord) -> list[str]:
    """``download.keep``: what is kept, and the share of bytes served from it (per epoch)."""
    if not s.keep_limit:
        return []
    c = s.counts
    ratio = "no object served yet" if s.keep_hit_ratio is None else _pct(s.keep_hit_ratio)
    lines = [
        f"  kept          {_bar(s.keep_bytes, s.keep_limit)}"
        f"  {format_size(s.keep_bytes)} of {format_size(s.keep_limit)}",
        f"    hit ratio   {ratio} of the bytes: {c.keep_hits} objects from disk, "
        f"{c.keep_misses} downloaded, {c.keep_gets_saved} GETs saved"
        + (f", {c.keep_refetched} kept copies failed their check" if c.keep_refetched else ""),
    ]
    for ep in s.keep_epochs:
        epoch_ratio = "-" if ep.hit_ratio is None else _pct(ep.hit_ratio)
        lines.append(
            f"    epoch {ep.epoch:<5} {epoch_ratio:>4} hit  {ep.hits} objects "
            f"({format_size(ep.hit_bytes)}) kept, {ep.misses} ({format_size(ep.miss_bytes)}) "
            "downloaded"
        )
    return lines


def _epochs(s: StatusRecord) -> list[str]:
    total = s.epochs_total
    epoch_text = f"{s.epoch} of {total}" if total else f"{s.epoch} (endless)"
    lines = [
        f"  epoch         {epoch_text}"
        + (f", whole job ETA {_duration(s.job_eta_s)}" if total else "")
    ]
    for ep in s.epochs:
        eta = f"ETA {_duration(ep.eta_s)}" if ep.state == "downloading" else ""
        lines.append(
            f"    epoch {ep.epoch:<5} {_bar(ep.bytes_done, ep.bytes)}  "
            f"{ep.objects_done}/{ep.objects} objects  "
            f"{ep.state} {eta}".rstrip()
        )
    counts = s.counts
    lines.append(f"  retries       {counts.retries}, errors {counts.errors}{_integrity(counts)}")
    lines.extend(_quarantined(counts))
    return lines


def _quarantined(counts: Counts) -> list[str]:
    """The quarantine line of the table, shown only when an object was quarantined."""
    if not counts.objects_quarantined:
        return []
    reasons = quarantined_by_reason(counts)
    text = ", ".join(f"{n} {reason}" for reason, n in reasons.items() if n)
    return [f"  quarantined   {counts.objects_quarantined} objects ({text})"]


def _children(s: StatusRecord) -> list[str]:
    lines = ["  children      state     health      pid       restarts  activity"]
    for name, child in sorted(s.children.items()):
        if not child.alive:
            health = "dead"
        elif child.healthy:
            health = "ok"
        else:
            age = child.heartbeat_age_s
            health = "silent" if age is None else f"silent {_duration(age)}"
        lines.append(
            f"    {name:<12}{child.state:<10}{health:<12}"
            f"{child.pid or '-'!s:<10}{child.restarts:<10}"
            f"{_safe(child.activity or '-', 60)}"
        )
    return lines


def _errors(s: StatusRecord) -> list[str]:
    if not s.last_errors:
        return []
    lines = ["", "  last errors"]
    for err in s.last_errors[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(err.time))
        lines.append(f"    {when} {_safe(err.key or '-')}")
        lines.append(f"             {_safe(err.error)}")
    return lines
