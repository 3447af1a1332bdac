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

from forgelib import engineapi

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
# Where a container's processes are listed under ``CGROUP``, by the engine's cgroup driver and version:
# cgroupfs (v1's pids controller, v2), systemd (v1, v2). ``{id}``: the container's full id.
CGROUP_PROCS = (
    "pids/docker/{id}/cgroup.procs",
    "pids/system.slice/docker-{id}.scope/cgroup.procs",
    "docker/{id}/cgroup.procs",
    "system.slice/docker-{id}.scope/cgroup.procs",
)
TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp{,6} print a socket's state
UNIX_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags: a listening unix socket
DOCKER_DNS = "0B00007F"  # 127.0.0.11 as /proc/net/tcp prints an IPv4 address (little-endian hex)


def local_engine(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the engine's containers are this host's processes: the docker CLI talks to a unix socket
    here (``engineapi.cli_socket``: no remote ``DOCKER_HOST``, no context but the default)."""
    return engineapi.cli_socket(environ) is not None


def belongs(pid: int, container_id: str, *, proc: Path | None = None) -> bool:
    """Whether host process ``pid`` is one of container ``container_id``'s (its cgroup names the container):
    a pid read earlier may have ended, and its number since be another process's."""
    try:
        cgroup = ((PROC if proc is None else proc) / str(pid) / "cgroup").read_text()
    except OSError:
        return False
    return bool(container_id) and container_id in cgroup


def main_pid(container_id: str, *, proc: Path | None = None, cgroup: Path | None = None) -> int:
    """The host pid of container ``container_id``'s main process (its pid 1), read from the host's cgroup
    listing of the container's processes: what ``docker inspect``'s ``State.Pid`` says, without a
    ``docker`` command. 0 when it cannot be read from here: a remote engine, a cgroup layout not in
    ``CGROUP_PROCS``, a container sharing the host's pid namespace (no process of it is pid 1 there)."""
    if not container_id or not local_engine():
        return 0
    root, cg = PROC if proc is None else proc, CGROUP if cgroup is None else cgroup
    for where in CGROUP_PROCS:
        try:
            pids = (cg / where.format(id=container_id)).read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                status = (root / pid / "status").read_text()
            except OSError:
                continue  # ended meanwhile (an exec's process)
            for line in status.splitlines():
                f = line.split()
                if f[:1] == ["NSpid:"] and len(f) > 2 and f[-1] == "1":
                    return int(pid)
        return 0
    return 0


class Sockets:
    """The listening sockets of one container's network namespace, as the host's ``/proc`` shows them."""

    def __init__(self, net: Path) -> None:
        self.net = net
        self._counts: tuple[int, int] | None = None  # TCP, TCP6 sockets in use at the last full read
        self._tcp = False  # what that read found

    @classmethod
    def of(cls, pid: int, container_id: str, *, proc: Path | None = None) -> Sockets | None:
        """The sockets of container ``container_id`` whose main process is ``pid``, or None when they
        cannot be read from here (see the module doc)."""
        root = PROC if proc is None else proc
        if pid <= 0 or not container_id or not local_engine() or not belongs(pid, container_id, proc=root):
            return None
        sockets = cls(root / str(pid) / "net")
        return sockets if sockets.listening() is not None else None

    def listening(self) -> bool | None:
        """Whether anything but Docker's DNS resolver listens (TCP, either IP version, or a unix socket);
        None when the files are gone (the process ended).

        The kernel writes ``net/tcp{,6}`` by walking every namespace's TCP sockets, a cost that grows with
        the host's; ``net/sockstat{,6}`` are the namespace's own counters. So the tables are read only when
        the namespace's count of TCP sockets changed since they were last read. (A listener opened as
        another socket closed, between two reads, is seen at the next change, or never: readiness then
        runs the healthcheck at its slower pace, as for a container that does not listen.)"""
        try:
            counts = (_inuse(self.net / "sockstat", "TCP:"), _inuse(self.net / "sockstat6", "TCP6:"))
            if counts != self._counts or counts[0] < 0:  # without the counters: every time
                tcp6 = _optional(self.net / "tcp6") if counts[1] else ""
                self._tcp = _tcp_listens((self.net / "tcp").read_text()) or _tcp_listens(tcp6)
                self._counts = counts
            if self._tcp:
                return True
            unix = _optional(self.net / "unix")
        except OSError:
            return None
        for line in unix.splitlines()[1:]:
            f = line.split()
            try:
                if len(f) > 3 and int(f[3], 16) & UNIX_ACCEPTING:
                    return True
            except ValueError:
                continue
        return False


def _inuse(path: Path, label: str) -> int:
    """``inuse`` of ``label``'s line in a sockstat file (-1: not there, e.g. no IPv6)."""
    for line in _optional(path).splitlines():
        f = line.split()
        if f[:1] == [label] and "inuse" in f[:-1]:
            return int(f[f.index("inuse") + 1])
    return -1


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
