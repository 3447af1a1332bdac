"""redis: a Redis (or Valkey) server's keyspace, seeded from a ``redis_dump``, observed by ``redis``
checks and the ``redis_command`` tool, reached with redis-py."""

from __future__ import annotations

from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import toolschema as ts
from forgelib.kinds.kind import Kind, StandIn, ToolSpec

SEED = "redis_dump"


def _detect(svc: ServiceConfig) -> bool:
    """A server started by its command line."""
    return bool(svc.command) and svc.command[0].endswith(("redis-server", "valkey-server"))


REDIS_COMMAND = ToolSpec(
    "redis_command",
    'Run one command on a redis service and return JSON {"reply": ...}: strings, integers, lists '
    "and null as redis answers (bulk strings decoded as UTF-8).",
    ts.obj(
        {
            "service": ts.service("running redis"),
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": 'The command and its arguments, e.g. ["HGETALL", "order:7"].',
            },
        },
        ["service", "command"],
    ),
)

PORT = 6379  # the server's port unless the service says otherwise (``Kind.port``)

REDIS_CHECK = ts.check(
    {
        "service": {"type": "string", "minLength": 1},
        "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    },
    ["service", "command"],
)

KIND = Kind(
    name="redis",
    package=__name__,
    seeds={SEED: "seed"},
    shorthand={".rdb": SEED},
    images=("redis", "valkey"),
    port=PORT,
    detect=_detect,
    checks={"redis": "check"},
    check_fields={"redis": REDIS_CHECK},
    tools=(REDIS_COMMAND,),
    tool_module="tool",
    client="client",
    rules="rules",
    host_checks="hostcheck",
    stand_in=StandIn("redis", "forgelib/redis:7.0", "FORGE_IMAGE_REDIS"),
)
