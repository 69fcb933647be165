"""The downloader's listing against real S3 servers (moto, and SeaweedFS when ``weed`` is
installed): ListObjectsV2 pages read from their XML give exactly what botocore's own parser
gives (keys with odd characters included), page after page, without botocore parsing a page,
and with the same one-line errors.

SeaweedFS is the session's (``seaweedfs`` in tests/conftest.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import botocore.parsers
import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.download.listing import list_objects
from prefetchd.download.order import SourceObject
from prefetchd.download.store import boot_failure, list_share, make_client
from testkit import sample_data

PREFIX = "data/"
# Keys that need escaping in XML or in URLs, outside ASCII, or outside what XML 1.0 can carry.
ODD_KEYS = [
    "data/plain.bin",
    "data/with space and+plus",
    "data/amp&lt<gt>quote\"apos'",
    "data/percent%20and%25",
    "data/query?hash#eq=semi;colon:comma,at@dollar$",
    "data/caf\u00e9/\u65e5\u672c\u8a9e/\U0001f600.bin",
    "data/tab\there",
    "data/cr\rand-esc\x1b[31m",
    "data/line-sep\u2028para-sep\u2029",
    "data/deep/a/b/c/d.bin",
    "data/trailing-space ",
]
OUTSIDE = ["dat", "data", "datax/near-prefix", "other/data/x"]  # not under "data/"


@pytest.fixture(params=["moto", "seaweedfs"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, str]]:
    """``(endpoint, client, bucket)``: a fresh bucket on the store, emptied afterwards."""
    endpoint = request.getfixturevalue("s3_endpoint" if request.param == "moto" else "seaweedfs")
    client = sample_data.make_client(endpoint)
    bucket = f"listing-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield endpoint, client, bucket
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", ()):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def source_config(endpoint: str, bucket: str) -> Config:
    return config_from_dict(
        {
            "source": {
                "url": f"s3://{bucket}/{PREFIX}",
                "endpoint_url": endpoint,
                "region": "us-east-1",
                "addressing_style": "path",
            }
        }
    )


def put(client: Any, bucket: str, keys: list[str]) -> None:
    for i, key in enumerate(keys):
        client.put_object(Bucket=bucket, Key=key, Body=b"x" * (i + 1))


def botocore_listing(client: Any, bucket: str, page_size: int = 1000) -> list[SourceObject]:
    """What botocore's paginator and parser make of the same listing: the reference."""
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=PREFIX, PaginationConfig={"PageSize": page_size}
    )
    return [
        SourceObject(item["Key"], item["Size"], item["ETag"].strip('"'))
        for page in pages
        for item in page.get("Contents", ())
    ]


def test_odd_keys_round_trip_exactly(store: tuple[str, Any, str]) -> None:
    endpoint, client, bucket = store
    put(client, bucket, ODD_KEYS + OUTSIDE)
    config = source_config(endpoint, bucket)
    listed = list(list_share(make_client(config), config))
    assert sorted(o.key for o in listed) == sorted(ODD_KEYS)
    assert listed == botocore_listing(client, bucket)
    sizes = {o.key: o.size for o in listed}
    assert sizes == {k: i + 1 for i, k in enumerate(ODD_KEYS)}


def test_a_listing_of_many_pages_is_whole_and_in_order(store: tuple[str, Any, str]) -> None:
    endpoint, client, bucket = store
    keys = [f"{PREFIX}{i:03d}-\u00e9 &+.bin" for i in range(23)]
    put(client, bucket, [*keys, *OUTSIDE])
    requests: list[dict[str, Any]] = []
    lister = make_client(source_config(endpoint, bucket))
    lister.meta.events.register(
        "before-call.s3.ListObjectsV2", lambda params, **_: requests.append(params)
    )
    listed = list(list_objects(lister, bucket, PREFIX, page_size=5))
    assert [o.key for o in listed] == keys
    assert listed == botocore_listing(client, bucket, page_size=5)
    assert len(requests) == 5  # 23 keys, 5 a page: streamed page by page


def test_a_page_is_read_without_botocores_parser(
    s3_endpoint: str, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up CPU guard (docs/benchmarks.md): botocore builds no XML tree of a page."""
    put(s3_client, bucket, [f"{PREFIX}{i}" for i in range(12)])
    trees = []
    real = vars(botocore.parsers.BaseXMLResponseParser)["_parse_xml_string_to_dom"]

    def counted(self: Any, xml: bytes) -> Any:
        trees.append(len(xml))
        return real(self, xml)

    monkeypatch.setattr(botocore.parsers.BaseXMLResponseParser, "_parse_xml_string_to_dom", counted)
    config = source_config(s3_endpoint, bucket)
    lister = make_client(config)
    assert len(list(list_objects(lister, bucket, PREFIX, page_size=4))) == 12
    assert trees == []
    assert len(botocore_listing(s3_client, bucket, page_size=4)) == 12
    assert len(trees) >= 3  # the reference does parse each page: the spy sees parsing


def test_a_missing_bucket_is_the_same_one_line_failure(s3_endpoint: str) -> None:
    config = source_config(s3_endpoint, f"missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(Exception) as caught:
        list(list_share(make_client(config), config))
    failure = boot_failure(config, caught.value)
    assert str(failure) == (f"bucket {config.source.bucket!r} does not exist ({config.source.url})")


def test_listing_progress_is_counted_per_page_and_at_the_end(
    s3_endpoint: str, s3_client: Any, bucket: str
) -> None:
    put(s3_client, bucket, [f"{PREFIX}{i:02d}" for i in range(5)])
    config = source_config(s3_endpoint, bucket)
    heard: list[int] = []
    assert len(list(list_share(make_client(config), config, listed=heard.append))) == 5
    assert heard == [5]  # fewer than a page: once, at the end
