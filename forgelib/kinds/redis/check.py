"""The ``redis`` check on a redis service: ``redis-cli --raw`` in the service."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.kinds.base import ExecStack, ObservationError, observe_exec
from forgelib.resolved import ServiceConfig

# redis-cli exits 0 on a server error reply: one of these as the whole answer is a failure.
ERROR_REPLIES = ("ERR ", "WRONGTYPE ", "NOAUTH ")


def observe(stack: ExecStack, spec: Mapping[str, Any], svc: ServiceConfig, timeout: float) -> str:
    command = spec["command"]
    argv = ["redis-cli", "--raw", *([command] if isinstance(command, str) else [str(c) for c in command])]
    out = observe_exec(stack, spec["service"], argv, timeout)
    if out.startswith(ERROR_REPLIES):
        raise ObservationError(f"redis {' '.join(argv[2:])!s} in service {spec['service']!r}: {out.strip()}")
    return out
