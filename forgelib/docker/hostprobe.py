"""Answer a recognised healthcheck from the host, in the container's own namespaces: no ``docker exec``.

Readiness (``readiness.py``) runs a container's healthcheck through ``docker exec``, which costs the docker
CLI, dockerd, containerd's shim and runc each time. For the few healthcheck commands this module recognises
EXACTLY (``recognise``), the same question is asked from the host instead:

- the network checks speak their protocol over a socket created inside the container's network
  namespace (a short-lived thread ``setns``-es into ``/proc/<pid>/ns/net``, creates the socket and ends; a
  socket stays in the namespace it was created in), so ``127.0.0.1`` is the container's loopback, as for
  the real command;
- ``test -d|-f|-e PATH`` looks the path up under ``/proc/<pid>/root``, its symbolic links followed inside
  the container's root.

The generic forms are here (``test``; ``curl`` of an ``http://`` URL on the loopback: one GET). A server
kind's own clients (``pg_isready``, ``redis-cli ping``, ``mariadb-admin ping``) are its knowledge: each
kind's ``host_checks`` module (``Kind.host_checks``) has their ``FORMS``, registered here by
``forgelib.kinds.registry``; a process that never loaded the kinds leaves those to ``docker exec``.

A PASS means what the real command's exit 0 means, so only a PASS is ever acted on: readiness keeps the
real healthcheck, through ``docker exec``, as the authority for everything else (it still runs, seldom,
while the host probe says no). So a probe here answers "passes" only when the real command would surely
exit 0: its program is present and executable by anyone in the container (its ``PATH`` read from its main
process's environment), every directory on the way searchable by anyone (the command may run as another
user), and the server's answer the one the real client takes for success.

Off (``HostProbe.of`` answers None) on a remote engine, when the container's main process is not found
from here, without the privilege to enter a network namespace (remembered: never asked again in this
process), or with ``FORGE_HOSTPROBE=0``.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import stat
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from forgelib.docker import listening

ENV = "FORGE_HOSTPROBE"  # "0": never; readiness runs every healthcheck through `docker exec`
NET_TIMEOUT = 2.0  # seconds a network probe waits at most (less when the healthcheck's own timeout is less)
CLONE_NEWNET = 0x40000000
LOOPBACK = "127.0.0.1"  # a probe's TCP connection goes here, in the container's network namespace
LOCAL = (LOOPBACK, "localhost")
# runc's PATH when the container's environment has none
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_LINKS = 40  # symbolic links followed in one lookup, as the kernel's ELOOP bound

_denied = threading.Event()  # setns refused us (EPERM): no host probe for the rest of this process


class Unanswerable(Exception):
    """This probe cannot answer from the host as the real command would: leave it to ``docker exec``."""


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether host probes may run at all in this process (see the module doc)."""
    return environ.get(ENV, "") != "0" and listening.local_engine(environ) and not _denied.is_set()


# ---------------------------------------------------------------------------------------------- the container


class Target:
    """One container as the host sees it: its main process's namespaces and root."""

    def __init__(self, container_id: str, pid: int, *, proc: Path = listening.PROC) -> None:
        self.container_id = container_id
        self.pid = pid
        self.proc = proc

    @property
    def root(self) -> Path:
        return self.proc / str(self.pid) / "root"

    def path_dirs(self) -> list[str]:
        """The container's ``PATH`` (its main process's environment, as ``docker exec`` gets it)."""
        try:
            env = (self.proc / str(self.pid) / "environ").read_bytes().split(b"\0")
        except OSError as e:
            raise Unanswerable(f"environment not readable: {e}") from e
        found = next((v[5:].decode(errors="replace") for v in env if v.startswith(b"PATH=")), DEFAULT_PATH)
        return [d for d in found.split(":") if d]

    def still_there(self) -> None:
        """Raise ``Unanswerable`` unless ``pid`` is still a process of the container (it ended, and its
        number could be another's)."""
        if not listening.belongs(self.pid, self.container_id, proc=self.proc):
            raise Unanswerable(f"process {self.pid} is gone or no longer the container's")

    def socket(self, family: int) -> socket.socket:
        """A TCP socket of ``family`` created in the container's network namespace."""
        return in_netns(self.proc / str(self.pid) / "ns" / "net", family)


def in_netns(ns: Path, family: int) -> socket.socket:
    """A TCP socket created in the network namespace ``ns`` (a ``/proc/<pid>/ns/net``), by a thread that
    enters it and ends: the calling thread stays where it is. Raises ``Unanswerable`` when the namespace
    cannot be entered (``EPERM`` is remembered: ``enabled`` says no from then on)."""
    out: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            out.append(socket.socket(family, socket.SOCK_STREAM))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out.append(e)

    t = threading.Thread(target=enter, name="hostprobe-netns", daemon=True)
    t.start()
    t.join()
    got = out[0] if out else Unanswerable("the namespace thread ended without an answer")
    if isinstance(got, socket.socket):
        return got
    if isinstance(got, PermissionError):
        _denied.set()
    raise Unanswerable(f"cannot enter {ns}: {got}") from got


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def lookup(root: Path, path: str) -> os.stat_result | None:
    """What ``stat(path)`` says inside the container whose root is ``root`` (a ``/proc/<pid>/root``),
    symbolic links followed inside that root (the host would resolve an absolute link against its own);
    None when it does not exist. Raises ``Unanswerable`` where the real lookup could differ: a directory
    on the way not searchable by anyone, too many links, a relative path."""
    if not path.startswith("/"):
        raise Unanswerable(f"relative path {path!r}")
    parts = _parts(path)
    done: list[str] = []
    st = _lstat(root, done)
    links = 0
    while parts:
        name = parts.pop(0)
        if name == "..":  # physical: the parent of what the links led to, never above the root
            done = done[:-1]
            st = _lstat(root, done)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None  # ENOTDIR
        if not st.st_mode & stat.S_IXOTH:
            raise Unanswerable(f"{'/' + '/'.join(done)} is not searchable by everyone")
        try:
            st = os.lstat(root.joinpath(*done, name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise Unanswerable(str(e)) from e
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise Unanswerable(f"too many symbolic links in {path!r}")
            target = str(root.joinpath(*done, name).readlink())
            if target.startswith("/"):
                done = []
            parts = _parts(target) + parts
            st = _lstat(root, done)
            continue
        done.append(name)
    return st


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _lstat(root: Path, done: Sequence[str]) -> os.stat_result:
    """What ``done`` (components, links resolved) is under ``root``; the root itself followed (a
    ``/proc/<pid>/root`` is a link to the container's root)."""
    try:
        return root.joinpath(*done).lstat() if done else root.stat()
    except OSError as e:
        raise Unanswerable(str(e)) from e


def require_programs(target: Target, names: Sequence[str]) -> None:
    """Raise ``Unanswerable`` unless each of ``names`` is on the container's ``PATH``, a regular file
    executable by anyone: else the real command could not even start."""
    dirs = target.path_dirs()
    for name in names:
        for d in [""] if name.startswith("/") else dirs:
            st = lookup(target.root, f"{d}/{name}" if d else name)
            if st is not None and stat.S_ISREG(st.st_mode):
                if not st.st_mode & stat.S_IXOTH:
                    raise Unanswerable(f"{d}/{name} is not executable by everyone")
                break
        else:
            raise Unanswerable(f"{name} is not on the container's PATH")


# ------------------------------------------------------------------------------------------------- the checks


# How a recognised healthcheck is answered: True when it passes now (the container, the time allowed).
Answer = Callable[[Target, float], bool]
# The argv after the program -> its answer, or None when not recognised exactly.
Parse = Callable[[Sequence[str]], Answer | None]


@dataclass(frozen=True)
class Check:
    """A recognised healthcheck: the programs it runs, and how to answer it from the host."""

    programs: tuple[str, ...]
    answer: Answer


def recognise(argv: Sequence[str]) -> Check | None:
    """The host-side form of healthcheck ``argv`` (as ``readiness.health_argv`` makes it: a CMD form's
    argv, a CMD-SHELL form as ``/bin/sh -c STRING``), or None when it is not one recognised exactly."""
    args = list(argv)
    if len(args) == 3 and args[:2] == ["/bin/sh", "-c"] and args[2] in SHELL_FORMS:
        return Check(*SHELL_FORMS[args[2]])
    if not args:
        return None
    prog, rest = args[0], args[1:]
    parse = FORMS.get(prog)
    if parse is None:
        return None
    found = parse(rest)
    return None if found is None else Check((prog,), found)


def options(
    args: Sequence[str],
    valued: Collection[str],
    flags: Collection[str] = (),
    long: Mapping[str, str] | None = None,
    attached: Collection[str] = (),
) -> tuple[dict[str, str], list[str]] | None:
    """Short options (``-x VALUE`` or ``-xVALUE`` for ``valued``, ``-xVALUE`` only for ``attached``,
    ``flags`` alone), ``long`` ``--name=VALUE`` ones (mapped to their short name), and the operands; None
    at any other option."""
    opts: dict[str, str] = {}
    operands: list[str] = []
    long = long or {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a and a.split("=", 1)[0] in long:
            name, value = a.split("=", 1)
            opts[long[name]] = value
        elif a in flags:
            opts[a] = ""
        elif (a[:2] in valued or a[:2] in attached) and len(a) > 2:
            opts[a[:2]] = a[2:]
        elif a in valued:
            if i + 1 >= len(args):
                return None
            opts[a] = args[i + 1]
            i += 1
        elif a.startswith("-"):
            return None
        else:
            operands.append(a)
        i += 1
    return opts, operands


def port_of(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def _curl(args: Sequence[str]) -> Answer | None:
    fail = False
    urls: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--fail", "--silent", "--show-error"):
            fail = fail or a == "--fail"
        elif a == "-o":
            if i + 1 >= len(args) or args[i + 1] != "/dev/null":
                return None
            i += 1
        elif re.fullmatch(r"-[fsS]+", a):
            fail = fail or "f" in a
        elif a.startswith("-"):
            return None
        else:
            urls.append(a)
        i += 1
    if len(urls) != 1:
        return None
    u = urlsplit(urls[0])
    try:
        port = u.port
    except ValueError:
        return None
    if u.scheme != "http" or u.hostname not in LOCAL or u.username or u.password or u.fragment:
        return None
    if u.netloc != u.hostname + ("" if port is None else f":{port}"):
        return None  # spelled unusually (upper case, an empty port): leave it to curl
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host_header = u.hostname if port in (None, 80) else f"{u.hostname}:{port}"
    where = u.hostname
    return lambda target, limit: http_get(target, where, port or 80, path, host_header, fail, limit)


def _test(args: Sequence[str]) -> Answer | None:
    if len(args) != 2 or args[0] not in ("-d", "-f", "-e") or not args[1].startswith("/"):
        return None
    op, path = args
    kinds: dict[str, Callable[[int], bool]] = {"-d": stat.S_ISDIR, "-f": stat.S_ISREG, "-e": lambda m: True}
    want = kinds[op]
    return lambda target, limit: (st := lookup(target.root, path)) is not None and want(st.st_mode)


# program -> how its argv (after the program) is answered, None: not a form recognised exactly. Each
# server kind registers its clients' forms (``register``, from ``forgelib.kinds.registry``).
FORMS: dict[str, Parse] = {"curl": _curl, "test": _test}
# a CMD-SHELL string recognised exactly -> the programs it runs (``/bin/sh`` first) and how it is answered
SHELL_FORMS: dict[str, tuple[tuple[str, ...], Answer]] = {}


def register(forms: Mapping[str, Parse], shell: Mapping[str, tuple[tuple[str, ...], Answer]]) -> None:
    """Add a kind's healthcheck forms (its ``host_checks`` module's ``FORMS`` and ``SHELL_FORMS``)."""
    FORMS.update(forms)
    SHELL_FORMS.update(shell)


# ----------------------------------------------------------------------------------------- the wire protocols


def connect(target: Target, host: str, port: int, limit: float) -> socket.socket | None:
    """A connected socket to ``host:port`` in the container's network namespace, or None when nothing
    accepts there (refused, no answer). ``localhost``: IPv4's loopback, then IPv6's."""
    addrs = [(socket.AF_INET, "127.0.0.1")]
    if host == "localhost":
        addrs.append((socket.AF_INET6, "::1"))
    for family, addr in addrs:
        s = target.socket(family)
        s.settimeout(limit)
        try:
            s.connect((addr, port))
        except OSError:
            s.close()
            continue
        return s
    return None


def exchange(
    target: Target, host: str, port: int, limit: float, talk: Callable[[socket.socket], bool]
) -> bool:
    """``talk``'s verdict over a connection to ``host:port`` in the container's network namespace; False
    when nothing accepts there or the connection fails on the way, as it fails the real client."""
    s = connect(target, host, port, limit)
    if s is None:
        return False
    with s:
        try:
            return talk(s)
        except OSError:
            return False


def http_get(
    target: Target, host: str, port: int, path: str, host_header: str, fail: bool, limit: float
) -> bool:
    """``curl [-f] http://host:port/path``'s exit 0: an HTTP response, with ``fail`` one below 400."""
    request = f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: curl\r\nAccept: */*\r\n\r\n"

    def talk(s: socket.socket) -> bool:
        s.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        return http_verdict(head, fail)

    return exchange(target, host, port, limit, talk)


def http_verdict(head: bytes, fail: bool) -> bool:
    """Whether the response that begins with ``head`` makes curl (``-f``: ``fail``) exit 0."""
    if b"\r\n\r\n" not in head:
        return False  # no complete header: curl's "empty reply" or a cut-off answer
    m = re.match(rb"HTTP/1\.[01] (\d{3})[ \r]", head)
    if m is None:
        return False
    status = int(m.group(1))
    return status >= 200 and not (fail and status >= 400)


def recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def recv_line(s: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n") and len(data) < 4096:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


# ---------------------------------------------------------------------------------------- readiness's handle


class HostProbe:
    """One container's recognised healthcheck, answered from the host (readiness's handle)."""

    def __init__(self, target: Target, check: Check, limit: float) -> None:
        self.target = target
        self.check = check
        self.limit = limit
        self._programs = False  # the check's programs were found in the container

    @classmethod
    def of(cls, container_id: str, argv: Sequence[str] | None, timeout: float) -> HostProbe | None:
        """The host probe of container ``container_id`` whose healthcheck is ``argv`` (its own
        ``timeout``), or None: not recognised, or not possible here (see the module doc)."""
        if not argv or not enabled():
            return None
        check = recognise(argv)
        if check is None:
            return None
        pid = listening.main_pid(container_id)
        if pid <= 0:
            return None
        return cls(Target(container_id, pid), check, min(NET_TIMEOUT, timeout))

    def passes(self) -> bool | None:
        """True: the healthcheck passes now, as the real one would. False: not now (or not answered from
        here this time). None: never from here; ask ``docker exec``."""
        if _denied.is_set():
            return None
        try:
            self.target.still_there()
            if not self._programs:
                require_programs(self.target, self.check.programs)
                self._programs = True
            return self.check.answer(self.target, self.limit)
        except Unanswerable:
            # not from here (no privilege, the main process gone, a program or path the host cannot judge
            # as the container would): `docker exec` as before, for the rest of this wait
            return None
