"""Secrets and hostile keys at the boundaries: ``logs.redact`` masks URL user-info and
environment credentials, ``logs.escape_key`` makes a key one printable line, and the log filter
applies both to every record (regressions: a password in ``endpoint_url`` reached check, the
log, status.json and job.json; a key holding a newline forged a log line)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.config import load_config
from prefetchd.errors import ConfigError
from prefetchd.logs import SafeRecords, escape_key, redact, redact_url


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:s3cretpw@127.0.0.1:9000", "http://****@127.0.0.1:9000"),
        ("https://user@host/path?q=1", "https://****@host/path?q=1"),
        (
            "proxy 'http://bob:p@ss:w@proxy:3128/' refused",
            "proxy 'http://****@proxy:3128/' refused",
        ),
        ("s3://bucket/key@with-at", "s3://bucket/key@with-at"),  # no user-info: unchanged
        ("mail me at a@b.c", "mail me at a@b.c"),
    ],
)
def test_redact_masks_the_user_info_of_any_url(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact_url(text) == shown


def test_redact_masks_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")
    assert redact("signature for wJalrXUtnFEMI failed") == "signature for **** failed"


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("plain/key-1.tfrecord", "plain/key-1.tfrecord"),
        ("a\nb", "a\\nb"),
        ("a\rb", "a\\rb"),
        ("red\x1b[31mtext", "red\\x1b[31mtext"),
        ("rtl\u202eoverride", "rtl\\u202eoverride"),
        ("bad\udcffbyte", "bad\\udcffbyte"),
        ("naïve/日本.txt", "naïve/日本.txt"),
    ],
)
def test_escape_key_gives_one_printable_line(key: str, shown: str) -> None:
    assert escape_key(key) == shown
    assert escape_key(key).isprintable()


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(SafeRecords(["AKIAEXAMPLE"]))
    logger = logging.getLogger("prefetchd.test_logs")
    logger.addHandler(handler)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def test_a_key_cannot_forge_a_log_line(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = logged
    key = "x\n2026-01-01 00:00:00 INFO prefetchd[supervisor] forged: all good\r\x1b[31m"
    logger.error("skipping s3://bucket/%s: %s", key, "gone")
    assert out.getvalue().count("\n") == 1
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_log_records_and_their_tracebacks_are_masked(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    try:
        raise ConnectionError("cannot reach http://u:s3cretpw@host:1 with AKIAEXAMPLE")
    except ConnectionError:
        logger.exception("failed at %s", "http://u:s3cretpw@host:1")
    assert "s3cretpw" not in out.getvalue() and "AKIAEXAMPLE" not in out.getvalue()
    assert "Traceback" in out.getvalue(), "the traceback itself is kept"


def test_credentials_in_endpoint_url_are_refused_without_repeating_them(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "source:\n  url: s3://bucket/p/\n  endpoint_url: http://user:s3cretpw@127.0.0.1:9000\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "source.endpoint_url" in message and "credentials" in message
    assert "s3cretpw" not in message and "user:s3" not in message
