"""``redis-cli ping`` answered from the host (``forgelib/docker/hostprobe.py``): a PING over a socket in
the container's network namespace, for the forms recognised exactly (TCP to its loopback)."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from forgelib.docker import hostprobe as hp

PORT = 6379  # redis-cli's default port
PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"


def _redis_cli(args: Sequence[str]) -> hp.Answer | None:
    """``redis-cli [-h 127.0.0.1] [-p P] ping|PING``; else None."""
    parsed = hp.options(args, {"-h", "-p"})
    if parsed is None or parsed[1] not in (["ping"], ["PING"]):
        return None
    opts = parsed[0]
    port = hp.port_of(opts.get("-p", str(PORT)))
    if opts.get("-h", hp.LOOPBACK) != hp.LOOPBACK or port is None:  # redis-cli's default host
        return None
    return lambda target, limit: ping(target, port, limit)


def ping(target: hp.Target, port: int, limit: float) -> bool:
    """``redis-cli ping``'s PONG."""

    def talk(s: socket.socket) -> bool:
        s.sendall(PING)
        return verdict(hp.recv_line(s))

    return hp.exchange(target, hp.LOOPBACK, port, limit, talk)


def verdict(reply: bytes) -> bool:
    """Whether a reply to PING is the PONG the healthcheck looks for (an error such as ``-LOADING`` or
    ``-NOAUTH`` is not)."""
    return reply == PONG


FORMS: Mapping[str, hp.Parse] = {"redis-cli": _redis_cli}
SHELL_FORMS: Mapping[str, tuple[tuple[str, ...], hp.Answer]] = {
    "redis-cli ping | grep -q PONG": (("/bin/sh", "redis-cli", "grep"), lambda t, lim: ping(t, PORT, lim)),
}
