"""``source.addressing_style``: what each value makes both clients put on the wire."""

from __future__ import annotations

from typing import Any

import pytest

from prefetchd.config import config_from_dict
from prefetchd.download.endpoint import endpoint_for
from prefetchd.download.store import make_client
from prefetchd.errors import ConfigError


class _Sent(Exception):
    """Stops a request once its URL is known."""


def classic_url(monkeypatch: pytest.MonkeyPatch, endpoint: str | None, style: str) -> str:
    """The URL of a HEAD bucket request the classic client builds (answered locally)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    source: dict[str, Any] = {"url": "s3://mybucket/p/", "addressing_style": style}
    if endpoint:
        source["endpoint_url"] = endpoint
    client = make_client(config_from_dict({"source": source}))
    sent: list[str] = []

    def record(request: Any, **_: Any) -> None:
        sent.append(request.url)
        raise _Sent  # nothing leaves the process

    client.meta.events.register("before-send.s3", record)
    with pytest.raises(_Sent):
        client.head_bucket(Bucket="mybucket")
    return sent[0]


@pytest.mark.parametrize(
    ("endpoint", "style", "url"),
    [
        ("http://minio.local:9000", "virtual", "http://mybucket.minio.local:9000/"),
        ("http://minio.local:9000", "path", "http://minio.local:9000/mybucket"),
        ("http://minio.local:9000", "auto", "http://minio.local:9000/mybucket"),
        ("http://127.0.0.1:9000", "auto", "http://127.0.0.1:9000/mybucket"),
    ],
)
def test_classic_client_follows_the_style(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, style: str, url: str
) -> None:
    assert classic_url(monkeypatch, endpoint, style) == url


@pytest.mark.parametrize(
    ("endpoint", "style", "host", "path"),
    [
        ("http://minio.local:9000", "virtual", "mybucket.minio.local:9000", "/k"),
        ("http://minio.local:9000/s3", "virtual", "mybucket.minio.local:9000", "/s3/k"),
        ("http://minio.local:9000", "path", "minio.local:9000", "/mybucket/k"),
        ("http://minio.local:9000", "auto", "minio.local:9000", "/mybucket/k"),
        # An IP address cannot carry a bucket: botocore falls back to path-style, and so do we.
        ("http://127.0.0.1:9000", "virtual", "127.0.0.1:9000", "/mybucket/k"),
    ],
)
def test_crt_client_follows_the_style(endpoint: str, style: str, host: str, path: str) -> None:
    found = endpoint_for("mybucket", endpoint, "", style)
    assert (found.host, found.path("k")) == (host, path)


def test_path_style_on_aws_keeps_the_bucket_in_the_path() -> None:
    found = endpoint_for("mybucket", None, "https://s3.eu-west-1.amazonaws.com", "path")
    assert (found.host, found.path("k")) == ("s3.eu-west-1.amazonaws.com", "/mybucket/k")


def test_an_unknown_style_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"source": {"url": "s3://bucket/p/", "addressing_style": "dns"}})
    assert str(err.value) == (
        "source.addressing_style: 'dns' is not allowed: expected one of auto, path, virtual"
    )
