"""How forge (and a test, through ``forgelib.stacks.connect``) reaches a redis service: the server's port and
password from its command line, and a direct redis-py client of its published port."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from forgelib.clients import deferred
from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds.base import CONNECT_TIMEOUT, Address
from forgelib.kinds.redis import PORT as DEFAULT_PORT

if TYPE_CHECKING:
    import redis as redis_lib
else:  # loaded at first use (forgelib.clients says why)
    redis_lib = deferred("redis")

COMMAND_TIMEOUT = CONNECT_TIMEOUT * 3  # how long a command's answer may take


def direct_port(service_config: ServiceConfig) -> int:
    """The server's port: ``--port N`` on its command line, else 6379."""
    value = command_option(service_config, "port")
    return int(value) if value and value.isdigit() else DEFAULT_PORT


def command_option(service_config: ServiceConfig, name: str) -> str | None:
    """The value of ``--NAME VALUE`` on the service's (resolved) command line, or None."""
    argv = service_config.command
    for i, arg in enumerate(argv[:-1]):
        if arg == f"--{name}":
            return argv[i + 1]
    return None


@dataclass(frozen=True)
class RedisParams:
    host: str
    port: int
    password: str | None = None
    db: int = 0

    def url(self, *, db: int | None = None) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/{self.db if db is None else db}"

    def client(self, *, db: int | None = None, decode_responses: bool = False) -> redis_lib.Redis:
        """A ``redis.Redis`` on one connection (``SELECT`` in a pipeline then stays on that connection)."""
        return redis_lib.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            db=self.db if db is None else db,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=COMMAND_TIMEOUT,
            # Fail at the first timeout: redis-py 8 retries a connection ten times, so a paused or hung
            # server would hold a reset (or a test's client) for ten socket timeouts before it is replaced.
            retry=redis_lib.retry.Retry(redis_lib.backoff.NoBackoff(), 0),
            single_connection_client=True,
            decode_responses=decode_responses,
        )


def connection_params(
    service_config: ServiceConfig, address: Callable[[int], tuple[str, int]], db: int = 0
) -> RedisParams:
    """A redis service's direct connection: its *resolved* compose config (``--port``, ``--requirepass``)
    and ``address`` (container port -> published host and port)."""
    host, port = address(direct_port(service_config))
    return RedisParams(host, port, command_option(service_config, "requirepass"), db)


# The kind's ``Client`` (``forgelib.kinds.base``): what ``forgelib.stacks.connect`` dispatches to. Its
# ``params`` are the connection; ``RedisParams`` opens it (``client``) and spells it (``url``). A redis
# service has no binding options: its port and password are on its command line.


def params(
    service_config: ServiceConfig, options: Mapping[str, Any], address: Address, /, *, db: int = 0
) -> RedisParams:
    return connection_params(service_config, address, db)


def connection_strings(
    service_config: ServiceConfig, options: Mapping[str, Any], address: Address
) -> dict[str, str]:
    """What the agent's manifest gives for the service: a ``redis://`` URL."""
    return {"url": connection_params(service_config, address).url()}
