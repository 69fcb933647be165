"""Logging set-up shared by every process: one format, no credentials, one line per event.

botocore at DEBUG logs the access key id and the full session token, so its loggers (and those
of the HTTP stack under it) are capped at WARNING whatever ``log.level`` says, and a filter
masks any credential found in the environment, and the user-info of any URL
(``http://user:password@host`` -> ``http://****@host``), as a second line of defence.

``redact`` is the one function every boundary uses for text that leaves the process (log
lines, status, job files, error messages, ``check``); ``escape_key`` is the one function that
formats an object key for a log line or a table, so a key holding newlines, ANSI escapes or
undecodable bytes cannot forge a log line or repaint a terminal.
"""

from __future__ import annotations

import logging
import os
import re
import sys

_NOISY = ("botocore", "boto3", "s3transfer", "urllib3", "awscrt")
_SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# scheme://user-info@ : what precedes the host in any URL (RFC 3986), ended by the last "@"
# before the path, so a password holding "@" or ":" is masked whole.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")


class SafeRecords(logging.Filter):
    """Every record as one line without credentials: environment secrets and URL user-info
    masked, control characters of the message (an object key's newline, CR or ANSI escape)
    escaped, so nothing in the data can forge a log line. A traceback (``exc_info``) stays
    multi-line, masked."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if len(s) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = escape_key(_mask(message, self._secrets))
        if safe != message:
            record.msg, record.args = safe, None
        if record.exc_info and not record.exc_text:  # a traceback quotes messages too
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _mask(record.exc_text, self._secrets)
        return True


def redact(text: str) -> str:
    """``text`` with any credential from the environment and the user-info of any URL masked
    (``http://user:pw@host`` -> ``http://****@host``): for logs, status, job files, errors."""
    return _mask(text, [os.environ.get(var, "") for var in _SECRET_VARS])


def redact_url(url: str) -> str:
    """``url`` without its user-info, for showing a configured URL."""
    return _USERINFO.sub(r"\1****@", url)


def _mask(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "****")
    return _USERINFO.sub(r"\1****@", text) if "@" in text else text


def escape_key(key: str) -> str:
    """An object key as one printable line: control characters (newlines, ESC, DEL, C1),
    Unicode format characters (bidi overrides) and lone surrogates (undecodable bytes) are
    written as Python escapes (``\\n``, ``\\x1b``, ``\\u202e``, ``\\udcff``). Every log line and
    table that shows a key uses this."""
    if key.isprintable():
        return key  # the common case, without building a new string
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)


def setup_logging(level: str, role: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s prefetchd[{role}] %(name)s: %(message)s")
    )
    handler.addFilter(SafeRecords([os.environ.get(v, "") for v in _SECRET_VARS]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
