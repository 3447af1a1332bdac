"""``mariadb-admin ping`` / ``mysqladmin ping`` answered from the host (``forgelib/docker/hostprobe.py``):
the server's initial handshake over a socket in the container's network namespace, for the forms
recognised exactly (TCP to its loopback; ``localhost`` is the unix socket to these clients)."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from forgelib.docker import hostprobe as hp

DEFAULT_PORT = "3306"
PROTOCOL = 10  # the initial handshake's protocol version
LONG = {"--host": "-h", "--port": "-P", "--user": "-u", "--password": "-p"}


def _admin_ping(args: Sequence[str]) -> hp.Answer | None:
    """``mariadb-admin|mysqladmin ping -h 127.0.0.1 [-P port] [-u… -p…]``; else None."""
    # -p only with its password attached: `-p` alone asks for one
    parsed = hp.options(args, {"-h", "-P", "-u"}, long=LONG, attached={"-p"})
    if parsed is None or parsed[1] != ["ping"]:
        return None
    opts = parsed[0]
    port = hp.port_of(opts.get("-P", DEFAULT_PORT))
    if opts.get("-h") != hp.LOOPBACK or port is None:
        return None
    return lambda target, limit: ping(target, port, limit)


def ping(target: hp.Target, port: int, limit: float) -> bool:
    """The admin client's "is alive": the server's initial handshake (it says alive even when the login
    is then refused)."""

    def talk(s: socket.socket) -> bool:
        head = hp.recv_exact(s, 4)
        length = int.from_bytes(head[:3], "little")
        return verdict(head + (hp.recv_exact(s, 1) if length else b""))

    return hp.exchange(target, hp.LOOPBACK, port, limit, talk)


def verdict(start: bytes) -> bool:
    """Whether a packet beginning with ``start`` (4 header bytes, then its payload) is the initial
    handshake of protocol 10 (an error packet, 0xff, is not)."""
    return len(start) >= 5 and start[3] == 0 and start[4] == PROTOCOL


FORMS: Mapping[str, hp.Parse] = {"mariadb-admin": _admin_ping, "mysqladmin": _admin_ping}
SHELL_FORMS: Mapping[str, tuple[tuple[str, ...], hp.Answer]] = {}
