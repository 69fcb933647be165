"""``prefetchd check``: is this config going to work? Validates without starting anything."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import botocore.exceptions

from prefetchd.atomic import dir_bytes
from prefetchd.commands import sizing
from prefetchd.config import Config, split_s3_url
from prefetchd.download.order import in_share, matches
from prefetchd.download.rehost import check_source, unchecked_note
from prefetchd.download.store import S3Client, boot_failure, describe, make_client, session
from prefetchd.errors import ConfigError, RuntimeFailure
from prefetchd.exactly_once.host_positions import ResumeError, read_host_positions
from prefetchd.layout import Layout
from prefetchd.oversize import Oversized
from prefetchd.owner import dir_findings
from prefetchd.sizes import format_size
from prefetchd.write.formats import get_format


@dataclass(frozen=True)
class Finding:
    level: str  # "ok" | "warn" | "fail"
    message: str


def run_checks(config: Config) -> list[Finding]:
    findings = [Finding("ok", f"config {config.path or '(object)'} is valid")]
    findings += [_check_format(config, i) for i in range(len(config.sources))]
    findings.append(_check_record_kernel())
    listed: list[int] = []
    findings += list(_check_store(config, listed))
    findings.append(_check_ram_dir(config))
    findings += _check_sizing(config, listed)
    findings.append(
        _check_dir("download.cache_dir", config.download.cache_dir, config.download.window)
    )
    findings.append(_check_dir("status.state_dir", config.status.state_dir, 0))
    if config.download.keep:
        findings.append(_check_keep(config))
    if config.sharding.resume_from is not None:
        resume = _check_resume_from(config)
        findings.append(resume)
        if resume.level == "ok":
            findings.append(_check_resume_listing(config))
    # What the daemon would refuse at start-up (unsafe, foreign, or owned by another running
    # daemon), said now; changes nothing.
    findings += [Finding(level, message) for level, message in dir_findings(Layout.of(config))]
    return findings


def _check_store(config: Config, listed: list[int]) -> Iterator[Finding]:
    """Credentials, bucket access and the first page of the listing; appends the sizes of this
    worker's listed objects to ``listed`` (for the sizing advice)."""
    if session(config.source.profile, config.source.region).get_credentials() is None:
        yield Finding("fail", "no AWS credentials found (environment, profile or instance role)")
        return
    yield Finding("ok", "credentials found")
    client = make_client(config, pool=2)
    for index in range(len(config.sources)):
        yield from _check_source(config, client, index, listed)


def _check_source(
    config: Config, client: S3Client, index: int, listed: list[int]
) -> Iterator[Finding]:
    """One source's bucket access and first page of its listing (every source of
    ``sources:``, each named)."""
    src = config.sources[index]
    named = f" (source {src.name})" if config.mixed else ""
    try:
        client.head_bucket(Bucket=src.bucket)
        page = client.list_objects_v2(Bucket=src.bucket, Prefix=src.prefix, MaxKeys=1000)
    except Exception as exc:
        yield Finding("fail", str(boot_failure(config, exc, src)))
        return
    items = page.get("Contents", [])
    keys = [item["Key"] for item in items]
    shard = config.sharding
    matching = [
        k
        for k in keys
        if matches(k[len(src.prefix) :], src.include)
        and in_share(k, shard.num_workers, shard.worker_index)
    ]
    mine = set(matching)
    listed += [int(item["Size"]) for item in items if item["Key"] in mine]
    more = " (first page)" if page.get("IsTruncated") else ""
    if src.manifest:
        yield _check_manifest(client, src.manifest)
    if not matching and not src.manifest:
        yield Finding(
            "fail",
            f"no objects under {src.url}{named} match source.include for this worker{more}",
        )
    else:
        yield Finding(
            "ok",
            f"bucket {src.bucket} readable{named}: {len(matching)} of {len(keys)} listed "
            f"objects are this worker's{more}",
        )
    oversized = Oversized(config, index)
    for item in items:
        if item["Key"] in mine:
            oversized.add(item["Key"], int(item["Size"]))
    too_large = oversized.message()
    if too_large:
        level = "fail" if config.output.on_bad_object == "fail" else "warn"
        yield Finding(level, f"{too_large}{more}")


def _check_resume_from(config: Config) -> Finding:
    """The old job's positions ``prefetchd run`` would resume from: all there and usable."""
    try:
        hosts = read_host_positions(config)
    except ResumeError as exc:
        return Finding("fail", str(exc))
    return Finding(
        "ok",
        f"sharding.resume_from: the positions of all {hosts.num_workers} hosts of the old job, "
        f"interrupted in epoch {hosts.epoch}",
    )


def _check_resume_listing(config: Config) -> Finding:
    """The source still holds the keys the old hosts' positions were saved over (lists it)."""
    try:
        hosts = read_host_positions(config)
        unchecked = check_source(config, hosts)
    except (ResumeError, RuntimeFailure) as exc:
        return Finding("fail", str(exc))
    if unchecked:
        return Finding("warn", unchecked_note(hosts, unchecked))
    holds = "the sources hold" if config.mixed else "the source holds"
    return Finding(
        "ok",
        f"sharding.resume_from: {holds} the keys the {hosts.num_workers} old hosts' "
        "positions were saved over",
    )


def _check_format(config: Config, index: int) -> Finding:
    """A plugin format is imported here as the writers will import it (each source's)."""
    src = config.sources[index]
    key = f"sources[{index}].format" if config.mixed else "source.format"
    try:
        get_format(src.format)
    except ConfigError as exc:
        return Finding("fail", f"{key}: {exc}" if config.mixed else str(exc))
    return Finding("ok", f"{key} {src.format} is available")


def _check_record_kernel() -> Finding:
    """Which kernel frames records: the C kernel, or its slower pure-Python twin (same bytes)."""
    from prefetchd.kernel import choice, twin

    level = "ok" if choice.KERNEL is not twin else "warn"
    return Finding(level, f"writers frame records in {choice.ACTIVE}")


def _check_manifest(client: S3Client, manifest: str) -> Finding:
    if manifest.startswith("s3://"):
        bucket, key = split_s3_url(manifest)
        try:
            client.head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            return Finding("fail", f"source.manifest {manifest}: {describe(exc)}")
    elif not os.access(manifest, os.R_OK) or not os.path.isfile(manifest):
        return Finding("fail", f"source.manifest {manifest}: not a readable file")
    return Finding("ok", f"source.manifest {manifest} is readable")


def _check_sizing(config: Config, listed: list[int]) -> list[Finding]:
    """The rules of thumb of prefetchd/commands/sizing.py, one WARN line each."""
    typical = sum(listed) // len(listed) if listed else 0
    lines = sizing.advice(config, cores=os.cpu_count() or 1, object_size=typical)
    return [Finding("warn", line) for line in lines]


def _check_ram_dir(config: Config) -> Finding:
    path, budget = config.output.ram_dir, config.output.ram_budget
    fstype = filesystem_type(path)
    total = _total_bytes(path)
    if fstype == "tmpfs" and total is not None and total < budget:
        return Finding("fail", small_tmpfs_advice(path, total, budget))
    free = _free_bytes(path)
    if free is not None and free < budget:
        return Finding(
            "fail",
            f"output.ram_dir {path}: only {format_size(free)} free, "
            f"ram_budget is {format_size(budget)}",
        )
    if fstype != "tmpfs":
        return Finding(
            "warn",
            f"output.ram_dir {path} is on {fstype or 'an unknown filesystem'}, not tmpfs: "
            "shards will go through a disk",
        )
    return Finding("ok", f"output.ram_dir {path} is tmpfs with {format_size(free or 0)} free")


def small_tmpfs_advice(path: Path, total: int, budget: int) -> str:
    """What to do when the RAM disk itself is smaller than ``output.ram_budget``: in a container
    this is Docker's 64 MiB ``/dev/shm`` (or a Kubernetes pod's default), not a full disk."""
    gib = max(1, -(-budget // 1024**3))
    return (
        f"output.ram_dir {path} is on a tmpfs of {format_size(total)}, smaller than "
        f"output.ram_budget {format_size(budget)}: give it more room (docker run "
        f"--shm-size={gib + 1}g; Kubernetes: an emptyDir with medium: Memory and sizeLimit: "
        f"{gib + 1}Gi mounted there), or fit output.ram_budget and output.shard_size in it"
    )


def _check_dir(key: str, path: Path, need: int) -> Finding:
    base = _existing_ancestor(path)
    if not os.access(base, os.W_OK | os.X_OK):
        return Finding("fail", f"{key} {path}: {base} is not writable by this user")
    free = _free_bytes(path)
    if need and free is not None and free < need:
        return Finding(
            "fail", f"{key} {path}: only {format_size(free)} free, need {format_size(need)}"
        )
    return Finding(
        "ok",
        f"{key} {path} is writable" + (f", {format_size(free)} free" if free is not None else ""),
    )


def _check_keep(config: Config) -> Finding:
    """Whether the cache_dir's filesystem can hold ``download.keep`` beside the window. Bytes
    kept already count as room: they are part of ``keep``."""
    download = config.download
    free = _free_bytes(download.cache_dir)
    if free is None:
        return Finding("warn", f"download.keep: cannot tell the free space of {download.cache_dir}")
    kept = dir_bytes(Layout.of(config).cache_keep)
    need = download.keep + download.window
    room = free + kept
    text = (
        f"download.keep {format_size(download.keep)} + download.window "
        f"{format_size(download.window)} in {download.cache_dir}: "
        f"{format_size(free)} free, {format_size(kept)} already kept"
    )
    if room < need:
        return Finding(
            "warn",
            f"{text}; the filesystem cannot hold it: keeping stops when the disk is nearly "
            f"full (about {format_size(max(0, room - download.window))} will be kept)",
        )
    return Finding("ok", text)


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not os.path.exists(path) and path != path.parent:  # False also behind a 0700 dir
        path = path.parent
    return path


def _total_bytes(path: Path) -> int | None:
    """The size of the filesystem ``path`` (or its nearest existing ancestor) lives on."""
    try:
        st = os.statvfs(_existing_ancestor(path))
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(_existing_ancestor(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing ancestor) lives on."""
    target = str(_existing_ancestor(path).resolve())
    best, fstype = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        return None
    return fstype
