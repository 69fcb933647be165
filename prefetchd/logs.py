"""Logging set-up shared by every process: one format, and no credentials, ever.

botocore at DEBUG logs the access key id and the full session token, so its loggers (and those
of the HTTP stack under it) are capped at WARNING whatever ``log.level`` says, and a filter
masks any credential found in the environment as a second line of defence.
"""

from __future__ import annotations

import logging
import os
import sys

_NOISY = ("botocore", "boto3", "s3transfer", "urllib3", "awscrt")
_SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


class RedactSecrets(logging.Filter):
    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if len(s) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            if any(s in message for s in self._secrets):
                for secret in self._secrets:
                    message = message.replace(secret, "****")
                record.msg, record.args = message, None
        return True


def redact(text: str) -> str:
    """``text`` with any credential from the environment masked (for status and errors)."""
    for var in _SECRET_VARS:
        secret = os.environ.get(var, "")
        if len(secret) >= 4:
            text = text.replace(secret, "****")
    return text


def setup_logging(level: str, role: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s prefetchd[{role}] %(name)s: %(message)s")
    )
    handler.addFilter(RedactSecrets([os.environ.get(v, "") for v in _SECRET_VARS]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
