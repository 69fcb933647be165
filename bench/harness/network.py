"""The benchmark's network: a private network namespace whose loopback is shaped per
connection.

**Shaped mode** (root only). The whole benchmark re-runs itself inside a fresh network
namespace (``ip netns exec``): the store, the daemon and the trainers all talk over that
namespace's own loopback, which nothing else on the machine shares. ``tc`` then caps every TCP
connection *from the store's S3 port* at ``rate_mbit`` (default 600 Mbit/s, ~70 MB/s on one
stream, as a real object store caps a connection) with no latency added:

    lo root htb 1:  ── 1:1 default, unlimited (store-internal traffic, requests)
                    └─ 1:2 (u32: ip sport == S3 port)  ─ htb 2: ─ 2:1 .. 2:100 (256 classes,
                       one per connection: u32 hash on the low byte of the client's port),
                       each ``rate_mbit`` with no borrowing

The kernel has neither ``netem`` nor the ``flow`` classifier, hence the u32 hash table. Ephemeral
client ports are handed out sequentially, so up to 256 concurrent connections land in distinct
classes. The namespace is deleted on exit, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

HASH_BUCKETS = 256


class NetworkError(RuntimeError):
    """The network set-up failed (the message says which command and why)."""


# --- network namespace and shaping -----------------------------------------------------------


def can_shape() -> str | None:
    """None if this process may create namespaces and shape them; else the reason why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2)"
    return None


def _run(cmd: list[str], *, input_text: str | None = None) -> None:
    done = subprocess.run(cmd, input=input_text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkError(f"`{' '.join(cmd[:4])} ...` failed: {done.stderr.strip()[:500]}")


@contextlib.contextmanager
def namespace(name: str) -> Iterator[str]:
    """A fresh network namespace with its loopback up; on exit every process still in it is
    killed (by PID, they are ours) and the namespace is deleted."""
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        yield name
    finally:
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def shaping_batch(port: int, rate_mbit: int, device: str = "lo") -> str:
    """The ``tc -batch`` script described in the module docstring (pure, for tests)."""
    lines = [
        f"qdisc add dev {device} root handle 1: htb default 1",
        f"class add dev {device} parent 1: classid 1:1 htb rate 100gbit quantum 200000",
        f"class add dev {device} parent 1: classid 1:2 htb rate 100gbit quantum 200000",
        f"qdisc add dev {device} parent 1:2 handle 2: htb",
        f"filter add dev {device} parent 1: protocol ip prio 1 u32 "
        f"match ip protocol 6 0xff match ip sport {port} 0xffff flowid 1:2",
        f"filter add dev {device} parent 2: prio 1 handle 9: protocol ip u32 "
        f"divisor {HASH_BUCKETS}",
    ]
    for bucket in range(HASH_BUCKETS):
        cls = f"2:{bucket + 1:x}"
        lines.append(
            f"class add dev {device} parent 2: classid {cls} htb rate {rate_mbit}mbit "
            f"ceil {rate_mbit}mbit burst 256k cburst 256k quantum 65536"
        )
        lines.append(
            f"filter add dev {device} parent 2: prio 1 protocol ip u32 ht 9:{bucket:x}: "
            f"match u32 0 0 flowid {cls}"
        )
    # The TCP header follows a 20-byte IP header; the word at offset 20 is sport|dport, and its
    # low byte (the low byte of the client's port) picks the bucket.
    lines.append(
        f"filter add dev {device} parent 2: prio 1 protocol ip u32 ht 800:: "
        "match ip protocol 6 0xff hashkey mask 0x000000ff at 20 link 9:"
    )
    return "\n".join(lines) + "\n"


def shape(port: int, rate_mbit: int) -> None:
    """Cap each connection from ``port`` on this namespace's loopback (we must be inside it)."""
    unshape()
    _run(["tc", "-batch", "-"], input_text=shaping_batch(port, rate_mbit))


def unshape() -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True, check=False)
