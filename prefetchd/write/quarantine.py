"""Why an object is quarantined: the reasons counted in status, and the exceptions that carry them.

Whatever a parser raises on one object quarantines that object and nothing else (README,
"Formats"). ``classify`` turns any exception into a ``Reason`` and a one-line message: the
reason is the figure it is counted under (``quarantined_by_reason`` in status), the message is
what the log line and ``last_errors`` show. The codes are interface (docs/status.md).
"""

from __future__ import annotations

import enum

from prefetchd.errors import CorruptObject
from prefetchd.sizes import format_size

MAX_RECORD_KEY = "output.max_record_size"
PARSE_TIMEOUT_KEY = "source.parse_timeout"


class Reason(enum.StrEnum):
    """Why an object was quarantined (each one its own figure in status and metrics)."""

    CORRUPT = "corrupt"  # a built-in format cannot read it (damaged, truncated, not its format)
    TOO_LARGE = "too_large"  # a record, line, tar member or raw object over max_record_size
    TIMEOUT = "timeout"  # a plugin spent longer than source.parse_timeout on it
    PLUGIN_ERROR = "plugin_error"  # a plugin raised, or yielded something that is not bytes


class RecordTooLarge(CorruptObject):
    """One record (line, tar sample, raw object) is larger than ``output.max_record_size``;
    raised while streaming, before its bytes are held. ``exact``: ``size`` is the record's
    size, not just how much of it was seen."""

    def __init__(self, key: str, what: str, size: int, limit: int, *, exact: bool = False) -> None:
        more = "" if exact else " or more"
        super().__init__(
            key,
            f"{what} of {format_size(size)} ({size} bytes){more} is over "
            f"{MAX_RECORD_KEY} = {format_size(limit)}",
        )
        self.size = size
        self.limit = limit


class ParseTimeout(CorruptObject):
    """A format plugin ran longer than ``source.parse_timeout`` on one object."""

    def __init__(self, key: str, spec: str, limit: float, *, killed: int = 0) -> None:
        what = f"ran over {PARSE_TIMEOUT_KEY} = {limit:g} s"
        if killed:
            what = f"never finished it: it hung until its writer was killed, {killed} times"
        super().__init__(key, f"{spec} {what}")


class PluginError(CorruptObject):
    """A format plugin raised (any exception type) or yielded a value that is not bytes."""


def classify(exc: BaseException) -> tuple[Reason, str]:
    """``(reason, message)`` for an exception raised while parsing one object. A built-in
    parser's unexpected exception (a ``ValueError`` from ``tarfile``, say) is input it could
    not read: ``corrupt``, with the exception's type in the message."""
    if isinstance(exc, RecordTooLarge):
        return Reason.TOO_LARGE, exc.reason
    if isinstance(exc, ParseTimeout):
        return Reason.TIMEOUT, exc.reason
    if isinstance(exc, PluginError):
        return Reason.PLUGIN_ERROR, exc.reason
    if isinstance(exc, CorruptObject):
        return Reason.CORRUPT, exc.reason
    return Reason.CORRUPT, f"unreadable: {type(exc).__name__}: {exc}"
