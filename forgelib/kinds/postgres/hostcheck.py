"""``pg_isready`` answered from the host (``forgelib/docker/hostprobe.py``): libpq's ``PQping`` over a
socket in the container's network namespace, for the forms recognised exactly (TCP to its loopback)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence

from forgelib.docker import hostprobe as hp

PROTOCOL = 3 << 16  # protocol 3.0, as a StartupMessage gives it
CANNOT_CONNECT_NOW = "57P03"  # the SQLSTATE of a server starting up or shutting down
DEFAULT_PORT = "5432"
DEFAULT_USER = "root"  # libpq's default user is the OS user; the healthcheck runs as the container's


def _pg_isready(args: Sequence[str]) -> hp.Answer | None:
    """``pg_isready -h 127.0.0.1|localhost [-p P] [-U U] [-d D] [-q] [-t T]``; else None."""
    parsed = hp.options(args, {"-h", "-p", "-U", "-d", "-t"}, {"-q"})
    if parsed is None or parsed[1]:
        return None
    opts = parsed[0]
    port = hp.port_of(opts.get("-p", DEFAULT_PORT))
    db = opts.get("-d", "")
    if opts.get("-h") not in hp.LOCAL or port is None or not opts.get("-t", "3").isdigit():
        return None
    if "=" in db or "://" in db:
        return None  # a connection string as -d may name another host
    host, user = opts["-h"], opts.get("-U", DEFAULT_USER)
    return lambda target, limit: ping(target, host, port, user, db or user, limit)


def ping(target: hp.Target, host: str, port: int, user: str, database: str, limit: float) -> bool:
    """libpq's ``PQping`` as ``pg_isready`` uses it: True for ``PQPING_OK`` (no answer: NO_RESPONSE)."""

    def talk(s: socket.socket) -> bool:
        s.sendall(startup(user, database))
        while True:
            kind, body = message(s)
            answer = verdict(kind, body)
            if answer is not None:
                if kind == b"R" and body[:4] == b"\0\0\0\0":  # trusted: end the session as libpq does
                    s.sendall(b"X\0\0\0\4")
                return answer

    return hp.exchange(target, host, port, limit, talk)


def startup(user: str, database: str) -> bytes:
    """A protocol 3.0 StartupMessage."""
    pairs = (("user", user), ("database", database))
    params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in pairs)
    body = struct.pack("!I", PROTOCOL) + params + b"\0"
    return struct.pack("!I", len(body) + 4) + body


def message(s: socket.socket) -> tuple[bytes, bytes]:
    """One backend message: its type byte and body."""
    head = hp.recv_exact(s, 5)
    (length,) = struct.unpack("!I", head[1:])
    if not 4 <= length <= 1 << 20:
        raise OSError(f"not a backend message (length {length})")
    return head[:1], hp.recv_exact(s, length - 4)


def verdict(kind: bytes, body: bytes) -> bool | None:
    """What libpq's ``internal_ping`` makes of the server's first answer: an authentication request means
    it accepts connections (True), so does an ErrorResponse whose SQLSTATE is not ``57P03``
    (cannot_connect_now: False); an error without SQLSTATE is no response (False). None: read on (a
    notice, a protocol negotiation)."""
    if kind == b"R":
        return True
    if kind == b"E":
        fields = dict((f[:1], f[1:]) for f in body.split(b"\0") if f)
        sqlstate = fields.get(b"C", b"").decode(errors="replace")
        return len(sqlstate) == 5 and sqlstate != CANNOT_CONNECT_NOW
    if kind in (b"N", b"v"):
        return None
    raise OSError(f"unexpected backend message {kind!r}")


FORMS: Mapping[str, hp.Parse] = {"pg_isready": _pg_isready}
SHELL_FORMS: Mapping[str, tuple[tuple[str, ...], hp.Answer]] = {}
