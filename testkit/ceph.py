"""Start a one-node Ceph cluster with an S3 gateway (RGW) on 127.0.0.1, for the tests.

Debian's ``radosgw``, ``ceph-mon`` and ``ceph-osd`` packages (Ceph 16, Pacific): one monitor,
one OSD on a memstore (RAM, no disk), one RGW with the beast front end, no cephx, every pool of
size one, all of it under a private temporary directory (config, keyring, data, sockets and
logs). Every listener binds 127.0.0.1: RGW on ``port``, the monitor on ``port + 1``, the OSD's
messengers within ``port + 10 .. port + 39``.

Settings that matter to clients:

- ``tcp_nodelay=1`` on the beast front end: without it a small GET takes ~44 ms (Nagle's
  algorithm against delayed ACKs).
- A ListObjectsV2 page holds 1,000 keys unless the request asks for fewer (Ceph's
  ``rgw_max_listing_results`` only caps a larger ``max-keys``; the daemon sends none).

Quirks seen: CompleteMultipartUpload answers with an empty ETag (HEAD, GET and the listing
carry the right one); no ``x-amz-checksum-*`` headers.

The three daemons run in sessions of their own and are stopped by PID (RGW, OSD, monitor:
SIGTERM, a grace period, SIGKILL); each step of the start has a time limit, and a start that
fails raises ``ServerError`` with the reason and the tails of the logs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testkit.s3server import HOST, ServerError, _log_tail, answers, stop_process

START_TIMEOUT = 120.0  # the whole start; one step's limit is STEP_TIMEOUT
STEP_TIMEOUT = 60.0
BINARIES = (
    "ceph-mon",
    "ceph-osd",
    "radosgw",
    "radosgw-admin",
    "ceph",
    "ceph-authtool",
    "monmaptool",
)
PACKAGES = "radosgw ceph-mon ceph-osd"
PORTS = 40  # RGW, monitor, and the OSD's messenger range


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def version() -> str:
    """``radosgw --version``'s version (e.g. ``16.2.15``), or ``""``."""
    if shutil.which("radosgw") is None:
        return ""
    out = subprocess.run(["radosgw", "--version"], capture_output=True, text=True, timeout=30)
    words = out.stdout.split()
    return words[2] if len(words) > 2 else out.stdout.strip()


def ceph_conf(workdir: Path, fsid: str, port: int) -> str:
    return f"""\
[global]
fsid = {fsid}
mon_host = v2:{HOST}:{port + 1}
public_addr = {HOST}
cluster_addr = {HOST}
ms_bind_msgr1 = false
ms_bind_port_min = {port + 10}
ms_bind_port_max = {port + PORTS - 1}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_cluster_mode = crc secure
ms_mon_client_mode = crc secure
ms_cluster_mode = crc secure
ms_client_mode = crc secure
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 5
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
run_dir = {workdir}/run
admin_socket = {workdir}/run/$name.asok
log_file = {workdir}/log/$name.log
keyring = {workdir}/keyring
mon_data = {workdir}/mon/$name
osd_data = {workdir}/osd/$name
osd_objectstore = memstore
memstore_device_bytes = 2147483648
osd_max_object_name_len = 460
osd_max_object_namespace_len = 64
[client.rgw.a]
rgw_frontends = beast endpoint={HOST}:{port} tcp_nodelay=1
rgw_data = {workdir}/rgw
"""


@dataclass
class CephServer:
    """A one-node Ceph cluster this process started: its daemons (by name), its RGW endpoint
    and its directory. ``stop()`` ends the daemons by PID and removes the directory."""

    endpoint: str
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kind: str = "ceph"

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def logs(self) -> str:
        """The tails of every daemon's output and log, for an error message."""
        paths = sorted((self.workdir / "log").glob("*"))
        return "".join(f"\n[{p.name}]" + _log_tail(p, 1500) for p in paths)

    def stop(self) -> None:
        for name in ("rgw", "osd", "mon"):
            proc = self.procs.get(name)
            if proc is not None:
                stop_process(proc)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_ceph(port: int, access_key: str, secret_key: str) -> CephServer:
    """A Ceph cluster with RGW on ``port`` (and the next 39 ports), its one S3 user
    ``access_key`` / ``secret_key``.

    Raises ``ServerError`` if a binary is missing or a daemon does not come up in time.
    """
    missing = missing_binaries()
    if missing:
        raise ServerError(
            f"no {', '.join(missing)}: apt-get install {PACKAGES} (scripts/test.sh does, as root)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-ceph-"))
    server = CephServer(f"http://{HOST}:{port}", workdir)
    try:
        _start(server, port, access_key, secret_key)
    except ServerError as exc:
        logs = server.logs()
        server.stop()
        raise ServerError(f"Ceph did not start: {exc}{logs}") from None
    except BaseException:
        server.stop()
        raise
    return server


def _start(server: CephServer, port: int, access_key: str, secret_key: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    d = server.workdir
    for sub in ("run", "log", "mon", "osd", "rgw"):
        (d / sub).mkdir()
    fsid = str(uuid.uuid4())
    conf = d / "ceph.conf"
    conf.write_text(ceph_conf(d, fsid, port))
    c = ["-c", str(conf)]
    step = _Steps(d / "log" / "setup.out", deadline)
    step.run(["ceph-authtool", "--create-keyring", str(d / "keyring"), "--gen-key", "-n", "mon.",
              "--cap", "mon", "allow *"])  # fmt: skip
    step.run(["monmaptool", "--create", "--addv", "a", f"[v2:{HOST}:{port + 1}]", "--fsid", fsid,
              str(d / "monmap")])  # fmt: skip
    step.run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", str(d / "monmap"),
              "--keyring", str(d / "keyring")])  # fmt: skip
    server.procs["mon"] = _daemon(["ceph-mon", *c, "-i", "a", "-f"], d / "log" / "mon.out")
    osd_uuid = str(uuid.uuid4())
    osd_id = step.run(["ceph", *c, "--connect-timeout", "30", "osd", "new", osd_uuid]).strip()
    if not osd_id.isdigit():
        raise ServerError(f"`ceph osd new` answered {osd_id!r}, not an OSD id")
    (d / "osd" / f"osd.{osd_id}").mkdir()
    step.run(["ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid])
    server.procs["osd"] = _daemon(["ceph-osd", *c, "-i", osd_id, "-f"], d / "log" / "osd.out")
    server.procs["rgw"] = _daemon(
        ["radosgw", *c, "-n", "client.rgw.a", "-f"], d / "log" / "rgw.out"
    )
    step.run(["radosgw-admin", *c, "user", "create", "--uid=test", "--display-name=test",
              f"--access-key={access_key}", f"--secret={secret_key}"])  # fmt: skip
    while not answers(server.endpoint, timeout=0.5):
        for name, proc in server.procs.items():
            if proc.poll() is not None:
                raise ServerError(f"{name} exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise ServerError(f"RGW did not answer at {server.endpoint} in {START_TIMEOUT:.0f} s")
        time.sleep(0.1)


class _Steps:
    """Runs the setup commands one at a time, each within its limit and the start's deadline,
    their output appended to one log; a failure raises ``ServerError`` naming the command."""

    def __init__(self, log: Path, deadline: float) -> None:
        self.log = log
        self.deadline = deadline

    def run(self, cmd: list[str]) -> str:
        limit = max(1.0, min(STEP_TIMEOUT, self.deadline - time.monotonic()))
        with open(self.log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            try:
                done = subprocess.run(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out,
                    text=True, timeout=limit, env=_ceph_env(),
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                raise ServerError(f"`{cmd[0]} {cmd[3] if len(cmd) > 3 else ''}` took over "
                                  f"{limit:.0f} s") from None  # fmt: skip
            out.write(done.stdout)
        if done.returncode != 0:
            raise ServerError(f"`{' '.join(cmd[:4])} ...` exited with code {done.returncode}")
        return done.stdout


def _daemon(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=_ceph_env(), start_new_session=True,
        )  # fmt: skip


def _ceph_env() -> dict[str, str]:
    """The environment without CEPH_* settings from the machine (CEPH_CONF, CEPH_ARGS)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEPH_")}
    with contextlib.suppress(KeyError):
        del env["PYTHONPATH"]  # the `ceph` CLI is Debian's Python, not this venv's
    return env
