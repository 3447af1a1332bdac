"""``redis_command`` on a redis service: one redis-py connection per service on its published loopback
port, or ``redis-cli`` in the container when the port is not published."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.kinds import toolschema as ts
from forgelib.kinds.base import ToolContext, ToolFailure, as_json, tool_failed
from forgelib.kinds.redis.check import ERROR_REPLIES
from forgelib.kinds.redis.client import RedisParams, command_option, direct_port
from forgelib.resolved import ServiceConfig

if TYPE_CHECKING:
    import redis as redis_lib
else:
    redis_lib = deferred("redis")


class Backend:
    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}

    def call(self, tool: str, service: str, svc: ServiceConfig, args: Mapping[str, Any]) -> str:
        where = self._ctx.published(service, direct_port(svc))
        command = [str(c) for c in args["command"]]
        if where is None:  # redis-cli in the container; REDISCLI_AUTH keeps a password out of argv
            r = self._ctx.run(service, ["redis-cli", "--raw", *command], ts.DEFAULT_TIMEOUT)
            if r.rc != 0 or r.stdout.startswith(ERROR_REPLIES):
                raise ToolFailure(tool_failed(r, f"redis {command[0]} on service {service!r} failed"))
            return as_json({"reply": r.stdout.rstrip("\n")})
        with self._lock:
            client = self._clients.get(service)
            if client is None:
                password = command_option(svc, "requirepass")
                client = RedisParams(where[0], where[1], password).client()
                # Replies as redis sends them ("OK", not redis-py's True for SET): what redis-cli shows.
                client.response_callbacks.clear()
                self._clients[service] = client
        try:
            with self._lock:  # one connection (single_connection_client): one command on it at a time
                reply = client.execute_command(*command)
        except redis_lib.ResponseError as e:
            raise ToolFailure(f"redis {command[0]} on service {service!r}: {e}") from None
        except redis_lib.RedisError as e:
            raise ToolFailure(f"redis on service {service!r} (port {where[1]}) failed: {e}") from None
        return as_json({"reply": _plain(reply)})

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()


def _plain(reply: Any) -> Any:
    """A redis reply as JSON values: bytes decoded, nested lists and maps kept."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, list | tuple | set):
        return [_plain(x) for x in reply]
    if isinstance(reply, dict):
        return {str(_plain(k)): _plain(v) for k, v in reply.items()}
    return reply
