"""What a GET that failed means, for the clients that read the store's answers themselves
(``crt``, ``native``): ``client_error`` turns a status and an S3 XML error body into the
``ClientError`` botocore would have raised, so ``store.classify()`` and ``store.describe()``
treat every client alike, and ``report_outcome`` tells the signals (adaptive limit, store
health) how a request ended."""

from __future__ import annotations

import errno
import re
from typing import Any

import botocore.exceptions

from prefetchd.download.hooks import trouble
from prefetchd.download.signals import Signals
from prefetchd.download.store import is_throttling
from prefetchd.download.verify import SizeChanged

# An S3 error body is XML; only its Code and Message are kept (never the request it echoes).
_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,512})</Message>")
# When the body names no code, the status decides, as ``store.classify()`` expects.
STATUS_CODES = {403: "AccessDenied", 404: "NoSuchKey", 412: "PreconditionFailed"}


def client_error(status: int, body: bytes | None, fallback: str = "") -> BaseException:
    """The ``ClientError`` of a GetObject answered with ``status`` and error ``body``;
    ``fallback`` is the code when neither the body nor the status names one."""
    code = _CODE.search(body or b"")
    message = _MESSAGE.search(body or b"")
    response: Any = {  # the subset of botocore's parsed error that store.py reads
        "Error": {
            "Code": _text(code) if code else STATUS_CODES.get(status) or fallback or str(status),
            "Message": _text(message) if message else "",
        },
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "GetObject")


def _text(match: re.Match[bytes]) -> str:
    return match.group(1).decode("utf-8", "replace")


def report_outcome(signals: Signals, error: BaseException | None) -> None:
    """Tell the adaptive limit and the store's health how an object's request ended."""
    if error is None:
        signals.health.answered()
        signals.limit.success()
        return
    if is_throttling(error):
        signals.limit.throttle()
    if isinstance(error, botocore.exceptions.ClientError):
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if status >= 500 and not _slowed(error):
            signals.health.failed(f"HTTP {status}")
        else:
            signals.health.answered()
    elif not _ours(error):
        signals.health.failed(trouble(error))


def _ours(error: BaseException) -> bool:
    """A failure on this side, not the store's: no credentials, a full disk, a stale size."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return isinstance(error, botocore.exceptions.NoCredentialsError | SizeChanged)


def _slowed(error: botocore.exceptions.ClientError) -> bool:
    return str(error.response.get("Error", {}).get("Code", "")) == "SlowDown"
