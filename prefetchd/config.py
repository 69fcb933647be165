"""The one typed, frozen configuration object, loaded and validated once.

Every problem is reported as a ``ConfigError`` whose message names the key, the bad value and
what is allowed, so the CLI can print it as one line and exit 2.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from prefetchd.errors import ConfigError
from prefetchd.logs import redact_url
from prefetchd.paths import default_cache_dir, default_ram_dir, default_state_dir
from prefetchd.sizes import format_size, parse_size

if TYPE_CHECKING:
    import yaml

LOG_LEVELS = ("debug", "info", "warning", "error")
BUILTIN_FORMATS = ("tfrecord", "raw", "lines", "tar")
CLIENTS = ("classic", "crt", "native")
NATIVE_MISSING = (
    "download.client: 'native' needs the C extension prefetchd.kernel._http, which is not built"
    " (a C compiler and zlib's headers at install; in a checkout: python setup.py build_ext"
    " --inplace)"
)
COMPRESSIONS = ("none", "gzip")
BAD_OBJECT_POLICIES = ("skip", "fail")  # output.on_bad_object
FAST, REPLAYABLE = "fast", "replayable"
ORDERS = (FAST, REPLAYABLE)  # epochs.order
REPEAT, STOP = "repeat", "stop"
EXHAUSTED = (REPEAT, STOP)  # epochs.on_exhausted
ADDRESSING_STYLES = ("auto", "path", "virtual")
DEFAULT_MAX_RECORD_SIZE = 64 * 1024**2
DEFAULT_PARSE_TIMEOUT = 300.0

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,32}$")  # a source's name (sources[i].name)
MAX_SOURCES = 256  # one byte of the plan's source column
_PLUGIN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class SourceConfig:
    url: str
    endpoint_url: str | None = None
    # auto: botocore's choice (virtual-hosted on AWS, path-style for an endpoint_url); MinIO
    # and Ceph RGW without wildcard DNS need path.
    addressing_style: str = "auto"
    region: str | None = None
    profile: str | None = None
    include: tuple[str, ...] = ("*",)
    format: str = "tfrecord"
    manifest: str | None = None
    parse_timeout: float = DEFAULT_PARSE_TIMEOUT  # seconds a format plugin may spend on one object
    # Only in ``sources:`` (docs/sources.md): this source's share of an epoch's bytes, and the
    # name status, metrics and ``weights_by_epoch`` call it by (``s<index>`` by default).
    weight: float = 1.0
    name: str = "s0"

    @property
    def bucket(self) -> str:
        return split_s3_url(self.url)[0]

    @property
    def prefix(self) -> str:
        return split_s3_url(self.url)[1]


@dataclass(frozen=True)
class ShardingConfig:
    num_workers: int = 1
    worker_index: int = 0
    # the saved positions of every host of a job run with another num_workers, to resume its
    # interrupted epoch from (docs/multi-worker.md, "Resuming with another number of hosts")
    resume_from: Path | None = None


@dataclass(frozen=True)
class EpochsConfig:
    count: int | None = 1
    shuffle: bool = True
    seed: int = 0
    order: str = "fast"  # fast | replayable (ORDERS)
    # With several sources (docs/sources.md): which source's pass ends an epoch, and the
    # weights from some epoch on, as ((first epoch, {source name: weight}), ...) by epoch.
    on_exhausted: str = "repeat"  # repeat | stop (EXHAUSTED)
    weights_by_epoch: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()


def default_client(endpoint_url: str | None = None) -> str:
    """``download.client`` when the config names none: native for a plain-HTTP
    ``source.endpoint_url`` where its C engine is built (the least CPU per object and the most
    MB/s, docs/benchmarks.md), else crt wherever awscrt is installed (less CPU per object and
    earlier objects than classic, measured with python -m bench.profile.download), classic
    elsewhere. Looked up without importing awscrt or the engine."""
    if (
        endpoint_url is not None
        and endpoint_url.lower().startswith("http:")
        and importlib.util.find_spec("prefetchd.kernel._http") is not None
    ):
        return "native"
    return "crt" if importlib.util.find_spec("awscrt") is not None else "classic"


@dataclass(frozen=True)
class DownloadConfig:
    cache_dir: Path = field(default_factory=default_cache_dir)  # null in YAML: the same
    window: int = 16 * 1024**3
    keep: int = 0  # most bytes of raw objects kept on local disk across epochs; 0 = none
    concurrency: int = 32
    part_size: int = 8 * 1024**2
    client: str = field(default_factory=default_client)
    retries: int = 10
    max_requests_per_s: float | None = None  # per-host request budget; None = none
    max_bytes_per_s: int | None = None  # per-host byte budget; None = none


@dataclass(frozen=True)
class OutputConfig:
    ram_dir: Path = field(default_factory=default_ram_dir)
    ram_budget: int = 4 * 1024**3
    writers: int = 2
    shard_size: int = 128 * 1024**2
    mix: int = 64
    compression: str = "none"
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE  # larger records quarantine their object
    on_bad_object: str = "skip"  # skip: quarantine, count, exit 4 at the end | fail: exit 1


@dataclass(frozen=True)
class StatusConfig:
    state_dir: Path = field(default_factory=default_state_dir)
    metrics_port: int | None = None


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    epochs: EpochsConfig = field(default_factory=EpochsConfig)
    download: DownloadConfig = field(default_factory=DownloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    log: LogConfig = field(default_factory=LogConfig)
    path: Path | None = None  # the YAML file it came from, if any
    # Every source, ``source`` first (``sources:`` in the file); empty means ``(source,)``.
    sources: tuple[SourceConfig, ...] = ()

    def __post_init__(self) -> None:
        if not self.sources:
            object.__setattr__(self, "sources", (self.source,))

    @property
    def mixed(self) -> bool:
        """Whether the job reads several sources (``sources:`` with more than one entry)."""
        return len(self.sources) > 1

    def job_fingerprint(self) -> dict[str, Any]:
        """What makes two runs "the same job", so a restart may resume the other's state."""
        mixture: dict[str, Any] = {}
        if self.mixed:
            mixture = {
                "sources": [[*source_identity(s), s.name, s.weight] for s in self.sources],
                "on_exhausted": self.epochs.on_exhausted,
                "weights_by_epoch": [[e, dict(w)] for e, w in self.epochs.weights_by_epoch],
            }
        return {
            **mixture,
            "url": self.source.url,
            "endpoint_url": self.source.endpoint_url,
            "include": list(self.source.include),
            "format": self.source.format,
            "manifest": self.source.manifest,
            "num_workers": self.sharding.num_workers,
            "worker_index": self.sharding.worker_index,
            "epochs": [self.epochs.count, self.epochs.shuffle, self.epochs.seed],
            "compression": self.output.compression,
            "writers": self.output.writers,  # writer journals are per writer index
        }


def source_identity(src: SourceConfig) -> list[Any]:
    """What selects and parses a source's records (its dataset), for job fingerprints."""
    return [src.url, src.endpoint_url, list(src.include), src.format, src.manifest]


@functools.lru_cache(maxsize=2 * MAX_SOURCES)
def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix/")``; raises ``ValueError``.
    Remembered: ``SourceConfig.bucket`` asks per object planned (a regex match each time)."""
    if not url.startswith("s3://"):
        raise ValueError("expected s3://bucket/prefix/")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError("expected s3://bucket/prefix/ with a valid bucket name")
    return bucket, prefix


# --- YAML loading ---------------------------------------------------------------------------


def _reject_duplicates(node: yaml.Node | None, path: str = "") -> None:
    """Walk the composed YAML tree; a key seen twice in one mapping is an error naming its
    dotted path (``yaml.safe_load`` would silently keep the last value)."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicates(item, path)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: set[str] = set()
    for key_node, value_node in node.value:
        key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
        dotted = f"{path}.{key}" if path else str(key)
        if key is not None and key in seen:
            line = key_node.start_mark.line + 1
            raise ConfigError(f"duplicate key {dotted} at line {line}")
        if key is not None:
            seen.add(key)
        _reject_duplicates(value_node, dotted)


def load_config(path: str | os.PathLike[str], *, trainer: bool = False) -> Config:
    """Read, parse and validate a YAML config file.

    ``trainer=True`` loads it for the trainer side, which never shards: ``sharding.num_workers:
    auto`` is then not resolved from ``TF_CONFIG`` (the daemon alone does that), and the
    config's ``sharding`` is left at one worker.
    """
    # Imported here: the daemon's children get their config unpickled, not parsed, and each
    # would otherwise load YAML at start-up for nothing (docs/benchmarks.md, "Start-up CPU").
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    # Parsed once, by libyaml where PyYAML has it (the pure-Python parser took most of
    # ``prefetchd status``'s 0.1 CPU-s, twice over): the node tree is checked for duplicate
    # keys, then built into Python values as ``yaml.safe_load`` would.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        _reject_duplicates(node)
        data = None if node is None else loader.construct_document(node)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    finally:
        loader.dispose()
    try:
        return config_from_dict(data, base_dir=path.resolve().parent, path=path, trainer=trainer)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def config_from_dict(
    data: object, *, base_dir: Path | None = None, path: Path | None = None, trainer: bool = False
) -> Config:
    """Validate an already-parsed mapping. Relative paths are taken from ``base_dir``;
    ``trainer`` as for ``load_config``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("the config must be a mapping of sections (source, download, ...)")
    _reject_unknown(data, {**_SECTIONS, "sources": None}, "")
    if "source" in data and "sources" in data:
        raise ConfigError(
            "source and sources are both set: use source for one source or sources for several "
            "mixed by weight, not both"
        )
    sections: dict[str, Any] = {}
    for name, (cls, fields) in _SECTIONS.items():
        if name == "source" and "sources" in data:
            continue
        raw = data.get(name, {})
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{name}: expected a mapping of keys, got {_show(raw)}")
        sections[name] = _section(name, raw, cls, fields, base_dir)
    sources: tuple[SourceConfig, ...] = ()
    if "sources" in data:
        sources = _sources(data["sources"], base_dir)
        sections["source"] = sources[0]
    elif "source" not in data:
        raise ConfigError("source.url is required")
    sharding = _resolve_sharding(data.get("sharding") or {}, trainer=trainer)
    sharding = replace(sharding, resume_from=sections["sharding"].resume_from)
    config = Config(**{**sections, "sharding": sharding}, path=path, sources=sources)
    if "client" not in (data.get("download") or {}):
        client = default_client(config.source.endpoint_url)
        config = replace(config, download=replace(config.download, client=client))
    _check_cross_fields(config)
    _check_sources(config)
    output = data.get("output") or {}
    config = _fit_writers_to_order(config, explicit="writers" in output)
    return _fit_max_record_size(config, explicit="max_record_size" in output)


def _section(
    name: str, raw: Mapping[Any, Any], cls: type, fields: Mapping[str, _Spec], base_dir: Path | None
) -> Any:
    """One section (or one entry of ``sources``, named ``sources[i]``) checked key by key."""
    _reject_unknown(raw, fields, name + ".")
    values: dict[str, Any] = {}
    for key, spec in fields.items():
        dotted = f"{name}.{key}"
        if key not in raw:
            if spec.required:
                raise ConfigError(f"{dotted} is required")
            continue
        try:
            values[key] = spec.convert(raw[key])
        except ValueError as exc:
            raise ConfigError(f"{dotted}: {_show(raw[key])} is not allowed: {exc}") from None
        if isinstance(values[key], Path) and not values[key].is_absolute():
            values[key] = (base_dir or Path.cwd()) / values[key]
        if key == "manifest" and values[key] and "://" not in values[key]:
            values[key] = str((base_dir or Path.cwd()) / Path(values[key]).expanduser())
    return cls(**values)


def _sources(raw: object, base_dir: Path | None) -> tuple[SourceConfig, ...]:
    """``sources:``, a list of sources each with what ``source`` has plus ``weight`` and
    ``name`` (``s<index>`` when not given; names are unique)."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"sources: {_show(raw)} is not allowed: expected a non-empty list of sources, "
            "each a mapping with url and weight"
        )
    if len(raw) > MAX_SOURCES:
        raise ConfigError(f"sources: {len(raw)} sources is too many (at most {MAX_SOURCES})")
    fields = {**_SECTIONS["source"][1], **_SOURCE_ONLY}
    sources = []
    for i, entry in enumerate(raw):
        where = f"sources[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a mapping of keys, got {_show(entry)}")
        src = _section(where, entry, SourceConfig, fields, base_dir)
        if "name" not in entry:
            src = replace(src, name=f"s{i}")
        if "weight" not in entry and len(raw) > 1:
            raise ConfigError(f"{where}.weight is required with several sources")
        sources.append(src)
    names = [s.name for s in sources]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"sources[{i}].name: {name!r} is not allowed: names must be unique")
    return tuple(sources)


def _check_sources(config: Config) -> None:
    """What a job of several sources needs: one store (the downloader's one client; buckets
    may differ), and ``sharding.resume_from`` only with ``on_exhausted: repeat``
    (docs/sources.md)."""
    epochs = config.epochs
    if not config.mixed:
        if epochs.weights_by_epoch:
            raise ConfigError("epochs.weights_by_epoch needs sources: with more than one source")
        return
    first = config.sources[0]
    for i, src in enumerate(config.sources[1:], 1):
        for key in ("endpoint_url", "region", "profile", "addressing_style"):
            if getattr(src, key) != getattr(first, key):
                raise ConfigError(
                    f"sources[{i}].{key}: every source must be in the store of sources[0] for "
                    f"now (the same endpoint_url, region, profile and addressing_style); {key} "
                    "differs"
                )
    if config.sharding.resume_from is not None and epochs.on_exhausted != "repeat":
        raise ConfigError(
            f"sharding.resume_from is not allowed with several sources and epochs.on_exhausted "
            f"{epochs.on_exhausted!r} yet: with stop, the objects an epoch did not read open the "
            "next one, and the old hosts' unread objects are not where the new hosts' streams "
            "start (docs/sources.md); use on_exhausted: repeat"
        )
    names = {s.name for s in config.sources}
    last = -1
    for i, (epoch, weights) in enumerate(epochs.weights_by_epoch):
        where = f"epochs.weights_by_epoch[{i}]"
        if epoch <= last:
            raise ConfigError(f"{where}.epoch: {epoch} is not allowed: epochs must increase")
        last = epoch
        given = {name for name, _ in weights}
        if given != names:
            raise ConfigError(
                f"{where}.weights: names {sorted(given)} are not allowed: expected a weight for "
                f"every source, {sorted(names)}"
            )


def _fit_writers_to_order(config: Config, *, explicit: bool) -> Config:
    """``epochs.order: replayable`` is written by one writer (its order must not depend on
    which writer was quicker): ``output.writers`` is 1 unless the config says otherwise, and
    another number there is refused."""
    if config.epochs.order != REPLAYABLE:
        return config
    if config.output.writers == 1:
        return config
    if explicit:
        raise ConfigError(
            f"output.writers: {config.output.writers} is not allowed with epochs.order: "
            "replayable (one writer writes a replayable order): set output.writers: 1"
        )
    return replace(config, output=replace(config.output, writers=1))


class _Spec:
    def __init__(self, convert: Callable[[object], Any], *, required: bool = False) -> None:
        self.convert = convert
        self.required = required


def _reject_unknown(raw: Mapping[Any, Any], known: Mapping[str, Any], where: str) -> None:
    for key in raw:
        if key not in known:
            allowed = ", ".join(where + k for k in known)
            raise ConfigError(f"unknown key {where}{key} (allowed: {allowed})")


def _show(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    text = redact_url(text)  # an error message must not repeat a password it refuses
    return text if len(text) <= 80 else text[:77] + "..."


# --- converters: each returns the typed value or raises ValueError(what is allowed) ----------

T = TypeVar("T")


def _int_in(lo: int, hi: int) -> Callable[[object], int]:
    def convert(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number from {lo} to {hi}")
        if not lo <= value <= hi:
            raise ValueError(f"expected a whole number from {lo} to {hi}")
        return value

    return convert


def _seconds_in(lo: float, hi: float) -> Callable[[object], float]:
    def convert(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number of seconds from {lo:g} to {hi:g}")
        if not lo <= value <= hi:
            raise ValueError(f"expected a number of seconds from {lo:g} to {hi:g}")
        return float(value)

    return convert


def _rate_in(lo: float, hi: float) -> Callable[[object], float]:
    def convert(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number of requests per second from {lo:g} to {hi:g}")
        if not lo <= value <= hi:
            raise ValueError(f"expected a number of requests per second from {lo:g} to {hi:g}")
        return float(value)

    return convert


def _size_in(lo: int, hi: int) -> Callable[[object], int]:
    def convert(value: object) -> int:
        size = parse_size(value)
        if not lo <= size <= hi:
            raise ValueError(f"expected a size from {format_size(lo)} to {format_size(hi)}")
        return size

    return convert


def _choice(*allowed: str) -> Callable[[object], str]:
    def convert(value: object) -> str:
        if value not in allowed:
            raise ValueError("expected one of " + ", ".join(allowed))
        return str(value)

    return convert


def _optional(inner: Callable[[object], T]) -> Callable[[object], T | None]:
    def convert(value: object) -> T | None:
        return None if value is None else inner(value)

    return convert


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _path(value: object) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a directory path")
    return Path(value).expanduser()


def _dir_or(default: Callable[[], Path]) -> Callable[[object], Path]:
    """A directory path, or ``default()`` (prefetchd/paths.py) for ``null``."""

    def convert(value: object) -> Path:
        return default() if value is None else _path(value)

    return convert


def _s3_url(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected s3://bucket/prefix/")
    split_s3_url(value)
    return value


def _endpoint(value: object) -> str:
    if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("expected an http:// or https:// URL")
    if "@" in urlsplit(value).netloc:
        # Refused, not stripped: S3 never takes credentials from a URL, and a password kept
        # here would travel into logs, status and job files.
        raise ValueError(
            "it holds credentials (user:password@); they come from the standard AWS chain "
            "(environment, source.profile, instance role), never from the URL"
        )
    return value.rstrip("/")


def _globs(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError('expected a non-empty list of glob patterns, e.g. ["*.tfrecord"]')
    if not all(isinstance(v, str) and v for v in value):
        raise ValueError("every pattern must be a non-empty string")
    return tuple(value)


def _format(value: object) -> str:
    if value in BUILTIN_FORMATS:
        return str(value)
    if isinstance(value, str) and _PLUGIN.match(value):
        return value
    raise ValueError(
        "expected one of " + ", ".join(BUILTIN_FORMATS) + ' or "package.module:function"'
    )


def _manifest(value: object) -> str:
    text = _text(value)
    if text.startswith("s3://"):
        split_s3_url(text)
    return text


def _num_workers(value: object) -> int | str:
    if value == "auto":
        return "auto"
    return _int_in(1, 100_000)(value)


def _weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1e6:
        raise ValueError(
            "expected a number above 0 and at most 1000000 (weights need not add up to 1)"
        )
    return float(value)


def _source_name(value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError("expected 1 to 32 letters, digits, '_', '-' or '.'")
    return value


def _weights_by_epoch(value: object) -> tuple[tuple[int, tuple[tuple[str, float], ...]], ...]:
    shape = "expected a list of {epoch: <first epoch>, weights: {<source name>: <weight>}}"
    if not isinstance(value, list):
        raise ValueError(shape)
    entries = []
    for entry in value:
        if not isinstance(entry, Mapping) or set(entry) != {"epoch", "weights"}:
            raise ValueError(shape)
        weights = entry["weights"]
        if not isinstance(weights, Mapping) or not weights:
            raise ValueError(shape)
        epoch = _int_in(0, 1_000_000)(entry["epoch"])
        entries.append(
            (epoch, tuple(sorted((_source_name(k), _weight(w)) for k, w in weights.items())))
        )
    return tuple(entries)


def _epoch_count(value: object) -> int | None:
    return None if value is None else _int_in(1, 1_000_000)(value)


_SECTIONS: dict[str, tuple[type, dict[str, _Spec]]] = {
    "source": (
        SourceConfig,
        {
            "url": _Spec(_s3_url, required=True),
            "endpoint_url": _Spec(_optional(_endpoint)),
            "addressing_style": _Spec(_choice(*ADDRESSING_STYLES)),
            "region": _Spec(_optional(_text)),
            "profile": _Spec(_optional(_text)),
            "include": _Spec(_globs),
            "format": _Spec(_format),
            "manifest": _Spec(_optional(_manifest)),
            "parse_timeout": _Spec(_seconds_in(1.0, 86_400.0)),
        },
    ),
    "sharding": (
        ShardingConfig,
        {
            "num_workers": _Spec(_num_workers),
            "worker_index": _Spec(_int_in(0, 99_999)),
            "resume_from": _Spec(_optional(_path)),
        },
    ),
    "epochs": (
        EpochsConfig,
        {
            "count": _Spec(_epoch_count),
            "shuffle": _Spec(_bool),
            "seed": _Spec(_int_in(0, 2**63)),
            "order": _Spec(_choice(*ORDERS)),
            "on_exhausted": _Spec(_choice(*EXHAUSTED)),
            "weights_by_epoch": _Spec(_weights_by_epoch),
        },
    ),
    "download": (
        DownloadConfig,
        {
            "cache_dir": _Spec(_dir_or(default_cache_dir)),
            "window": _Spec(_size_in(1024**2, 1024**5)),
            "keep": _Spec(_size_in(0, 1024**5)),
            "concurrency": _Spec(_int_in(1, 1024)),
            "part_size": _Spec(_size_in(64 * 1024, 5 * 1024**3)),
            "client": _Spec(_choice(*CLIENTS)),
            "retries": _Spec(_int_in(0, 100)),
            "max_requests_per_s": _Spec(_optional(_rate_in(0.1, 1e6))),
            "max_bytes_per_s": _Spec(_optional(_size_in(64 * 1024, 1024**4))),
        },
    ),
    "output": (
        OutputConfig,
        {
            "ram_dir": _Spec(_dir_or(default_ram_dir)),
            "ram_budget": _Spec(_size_in(1024**2, 1024**5)),
            "writers": _Spec(_int_in(1, 64)),
            "shard_size": _Spec(_size_in(64 * 1024, 64 * 1024**3)),
            "mix": _Spec(_int_in(1, 4096)),
            "compression": _Spec(_choice(*COMPRESSIONS)),
            "max_record_size": _Spec(_size_in(1024**2, 4 * 1024**3)),
            "on_bad_object": _Spec(_choice(*BAD_OBJECT_POLICIES)),
        },
    ),
    "status": (
        StatusConfig,
        {
            "state_dir": _Spec(_dir_or(default_state_dir)),
            "metrics_port": _Spec(_optional(_int_in(1, 65535))),
        },
    ),
    "log": (LogConfig, {"level": _Spec(_choice(*LOG_LEVELS))}),
}


# Keys an entry of ``sources:`` has besides those of ``source``.
_SOURCE_ONLY = {"weight": _Spec(_weight), "name": _Spec(_source_name)}


def _resolve_sharding(raw: Mapping[str, Any], *, trainer: bool = False) -> ShardingConfig:
    num = raw.get("num_workers", 1)
    if num == "auto":
        if "worker_index" in raw:
            raise ConfigError(
                "sharding.worker_index must not be set when sharding.num_workers is auto "
                "(it comes from TF_CONFIG)"
            )
        if trainer:
            # A trainer process reads only its own host's shards; its TF_CONFIG (if any) is
            # tf.distribute's business, not ours.
            return ShardingConfig()
        return ShardingConfig(*workers_from_tf_config(os.environ.get("TF_CONFIG")))
    index = raw.get("worker_index", 0)
    if index >= num:
        raise ConfigError(
            f"sharding.worker_index: {index} is not allowed: expected 0 to {num - 1} "
            f"(sharding.num_workers is {num})"
        )
    return ShardingConfig(num_workers=num, worker_index=index)


def workers_from_tf_config(text: str | None) -> tuple[int, int]:
    """(num_workers, worker_index) from a tf.distribute ``TF_CONFIG`` cluster spec.

    The chief (if any) counts as worker 0 and the workers follow, which is how
    MultiWorkerMirroredStrategy numbers them.
    """
    if not text:
        raise ConfigError("sharding.num_workers is auto but TF_CONFIG is not set")
    try:
        spec = json.loads(text)
        cluster = spec["cluster"]
        task = spec["task"]
        chiefs = len(cluster.get("chief", []))
        workers = len(cluster.get("worker", []))
        kind, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            "sharding.num_workers is auto but TF_CONFIG is not a valid cluster spec "
            '(expected {"cluster": {"worker": [...]}, "task": {"type": ..., "index": ...}})'
        ) from None
    total = chiefs + workers
    if kind == "chief" and 0 <= index < chiefs:
        return total, index
    if kind == "worker" and 0 <= index < workers:
        return total, chiefs + index
    raise ConfigError(
        f"sharding.num_workers is auto but TF_CONFIG task {kind}:{index} is not a chief or "
        "worker of the cluster"
    )


# Bytes of the RAM budget the writers leave to the small files under ram_dir that are
# written without the budget lock: each trainer's lock file (256 bytes), the owner and lock
# files of the directory. 64 KiB covers 200 trainer processes.
SMALL_FILES_RESERVE = 64 * 1024
# What a record's frame adds to the size ``max_record_size`` is compared with: the TFRecord
# framing (16 bytes) and the Example around a raw object's, a line's or a tar sample's bytes
# (its key, feature names and tags; an S3 key is at most 1 KiB).
RECORD_OVERHEAD = 16 * 1024


def record_size_limit(out: OutputConfig) -> int:
    """The largest ``output.max_record_size`` the RAM budget allows.

    What the budget must hold at once for every writer to finish its shard (else writers
    waiting for room could wait on each other for ever): each writer's shard in progress, and
    one shard the trainers read. A writer puts a record that does not fit in the rest of its
    shard into a shard of its own (``write/writer.py``), so its shard in progress is at most
    ``max(shard_size, one record's frame)``; the trainers' shard is at most ``shard_size``
    (that is ``(writers + 1) x shard_size <= ram_budget``, checked at load). So a record's
    frame may take a writer's share, ``(ram_budget - small files - shard_size) / writers``.
    """
    share = (out.ram_budget - SMALL_FILES_RESERVE - out.shard_size) // out.writers
    return max(0, share - RECORD_OVERHEAD)


def _fit_max_record_size(config: Config, *, explicit: bool) -> Config:
    """``config`` with ``output.max_record_size`` checked against ``output.ram_budget``: a
    value set in the file that cannot fit is a ``ConfigError`` naming the key; the default
    shrinks to the limit (a small ``ram_budget`` stays a valid config without the key)."""
    out = config.output
    limit = record_size_limit(out)
    if out.max_record_size <= limit:
        return config
    if explicit:
        raise ConfigError(
            f"output.max_record_size: {format_size(out.max_record_size)} is too large: it must "
            f"be at most {format_size(limit)} with output.ram_budget {format_size(out.ram_budget)}"
            f", {out.writers} writers and shard_size {format_size(out.shard_size)} (each writer"
            " must hold one record besides the shard the trainers read)"
        )
    return replace(config, output=replace(out, max_record_size=limit))


def _check_native(config: Config) -> None:
    """``download.client: native`` speaks plain HTTP only, through an optional C extension:
    an https ``source.endpoint_url`` or a missing build is a ConfigError naming the key (an
    endpoint botocore resolves, AWS's, is https too: refused when the client starts)."""
    if config.download.client != "native":
        return
    url = config.source.endpoint_url
    if url is not None and url.lower().startswith("https:"):
        raise ConfigError(
            f"download.client: 'native' speaks plain HTTP only and source.endpoint_url "
            f"{redact_url(url)!r} is https: use crt for https"
        )
    if importlib.util.find_spec("prefetchd.kernel._http") is None:
        raise ConfigError(NATIVE_MISSING)


def _check_cross_fields(config: Config) -> None:
    _check_native(config)
    out = config.output
    need = (out.writers + 1) * out.shard_size
    if out.ram_budget < need:
        raise ConfigError(
            f"output.ram_budget: {format_size(out.ram_budget)} is too small: it must hold "
            f"(output.writers + 1) x output.shard_size = {format_size(need)}"
        )
    dirs = {
        "download.cache_dir": config.download.cache_dir,
        "output.ram_dir": config.output.ram_dir,
        "status.state_dir": config.status.state_dir,
    }
    names = list(dirs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = dirs[a].resolve(), dirs[b].resolve()
            if pa == pb or pa in pb.parents or pb in pa.parents:
                raise ConfigError(
                    f"{a} ({dirs[a]}) and {b} ({dirs[b]}) must be separate directories, "
                    "neither inside the other"
                )
