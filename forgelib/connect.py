"""Direct loopback connections to a provisioned stack's postgres and redis services.

The override forge generates for every stack publishes the port of each reset service whose recipe talks
to it directly (``sql_dump``: postgres, ``redis_dump``: redis; see ``Recipe.direct_port``) on
**127.0.0.1 at a random host port**. This module turns a provisioned stack and its *resolved* compose
config into a psycopg connection / DSN or a ``redis.Redis`` client / URL, with the credentials the seed
itself used. It only looks the stack up: each kind's parameters are built by its seed module, their one
owner (``sql_dump.connection_params``: the binding's ``user``/``database``, else
``POSTGRES_USER``/``POSTGRES_DB``, the password from ``POSTGRES_PASSWORD``, the port from ``PGPORT``;
``redis_dump.connection_params``: ``--port``, ``--requirepass``).

A ``compose exec psql`` round trip costs ~0.1 s; a direct query a millisecond. The warm-stack resets, the
pytest plugin and golden snapshots connect through here::

    trial = provision_trial(...)
    with connect.postgres(trial, "app-db").connect() as conn:
        conn.execute("select 1")
    connect.redis(trial, "redis").client().ping()

Any service that publishes the port works (a shared one the user published, say): the host port is asked
of compose (``docker compose port``), one call per lookup, so callers that connect often keep the params.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from forgelib.compose import ComposeProject
from forgelib.errors import ForgeError
from forgelib.kinds.postgres import client as sql_dump
from forgelib.kinds.postgres.client import PostgresParams
from forgelib.kinds.redis import client as redis_dump
from forgelib.kinds.redis.client import RedisParams
from forgelib.resolved import ResolvedConfig, ServiceConfig
from forgelib.spec.models import EnvironmentManifest

if TYPE_CHECKING:
    import psycopg
    import redis as redis_lib


class PortLookup(Protocol):
    """Where a container port is published on the host (``ComposeProject.port``)."""

    def port(self, service: str, container_port: int) -> tuple[str, int]: ...


class Stack(Protocol):
    """What a connection needs of a provisioned stack (``provision.ProvisionedTrial`` satisfies it)."""

    @property
    def compose(self) -> ComposeProject: ...
    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def environment(self) -> EnvironmentManifest: ...


def service_config(config: Mapping[str, Any], service: str) -> ServiceConfig:
    """One service of a resolved compose config; a clear error when the stack has no such service."""
    services = ResolvedConfig.of(config).services
    if service not in services:
        known = ", ".join(sorted(services)) or "(none)"
        raise ForgeError(f"the stack has no service {service!r}; services: {known}")
    return services[service]


def binding_options(env: EnvironmentManifest, service: str) -> Mapping[str, Any]:
    """The ``reset:`` options bound to ``service`` (user/database for sql_dump), empty when unbound."""
    svc = env.services.get(service)
    return svc.reset.options if svc is not None and svc.reset is not None else {}


# -------------------------------------------------------------------------------------------- postgres


def postgres_params(
    compose: PortLookup,
    service: str,
    config: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
    *,
    database: str | None = None,
    inside: bool = False,
) -> PostgresParams:
    """Connection parameters for ``service`` from the resolved compose ``config`` (one ``compose port``;
    ``inside``: as a container on the stack's network reaches it, by service name and container port)."""
    svc = service_config(config, service)
    return sql_dump.connection_params(
        svc, options or {}, address(compose, service, inside), database=database
    )


def postgres(stack: Stack, service: str, *, database: str | None = None) -> PostgresParams:
    """Parameters for a postgres service of a provisioned stack, as its seed connected."""
    opts = binding_options(stack.environment, service)
    return postgres_params(stack.compose, service, stack.config, opts, database=database)


def postgres_dsn(stack: Stack, service: str, *, database: str | None = None) -> str:
    return postgres(stack, service, database=database).dsn()


def connect_postgres(
    stack: Stack, service: str, *, database: str | None = None, autocommit: bool = True
) -> psycopg.Connection[Any]:
    return postgres(stack, service, database=database).connect(autocommit=autocommit)


# ----------------------------------------------------------------------------------------------- redis


def redis_params(
    compose: PortLookup, service: str, config: Mapping[str, Any], db: int = 0, *, inside: bool = False
) -> RedisParams:
    svc = service_config(config, service)
    return redis_dump.connection_params(svc, address(compose, service, inside), db)


def address(compose: PortLookup, service: str, inside: bool) -> Callable[[int], tuple[str, int]]:
    """Where a container port of ``service`` is reached: its published loopback port, or (``inside``) the
    service's name and the port itself."""
    if inside:
        return lambda port: (service, port)
    return lambda port: compose.port(service, port)


def redis(stack: Stack, service: str, *, db: int = 0) -> RedisParams:
    """Parameters for a redis service of a provisioned stack."""
    return redis_params(stack.compose, service, stack.config, db)


def redis_url(stack: Stack, service: str, *, db: int = 0) -> str:
    return redis(stack, service, db=db).url()


def redis_client(stack: Stack, service: str, *, db: int = 0) -> redis_lib.Redis:
    return redis(stack, service, db=db).client()


__all__ = [
    "PostgresParams",
    "RedisParams",
    "Stack",
    "binding_options",
    "connect_postgres",
    "postgres",
    "postgres_dsn",
    "postgres_params",
    "redis",
    "redis_client",
    "redis_params",
    "redis_url",
    "service_config",
]
