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
from prefetchd.write import core
from prefetchd.write.example import FeatureValue, encode_example, sorted_features
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.frames import BATCH_BYTES, Frames


def split_member(name: str) -> tuple[str, str] | None:
    """``("dir/base", "ext.more")`` for ``dir/base.ext.more``; None without an extension."""
    directory, filename = posixpath.split(name)
    base, dot, ext = filename.partition(".")
    if not dot or not base or not ext:
        return None
    return posixpath.join(directory, base), ext


def _example(key: str, sample: dict[str, bytes]) -> bytes:
    return encode_example(_features(key, sample))


def _features(key: str, sample: dict[str, bytes]) -> dict[str, FeatureValue]:
    return {"key": key.encode("utf-8", "surrogateescape"), **sample}


class TarFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        for name, sample in self._samples(key, path):
            yield _example(name, sample)

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The records of ``records``, framed about ``BATCH_BYTES`` of samples per call."""
        batch: list[list[tuple[bytes, FeatureValue]]] = []
        size = 0
        for name, sample in self._samples(key, path):
            batch.append(sorted_features(_features(name, sample)))
            size += sum(len(v) for v in sample.values())
            if size >= BATCH_BYTES:
                yield Frames.of(*core.IMPL.frame_examples(batch))
                batch, size = [], 0
        if batch:
            yield Frames.of(*core.IMPL.frame_examples(batch))

    def _samples(self, key: str, path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
        """Each sample's name and its members' data by extension, in tar order."""
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
                                yield current, sample
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
            yield current, sample
