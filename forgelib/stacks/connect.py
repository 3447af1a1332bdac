"""Direct connections to a provisioned stack's services, dispatched by each service's kind.

The override forge generates for every stack publishes the port of each reset service whose recipe talks
to it directly (``Recipe.direct_port``) on **127.0.0.1 at a random host port**. This module turns a
``Stack`` and one of its services into that service's connection parameters, an open client or a URL,
with the credentials the seed itself used. It only looks the stack up and dispatches: the kind recognised
for the service (``Stack.kind``: its image, or its ``io.forgelib.kind`` label) builds them with its client
module (``Kind.client``, a ``kinds.base.Client``), their one owner. So a kind registered with a client is
reachable here, and from the pytest fixture, with no code outside its package::

    with connect.client(stack, "app-db") as conn:           # psycopg, PyMySQL, redis-py: by the kind
        ...
    connect.url(stack, "cache", db=1)                        # redis://127.0.0.1:49153/1

``postgres``/``mysql``/``redis`` (and ``postgres_dsn``, ``connect_postgres``, ``redis_url``,
``redis_client``) are the named forms existing callers use: the same dispatch with the kind given, so they
also reach a service forge does not recognise, and they return the kind's typed parameters.

A ``compose exec psql`` round trip starts two CLIs and a process; a direct query is one round trip on an
open connection (benchmarks/README.md, "Figures behind the code's choices"). Any service that publishes
the port works (a shared one the user published, say): the host port is asked of compose (``docker
compose port``), one call per lookup, so callers that connect often keep the params.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from forgelib.errors import ForgeError
from forgelib.kinds import mysql as mysql_kind
from forgelib.kinds import postgres as postgres_kind
from forgelib.kinds import redis as redis_kind
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import Address, Client
from forgelib.kinds.kind import Kind
from forgelib.kinds.mysql.client import MysqlParams
from forgelib.kinds.postgres.client import PostgresParams
from forgelib.kinds.redis.client import RedisParams
from forgelib.spec.models import EnvironmentManifest
from forgelib.stacks.stack import Stack

if TYPE_CHECKING:
    import psycopg
    import redis as redis_lib


class PortLookup(Protocol):
    """Where a container port is published on the host (``ComposeProject.port``)."""

    def port(self, service: str, container_port: int) -> tuple[str, int]: ...


def binding_options(env: EnvironmentManifest, service: str) -> Mapping[str, Any]:
    """The ``reset:`` options bound to ``service`` (user/database for sql_dump), empty when unbound."""
    svc = env.services.get(service)
    return svc.reset.options if svc is not None and svc.reset is not None else {}


def address(compose: PortLookup, service: str, inside: bool) -> Address:
    """Where a container port of ``service`` is reached: its published loopback port, or (``inside``) the
    service's name and the port itself."""
    if inside:
        return lambda port: (service, port)
    return lambda port: compose.port(service, port)


# -------------------------------------------------------------------------------- by the service's kind


def kind_of(stack: Stack, service: str, kind: Kind | str | None = None) -> tuple[Kind, Client]:
    """The kind whose client reaches ``service`` and that client: ``kind`` when given (a ``Kind`` or its
    name), else the kind recognised for the service; a ``ForgeError`` naming the services forge connects
    to when there is none."""
    stack.service(service)  # an unknown service: the stack's own error, naming its services
    if isinstance(kind, str):
        found = kinds.BY_NAME.get(kind)
        if found is None:
            raise ForgeError(f"no kind {kind!r}; kinds: {', '.join(kinds.BY_NAME)}")
        kind = found
    chosen = kind if kind is not None else stack.kind(service)
    module = kinds.client(chosen) if chosen is not None else None
    if chosen is None or module is None:
        reachable = [s for s in stack.services if (k := stack.kind(s)) is not None and k.client]
        what = (
            f"is a {chosen.name} service, which forge has no client for"
            if chosen is not None
            else "is of no kind forge recognises"
        )
        raise ForgeError(
            f"service {service!r} {what}; services forge connects to: {', '.join(reachable) or '(none)'} "
            f"(a service whose image forge does not recognise can name its kind with the compose label "
            f"{kinds.DECLARED})"
        )
    return chosen, module


def params(
    stack: Stack, service: str, *, kind: Kind | str | None = None, inside: bool = False, **keywords: Any
) -> Any:
    """``service``'s connection parameters, as its kind builds them (``inside``: as a container on the
    stack's network reaches it, by service name and container port)."""
    _, module = kind_of(stack, service, kind)
    return _params(module, stack, service, inside, keywords)


def client(stack: Stack, service: str, *, kind: Kind | str | None = None, **keywords: Any) -> Any:
    """An open client of ``service`` on its loopback port (psycopg, PyMySQL, redis-py: by its kind). The
    keywords the kind's ``params`` names choose the connection (``database``, ``db``); the others say how
    to open it (``autocommit``, ``decode_responses``). The caller closes it."""
    _, module = kind_of(stack, service, kind)
    chosen = _keywords(module)
    connection = {k: v for k, v in keywords.items() if k in chosen}
    how = {k: v for k, v in keywords.items() if k not in chosen}
    return _params(module, stack, service, False, connection).client(**how)


def url(
    stack: Stack, service: str, *, kind: Kind | str | None = None, inside: bool = False, **keywords: Any
) -> str:
    """``service``'s connection as a URL (``postgresql://``, ``mysql://``, ``redis://``: by its kind)."""
    return str(params(stack, service, kind=kind, inside=inside, **keywords).url())


def _params(module: Client, stack: Stack, service: str, inside: bool, keywords: Mapping[str, Any]) -> Any:
    return module.params(
        stack.service(service),
        binding_options(stack.environment, service),
        address(stack.compose, service, inside),
        **keywords,
    )


def _keywords(module: Client) -> frozenset[str]:
    """The keyword-only parameters of a kind's ``params``: the ones that choose the connection."""
    signature = inspect.signature(module.params)
    return frozenset(p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY)


# ------------------------------------------------------------------- the named forms (existing callers)


def postgres(stack: Stack, service: str, *, database: str | None = None) -> PostgresParams:
    """Parameters for a postgres service of a provisioned stack, as its seed connected."""
    return cast(PostgresParams, params(stack, service, kind=postgres_kind.KIND, database=database))


def postgres_dsn(stack: Stack, service: str, *, database: str | None = None) -> str:
    return postgres(stack, service, database=database).dsn()


def connect_postgres(
    stack: Stack, service: str, *, database: str | None = None, autocommit: bool = True
) -> psycopg.Connection[Any]:
    return postgres(stack, service, database=database).connect(autocommit=autocommit)


def mysql(stack: Stack, service: str, *, database: str | None = None) -> MysqlParams:
    """Parameters for a mysql service of a provisioned stack, as its seed connected."""
    return cast(MysqlParams, params(stack, service, kind=mysql_kind.KIND, database=database))


def redis(stack: Stack, service: str, *, db: int = 0) -> RedisParams:
    """Parameters for a redis service of a provisioned stack."""
    return cast(RedisParams, params(stack, service, kind=redis_kind.KIND, db=db))


def redis_url(stack: Stack, service: str, *, db: int = 0) -> str:
    return redis(stack, service, db=db).url()


def redis_client(stack: Stack, service: str, *, db: int = 0) -> redis_lib.Redis:
    return redis(stack, service, db=db).client()


__all__ = [
    "MysqlParams",
    "PostgresParams",
    "RedisParams",
    "Stack",
    "address",
    "binding_options",
    "client",
    "connect_postgres",
    "kind_of",
    "mysql",
    "params",
    "postgres",
    "postgres_dsn",
    "redis",
    "redis_client",
    "redis_url",
    "url",
]
