"""``tar``: WebDataset-style tar shards; files sharing a basename form one sample.

A member ``dir/n01440764_10026.cls`` belongs to the sample ``dir/n01440764_10026`` with the
extension ``cls`` (everything after the first dot of the file name, as WebDataset splits it:
``a.seg.png`` is extension ``seg.png``). Each sample becomes one tf.train.Example with
``key`` (the sample's name) and one bytes feature per extension. A sample's members must be
adjacent in the tar, as WebDataset writes them. Directories, links and members without an
extension are skipped. The tar is read as a stream (``.tar.gz``/``.tar.zst`` too): memory is
one sample (and a 1 MiB chunk).

Two readers give the same Examples in the same order. The fast one (``frames``) hands ~1 MiB
chunks of the stream to the record kernel's ``frame_tar``, which parses the 512-byte headers,
groups members and frames every complete sample in one call; the rest of a chunk (an
incomplete sample) is carried into the next one. Whatever it does not read exactly as
``tarfile`` does — pax or GNU headers, a bad checksum, damage, a name the checks below reject
— sends the object to the reference reader (``tarfile_samples``, Python's ``tarfile``), which
skips the samples already framed: such tars cost what they always did, and give what they
always gave. Real WebDataset output often has a pax header per member (WebDataset's writer
stores a float ``mtime``), and then takes that slower path.

The writer reads an object through once before its first record is taken (to quarantine a
bad one with none of its records delivered): ``check`` makes that pass cheap. It is the walk
of ``frames`` with every rule and decision the same, but the kernel's ``check_tar`` only reads
the headers and sizes (no Examples, no CRCs); where the fast reader gives up, the reference
reader checks the rest exactly as ``frames`` reads it. So it raises what ``frames`` raises.

Limits: a sample whose members hold more than ``output.max_record_size`` bytes raises
``RecordTooLarge`` from the member header, before its data is read; so does a pax or GNU
long-name header that large (``tarfile`` would read it whole). The fast reader leaves a batch
holding a frame over the limit, or a sample it would need more than the limit (and a chunk) to
hold, to the reference reader, which measures every sample exactly.

Names that are not UTF-8: the sample's ``key`` is a bytes value, so it holds the member
name's bytes as they are. An extension is a feature *name*, which protobuf requires to be UTF-8
(``tf.train.Example.FromString`` rejects anything else), so it is escaped reversibly
(``feature_name``): ``%`` becomes ``%25`` and every byte that is not part of valid UTF-8
becomes ``%XX`` (two upper-case hex digits); an extension of valid UTF-8 without ``%`` is
unchanged. ``urllib.parse.unquote_to_bytes(name)`` gives the extension's bytes back.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar, cast

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE
from prefetchd.errors import CorruptObject
from prefetchd.kernel import choice
from prefetchd.kernel.example_encode import FeatureValue, encode_example, sorted_features
from prefetchd.kernel.protocol import TAR_END
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.frames import BATCH_BYTES, Frames
from prefetchd.write.quarantine import RecordTooLarge

log = logging.getLogger(__name__)
T = TypeVar("T")

# tarfile decodes names with the file system encoding; the fast reader assumes UTF-8
UTF8_NAMES = codecs.lookup(tarfile.ENCODING).name == "utf-8"


def split_member(name: str) -> tuple[str, str] | None:
    """``("dir/base", "ext.more")`` for ``dir/base.ext.more``; None without an extension."""
    directory, filename = posixpath.split(name)
    base, dot, ext = filename.partition(".")
    if not dot or not base or not ext:
        return None
    return posixpath.join(directory, base), ext


def feature_name(ext: str) -> str:
    """The feature name for the extension ``ext`` (decoded from the member name's bytes with
    ``surrogateescape``): valid UTF-8 for protobuf, reversibly. ``%`` is written ``%25`` and
    each byte that is not part of valid UTF-8 (a lone surrogate escape here) ``%XX``; the
    rest as it is. ``urllib.parse.unquote_to_bytes`` undoes it."""
    if "%" not in ext and _is_utf8(ext):
        return ext
    out: list[str] = []
    for char in ext:
        code = ord(char)
        if char == "%":
            out.append("%25")
        elif 0xDC80 <= code <= 0xDCFF:  # a byte surrogateescape could not decode
            out.append(f"%{code - 0xDC00:02X}")
        elif 0xD800 <= code <= 0xDFFF:  # any other lone surrogate: its bytes, escaped
            out.extend(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
        else:
            out.append(char)
    return "".join(out)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _example(key: str, sample: dict[str, bytes]) -> bytes:
    return encode_example(_features(key, sample))


def _features(key: str, sample: dict[str, bytes]) -> dict[str, FeatureValue]:
    return {"key": key.encode("utf-8", "surrogateescape"), **sample}


class TarFormat:
    def __init__(self, max_record_size: int = DEFAULT_MAX_RECORD_SIZE) -> None:
        self.max_record_size = max_record_size

    def records(self, key: str, path: str) -> Iterator[bytes]:
        """The reference reader's Examples, one at a time (the writer uses ``frames``)."""
        return tarfile_records(key, path, self.max_record_size)

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The Examples of ``records``, framed, ~1 MiB of stream per batch: the fast reader's,
        then (if it gave up) the reference reader's from where it stopped. Raises what
        ``records`` raises; a batch the error cuts short is not yielded."""
        scan = _FastScan(self.max_record_size)
        if UTF8_NAMES:
            yield from scan.frames(key, path)
        if not scan.complete:
            log.debug("%s: read with tarfile from sample %d on", key, scan.samples)
            yield from _tarfile_frames(key, path, scan.samples, self.max_record_size)

    def check(self, key: str, path: str) -> Iterator[int]:
        """Read the object through as ``frames`` does, raising what it raises, but keep
        nothing: how many records each step passed. The fast reader only walks the headers
        (``check_tar``: no Examples, no CRCs); where it gives up, the reference reader checks
        the rest exactly as ``frames`` reads it."""
        scan = _FastScan(self.max_record_size)
        if UTF8_NAMES:
            yield from scan.checks(key, path)
        if not scan.complete:
            log.debug("%s: checked with tarfile from sample %d on", key, scan.samples)
            for frames in _tarfile_frames(key, path, scan.samples, self.max_record_size):
                yield len(frames)


# One pass of the fast reader over a chunk: what it hands on, how many samples that is, the
# largest frame among them, how much of the chunk it used, and its status (``frame_tar``'s)
_Step = Callable[[bytes, bool, bool], tuple[T, int, int, int, int]]


def _framed(buf: bytes, final: bool, at_start: bool) -> tuple[Frames, int, int, int, int]:
    data, ends, used, status = choice.KERNEL.frame_tar(buf, final, at_start)
    batch = Frames.of(data, ends)
    return batch, len(batch), batch.largest(), used, status


def _checked(buf: bytes, final: bool, at_start: bool) -> tuple[int, int, int, int, int]:
    samples, largest, used, status = choice.KERNEL.check_tar(buf, final, at_start)
    return samples, samples, largest, used, status


class _FastScan:
    """One pass of ``frame_tar`` (or ``check_tar``) over an object: how many samples it read,
    and whether it read the whole tar (else the reference reader takes over)."""

    def __init__(self, limit: int = DEFAULT_MAX_RECORD_SIZE) -> None:
        self.samples = 0
        self.complete = False
        self.limit = limit  # output.max_record_size

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The framed samples, ~1 MiB of stream per batch."""
        return self._walk(key, path, _framed)

    def checks(self, key: str, path: str) -> Iterator[int]:
        """The walk of ``frames`` with every decision the same, but no frames built: how many
        samples each batch would hold."""
        return self._walk(key, path, _checked)

    def _walk(self, key: str, path: str, step: _Step[T]) -> Iterator[T]:
        try:
            with open_object(key, path, buffered=False) as f:
                pending, at_start, need = b"", True, BATCH_BYTES
                while True:
                    # a sample longer than a chunk grows the read to what it needs
                    chunk = f.read(max(BATCH_BYTES, need - len(pending)))
                    buf = pending + chunk if pending else chunk
                    batch, count, largest, used, status = step(buf, not chunk, at_start)
                    if largest > self.limit:
                        return  # a sample this large: the reference reader measures it
                    rest, chunk, buf = buf[used:], b"", b""  # not held while the batch is
                    if count:
                        self.samples += count
                        yield batch
                    if status <= 0:
                        self.complete = status == TAR_END
                        return
                    if status > self.limit + BATCH_BYTES:
                        return  # a sample this large: the reference reader measures it
                    pending, need, at_start = rest, status, at_start and used == 0
        except CorruptObject:
            return  # damaged compressed data: the reference reader fails on it as it always did


def _tarfile_frames(key: str, path: str, skip: int, limit: int) -> Iterator[Frames]:
    """The samples of ``tarfile_samples`` after the first ``skip``, framed ~1 MiB per call."""
    batch: list[list[tuple[bytes, FeatureValue]]] = []
    size = 0
    for name, sample in itertools.islice(tarfile_samples(key, path, limit), skip, None):
        batch.append(sorted_features(_features(name, sample)))
        size += sum(len(v) for v in sample.values())
        if size >= BATCH_BYTES:
            yield Frames.of(*choice.KERNEL.frame_examples(batch))
            batch, size = [], 0
    if batch:
        yield Frames.of(*choice.KERNEL.frame_examples(batch))


def tarfile_records(key: str, path: str, limit: int = DEFAULT_MAX_RECORD_SIZE) -> Iterator[bytes]:
    """The reference: each sample of ``tarfile_samples`` as a serialized Example."""
    for name, sample in tarfile_samples(key, path, limit):
        yield _example(name, sample)


class _HeaderBound:
    """The stream ``tarfile`` reads, refusing to feed it more than ``limit`` (and a block)
    bytes between two members: ``tarfile`` reads a pax or GNU long-name header whole, so a
    huge one would otherwise be held in memory before any member is seen."""

    def __init__(self, key: str, stream: BinaryIO, limit: int) -> None:
        self.key, self.stream, self.limit = key, stream, limit
        self.since_member = 0
        self.allowed = 0  # the data of the current member, which is read after its header

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.since_member += len(data)
        if self.since_member > self.allowed + self.limit + BATCH_BYTES:
            raise RecordTooLarge(self.key, "tar header", self.since_member, self.limit)
        return data

    def member(self, size: int) -> None:
        """A member was parsed: its ``size`` bytes of data may follow."""
        self.since_member, self.allowed = 0, size


def tarfile_samples(
    key: str, path: str, limit: int = DEFAULT_MAX_RECORD_SIZE
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Each sample's name and its members' data by extension, in tar order, read with
    Python's ``tarfile`` (the reference reader). Raises ``CorruptObject`` (``RecordTooLarge``
    for a sample over ``limit``, before its data is read)."""
    current: str | None = None
    sample: dict[str, bytes] = {}
    held = 0
    with open_object(key, path) as raw:
        stream = _HeaderBound(key, raw, limit)
        try:
            with tarfile.open(fileobj=cast(BinaryIO, stream), mode="r|") as tar:
                for member in tar:
                    stream.member(member.size)
                    parts = split_member(member.name) if member.isreg() else None
                    if parts is None:
                        continue
                    name, ext = parts[0], feature_name(parts[1])
                    if ext == "key":
                        raise CorruptObject(key, f"member {member.name!r}: 'key' is reserved")
                    if name != current:
                        if current is not None:
                            yield current, sample
                        current, sample, held = name, {}, 0
                    held += member.size
                    if held > limit:
                        raise RecordTooLarge(key, f"tar sample {name!r}", held, limit)
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
