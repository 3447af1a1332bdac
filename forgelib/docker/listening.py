"""Whether a container of the local engine listens on anything yet, read from the host's ``/proc``: no
``docker`` command, no process in the container.

Readiness (``readiness.py``) runs a container's own healthcheck through ``docker exec``, which costs the
docker CLI, dockerd, containerd's shim and runc each time. A server's healthcheck cannot pass before the
server listens, so while its container has no listening socket an exec is mostly wasted: this module says
when that is so, for a few file reads. It is a gate before the healthcheck, never the criterion.

What is read: ``/proc/<pid>/net/{tcp,tcp6,unix}`` of the container's main process (``State.Pid``), which
show the sockets of that process's network namespace, the container's. Docker's embedded DNS resolver
listens at 127.0.0.11 in every container of a user-defined network from its start: not the service's.

When it cannot be read, ``Sockets.of`` answers None and readiness probes as if this module did not exist:
the engine is remote (``DOCKER_HOST`` not a local socket), ``/proc/<pid>`` is not there (another pid
namespace) or is not the container's (its cgroup does not name the container's id).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp{,6} print a socket's state
UNIX_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags: a listening unix socket
DOCKER_DNS = "0B00007F"  # 127.0.0.11 as /proc/net/tcp prints an IPv4 address (little-endian hex)


def local_engine(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the engine's containers are this host's processes: ``DOCKER_HOST`` unset or a unix socket,
    and no docker context other than the default chosen by the environment."""
    host = environ.get("DOCKER_HOST", "")
    context = environ.get("DOCKER_CONTEXT", "")
    return (not host or host.startswith("unix://")) and context in ("", "default")


class Sockets:
    """The listening sockets of one container's network namespace, as the host's ``/proc`` shows them."""

    def __init__(self, net: Path) -> None:
        self.net = net

    @classmethod
    def of(cls, pid: int, container_id: str, *, proc: Path | None = None) -> Sockets | None:
        """The sockets of container ``container_id`` whose main process is ``pid``, or None when they
        cannot be read from here (see the module doc)."""
        root = PROC if proc is None else proc
        if pid <= 0 or not container_id or not local_engine():
            return None
        try:
            cgroup = (root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        if container_id not in cgroup:
            return None
        sockets = cls(root / str(pid) / "net")
        return sockets if sockets.listening() is not None else None

    def listening(self) -> bool | None:
        """Whether anything but Docker's DNS resolver listens (TCP, either IP version, or a unix socket);
        None when the files are gone (the process ended)."""
        try:
            if _tcp_listens((self.net / "tcp").read_text()):  # the common case, one file read
                return True
            tcp6, unix = _optional(self.net / "tcp6"), _optional(self.net / "unix")
        except OSError:
            return None
        if _tcp_listens(tcp6):
            return True
        for line in unix.splitlines()[1:]:
            f = line.split()
            try:
                if len(f) > 3 and int(f[3], 16) & UNIX_ACCEPTING:
                    return True
            except ValueError:
                continue
        return False


def _tcp_listens(table: str) -> bool:
    for line in table.splitlines()[1:]:
        f = line.split()
        if len(f) > 3 and f[3] == TCP_LISTEN and not f[1].startswith(DOCKER_DNS + ":"):
            return True
    return False


def _optional(path: Path) -> str:
    """A table the kernel may lack (no IPv6, no unix sockets): empty then."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
