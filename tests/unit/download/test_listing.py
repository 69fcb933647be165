"""ListObjectsV2 pages read from their XML (``download/listing.py``), without a server: keys
decoded exactly as botocore decodes them, pages chained by their continuation token, and the
errors botocore would raise. The same against moto and SeaweedFS: tests/functional/test_listing.py.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_plus
from xml.sax.saxutils import escape

import botocore.exceptions
import pytest
from botocore.parsers import ResponseParserError

from prefetchd.download.listing import RAW_BODY, Page, list_objects, parse_page, read_page
from prefetchd.download.order import SourceObject

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def page_xml(
    keys: list[tuple[str, int]],
    *,
    encoding: str | None = "url",
    token: str | None = None,
    namespace: str | None = NS,
) -> bytes:
    """A ListBucketResult as S3 writes it (keys URL-encoded with ``encoding="url"``)."""
    contents = "".join(
        f"<Contents><Key>{escape(quote_plus(k, safe='/') if encoding else k)}</Key>"
        f"<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        f"<ETag>&quot;etag-{i}&quot;</ETag><Size>{size}</Size>"
        f"<StorageClass>STANDARD</StorageClass></Contents>"
        for i, (k, size) in enumerate(keys)
    )
    xmlns = f' xmlns="{namespace}"' if namespace else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult{xmlns}>'
        f"<Name>b</Name><Prefix>data/</Prefix><KeyCount>{len(keys)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys>"
        + (f"<EncodingType>{encoding}</EncodingType>" if encoding else "")
        + f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>"
        + (f"<NextContinuationToken>{escape(token)}</NextContinuationToken>" if token else "")
        + f"{contents}</ListBucketResult>"
    ).encode()


ODD = [
    "data/a b+c",
    "data/caf\u00e9 \u65e5\u672c \U0001f600",
    "data/&<>\"'",
    "data/100%25 %",
    "data/x?y#z=1",
]


def test_url_encoded_keys_are_decoded_exactly() -> None:
    page = parse_page(page_xml([(k, n) for n, k in enumerate(ODD)], token="t1"))
    assert [o.key for o in page.objects] == ODD
    assert [o.size for o in page.objects] == list(range(len(ODD)))
    assert page.objects[0].etag == "etag-0"  # quotes stripped, as listed before
    assert page.truncated and page.token == "t1"


def test_keys_of_a_store_that_ignores_encoding_type_are_taken_as_sent() -> None:
    """No ``<EncodingType>`` in the answer: botocore does not decode, and neither do we."""
    keys = ["data/a+b", "data/50%25"]
    page = parse_page(page_xml([(k, 1) for k in keys], encoding=None))
    assert [o.key for o in page.objects] == keys
    assert not page.truncated and page.token is None


def test_a_page_without_the_s3_namespace_is_read_the_same() -> None:
    page = parse_page(page_xml([("data/k", 3)], namespace=None))
    assert page.objects == [SourceObject("data/k", 3, "etag-0")]


def test_an_empty_page() -> None:
    assert parse_page(page_xml([])) == Page([], False, None)


def test_a_page_that_is_not_xml_raises_what_botocore_raises() -> None:
    with pytest.raises(ResponseParserError, match="invalid XML"):
        parse_page(b"<ListBucketResult><Contents>")


def test_a_reply_parsed_by_botocore_reads_the_same() -> None:
    """A client without the hook (botocore gave no ``before-parse``): its parsed fields."""
    reply = {
        "EncodingType": "url",
        "Contents": [{"Key": quote_plus(k, safe="/"), "Size": 2, "ETag": '"e"'} for k in ODD],
        "IsTruncated": True,
        "NextContinuationToken": "t2",
    }
    page = read_page(reply)
    assert [o.key for o in page.objects] == ODD
    assert page.objects[0] == SourceObject(ODD[0], 2, "e")
    assert page.truncated and page.token == "t2"


class FakeClient:
    """Answers ``list_objects_v2`` from ``pages`` (one per call), recording each call's args."""

    def __init__(self, pages: list[bytes]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []
        self.meta = self
        self.events = self

    def register(self, *_: Any, **__: Any) -> None:
        pass

    def list_objects_v2(self, **args: Any) -> dict[str, Any]:
        self.calls.append(args)
        return {RAW_BODY: self.pages[len(self.calls) - 1]}


def test_pages_are_chained_by_their_token_and_read_one_at_a_time() -> None:
    client = FakeClient(
        [page_xml([("data/a", 1)], token="t1"), page_xml([("data/b", 2)], token="t2"), page_xml([])]
    )
    listing = list_objects(client, "bkt", "data/")
    assert next(listing).key == "data/a"
    assert len(client.calls) == 1  # streamed: the next page only when this one is used up
    assert [o.key for o in listing] == ["data/b"]
    assert [c.get("ContinuationToken") for c in client.calls] == [None, "t1", "t2"]
    assert all(c["EncodingType"] == "url" and c["Prefix"] == "data/" for c in client.calls)


def test_the_same_token_twice_stops_the_listing_as_botocores_paginator_does() -> None:
    client = FakeClient([page_xml([("data/a", 1)], token="t1")] * 3)
    with pytest.raises(botocore.exceptions.PaginationError, match="same next token"):
        list(list_objects(client, "bkt", "data/"))
