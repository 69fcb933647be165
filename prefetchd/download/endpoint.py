"""Where a transfer client's requests go (pure but for ``resolved_url``): the Host header, TLS or
not, and each key's path, from ``source.endpoint_url`` or the URL botocore resolves for the
region, with ``source.addressing_style``. Shared by the clients that build their own requests
(``crt``, ``native``); botocore does this itself for ``classic``."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import botocore.session

from prefetchd.errors import ConfigError
from prefetchd.logs import redact_url


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: the Host header (with the port, if the URL names one; the CRT connects
    to it), TLS or not, and what every key's path starts with ("/bucket" or "/prefix/bucket"
    for path-style addressing, "" for a virtual-hosted bucket)."""

    host: str
    tls: bool
    base_path: str

    def path(self, key: str) -> str:
        return f"{self.base_path}/{quote(key, safe='/~')}"  # botocore quotes keys the same way


def endpoint_for(
    bucket: str, endpoint_url: str | None, resolved_url: str, style: str = "auto"
) -> Endpoint:
    """``endpoint_url`` (any S3-compatible store) or, when it is None, the URL botocore resolved
    for the region. ``style`` is ``source.addressing_style`` and means what it means to botocore:
    auto is virtual-hosted on AWS when the bucket name allows it and path-style for an
    ``endpoint_url``; virtual puts the bucket in the host name except for an IP address, where
    botocore uses path-style too."""
    url = urlsplit(endpoint_url or resolved_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"source.endpoint_url: {redact_url(url.geturl())!r} is not an http(s) URL"
        )
    try:
        url.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ConfigError(
            f"source.endpoint_url: {redact_url(url.geturl())!r} has an invalid port"
        ) from None
    host = url.netloc.rpartition("@")[2]  # keeps [v6] brackets and :port
    prefix = url.path.rstrip("/")
    aws = endpoint_url is None and url.hostname.endswith((".amazonaws.com", ".amazonaws.com.cn"))
    auto_virtual = style == "auto" and aws and "." not in bucket and not prefix
    if auto_virtual or (style == "virtual" and not _is_ip(url.hostname)):
        return Endpoint(f"{bucket}.{host}", url.scheme == "https", prefix)
    return Endpoint(host, url.scheme == "https", f"{prefix}/{bucket}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def resolved_url(session: botocore.session.Session, region: str) -> str:
    """The S3 endpoint botocore would use for ``region`` (partitions, AWS_ENDPOINT_URL...)."""
    client = session.create_client("s3", region_name=region)
    try:
        return str(client.meta.endpoint_url)
    finally:
        client.close()
