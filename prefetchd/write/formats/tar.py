"""``tar``: WebDataset-style tar shards; files sharing a basename form one sample.

A member ``dir/n01440764_10026.cls`` belongs to the sample ``dir/n01440764_10026`` with the
extension ``cls`` (everything after the first dot of the file name, as WebDataset splits it:
``a.seg.png`` is extension ``seg.png``). Each sample becomes one tf.train.Example with
``key`` (the sample's name) and one bytes feature per extension. A sample's members must be
adjacent in the tar, as WebDataset writes them. Directories, links and members without an
extension are skipped. The tar is read as a stream (``.tar.gz``/``.tar.zst`` too): memory is
one sample.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterator

from prefetchd.errors import CorruptObject
from prefetchd.write.example import encode_example
from prefetchd.write.formats.compressed import open_object


def split_member(name: str) -> tuple[str, str] | None:
    """``("dir/base", "ext.more")`` for ``dir/base.ext.more``; None without an extension."""
    directory, filename = posixpath.split(name)
    base, dot, ext = filename.partition(".")
    if not dot or not base or not ext:
        return None
    return posixpath.join(directory, base), ext


def _example(key: str, sample: dict[str, bytes]) -> bytes:
    return encode_example({"key": key.encode("utf-8", "surrogateescape"), **sample})


class TarFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        current: str | None = None
        sample: dict[str, bytes] = {}
        with open_object(key, path) as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for member in tar:
                        parts = split_member(member.name) if member.isreg() else None
                        if parts is None:
                            continue
                        name, ext = parts
                        if ext == "key":
                            raise CorruptObject(key, f"member {member.name!r}: 'key' is reserved")
                        if name != current:
                            if current is not None:
                                yield _example(current, sample)
                            current, sample = name, {}
                        if ext in sample:
                            raise CorruptObject(
                                key, f"member {member.name!r} appears twice in sample {name!r}"
                            )
                        data = tar.extractfile(member)
                        assert data is not None  # a regular file always has data
                        sample[ext] = data.read()
            except tarfile.TarError as exc:
                raise CorruptObject(key, f"not a valid tar file: {exc}") from None
        if current is not None:
            yield _example(current, sample)
