"""ListObjectsV2, page by page, read straight from the XML the store sent.

botocore turns every page into dicts with its generic, model-driven parser, in Python, field by
field: on a bucket of many small objects that was most of the CPU the downloader spent before
its first GET (docs/benchmarks.md, "Start-up CPU"). Here each request is still botocore's
(signed, retried by its "standard" mode, an error answer parsed and raised as ``ClientError``,
so ``store.classify``/``describe``/``boot_failure`` see what they always saw), but the body of a
successful page is taken before botocore parses it (its ``before-parse`` event) and read with
ElementTree's C parser straight over ``<Contents>``.

Keys are requested URL-encoded (``EncodingType=url``, as botocore asks on its own), so every
key round-trips exactly, also characters XML 1.0 cannot carry (control characters, a lone
CR); they are decoded as botocore decodes them (``unquote_plus``), and only when the page says
``<EncodingType>url</EncodingType>`` (a store that ignores the parameter sends keys as they
are). Memory: one page (at most 1000 keys) at a time, whatever the bucket holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus
from xml.etree import ElementTree

import botocore.exceptions
from botocore.parsers import ResponseParserError

from prefetchd.download.order import SourceObject

S3Client = Any  # boto3's client type is generated at run time
RAW_BODY = "PrefetchdListingXml"  # the page's XML, in the reply, in place of botocore's dicts
_EVENT = "before-parse.s3.ListObjectsV2"
_HANDLER_ID = "prefetchd-raw-listing"


@dataclass(frozen=True)
class Page:
    """One ListObjectsV2 answer: its objects in the order listed, and where the next starts."""

    objects: list[SourceObject]
    truncated: bool
    token: str | None  # NextContinuationToken


def list_objects(
    client: S3Client, bucket: str, prefix: str, *, page_size: int | None = None
) -> Iterator[SourceObject]:
    """Every object under ``prefix``, streamed one page at a time (``page_size`` keys, default
    the store's, 1000 on S3). Raises what botocore raises for a failed request
    (``ClientError``, ``EndpointConnectionError``...), ``PaginationError`` if the store hands
    out the same continuation token twice (as botocore's paginator does), and
    ``ResponseParserError`` for a page that is not XML."""
    keep_raw_pages(client)
    token: str | None = None
    while True:
        args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "EncodingType": "url"}
        if page_size is not None:
            args["MaxKeys"] = page_size
        if token is not None:
            args["ContinuationToken"] = token
        page = read_page(client.list_objects_v2(**args))
        yield from page.objects
        if not page.truncated or not page.token:
            return
        if page.token == token:
            raise botocore.exceptions.PaginationError(
                message=f"The same next token was received twice: {token}"
            )
        token = page.token


def keep_raw_pages(client: S3Client) -> None:
    """Make ``client``'s successful ListObjectsV2 replies carry the page's XML under
    ``RAW_BODY`` instead of parsed ``Contents`` (idempotent; other operations are unchanged)."""
    client.meta.events.register(_EVENT, _take_body, unique_id=_HANDLER_ID)


def _take_body(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    """botocore's ``before-parse`` hook: a 200's body moves to the reply untouched, and the
    parser is left an empty body (it then reads only the headers). Errors are parsed as ever."""
    if response_dict.get("status_code") == 200 and isinstance(response_dict.get("body"), bytes):
        customized_response_dict[RAW_BODY] = response_dict["body"]
        response_dict["body"] = b""


def read_page(reply: dict[str, Any]) -> Page:
    """The page of a ``list_objects_v2`` reply: from its XML when ``keep_raw_pages`` took it,
    else (a client without the hook) from botocore's parsed fields, decoded the same way."""
    body = reply.get(RAW_BODY)
    if isinstance(body, bytes):
        return parse_page(body)
    decode = _decoder(reply.get("EncodingType"))
    objects = [
        SourceObject(decode(item["Key"]), int(item["Size"]), _etag(item.get("ETag")))
        for item in reply.get("Contents", ())
    ]
    return Page(objects, bool(reply.get("IsTruncated")), reply.get("NextContinuationToken"))


def parse_page(body: bytes) -> Page:
    """One ListObjectsV2 result document (pure). Raises ``ResponseParserError`` if it is not
    XML, ``ValueError`` if an object has no valid ``Size``."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise ResponseParserError(
            f"Unable to parse the ListObjectsV2 response ({exc}), invalid XML received"
        ) from None
    ns = root.tag[: root.tag.find("}") + 1]  # "{http://s3.amazonaws.com/doc/2006-03-01/}" or ""
    decode = _decoder(root.findtext(ns + "EncodingType"))
    key, size, etag = ns + "Key", ns + "Size", ns + "ETag"
    objects = [
        SourceObject(
            decode(c.findtext(key, "")), int(c.findtext(size, "")), _etag(c.findtext(etag))
        )
        for c in root.iterfind(ns + "Contents")
    ]
    truncated = (root.findtext(ns + "IsTruncated") or "").strip().lower() == "true"
    return Page(objects, truncated, root.findtext(ns + "NextContinuationToken") or None)


def _decoder(encoding: object) -> Callable[[str], str]:
    return unquote_plus if encoding == "url" else _as_is


def _as_is(text: str) -> str:
    return text


def _etag(raw: str | None) -> str | None:
    return raw.strip('"') if raw else None
