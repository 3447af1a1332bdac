"""Direct loopback connections to a provisioned stack's postgres and redis services.

The override forge generates for every stack publishes the port of each reset service whose recipe talks
to it directly (``sql_dump``: postgres, ``redis_dump``: redis; see ``Recipe.direct_port``) on
**127.0.0.1 at a random host port**. This module turns a provisioned stack and its *resolved* compose
config into a psycopg connection / DSN or a ``redis.Redis`` client / URL, with the credentials the seed
itself used (``sql_dump.postgres_credentials``: the binding's ``user``/``database``, else
``POSTGRES_USER``/``POSTGRES_DB``; the password from ``POSTGRES_PASSWORD``; redis's ``--requirepass``).

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from forgelib.clients import deferred
from forgelib.compose import ComposeProject
from forgelib.errors import ForgeError
from forgelib.seeds import redis_dump, sql_dump
from forgelib.spec.models import EnvironmentManifest

if TYPE_CHECKING:
    import psycopg
    import psycopg.conninfo
    import redis as redis_lib
else:  # loaded at first use (forgelib.clients says why)
    psycopg = deferred("psycopg")
    redis_lib = deferred("redis")

CONNECT_TIMEOUT = 10  # seconds; a published port that does not answer is a dead stack, not a slow one


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


def service_config(config: Mapping[str, Any], service: str) -> Mapping[str, Any]:
    """One service of a resolved compose config; a clear error when the stack has no such service."""
    services = config.get("services") or {}
    if service not in services:
        known = ", ".join(sorted(services)) or "(none)"
        raise ForgeError(f"the stack has no service {service!r}; services: {known}")
    out = services[service]
    return out if isinstance(out, Mapping) else {}


def binding_options(env: EnvironmentManifest, service: str) -> Mapping[str, Any]:
    """The ``reset:`` options bound to ``service`` (user/database for sql_dump), empty when unbound."""
    svc = env.services.get(service)
    return svc.reset.options if svc is not None and svc.reset is not None else {}


# -------------------------------------------------------------------------------------------- postgres


@dataclass(frozen=True)
class PostgresParams:
    host: str
    port: int
    user: str
    password: str | None
    dbname: str

    def dsn(self, *, dbname: str | None = None) -> str:
        """A libpq connection string (``host=127.0.0.1 port=49153 user=app ...``)."""
        kw: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user}
        kw["dbname"] = dbname or self.dbname
        if self.password:
            kw["password"] = self.password
        return psycopg.conninfo.make_conninfo(**kw, connect_timeout=CONNECT_TIMEOUT)

    def url(self, *, dbname: str | None = None) -> str:
        """The same as a ``postgresql://`` URL (for tools that take URLs)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        return f"postgresql://{auth}@{self.host}:{self.port}/{quote(dbname or self.dbname, safe='')}"

    def connect(self, *, dbname: str | None = None, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A psycopg connection (autocommit by default: ``CREATE/DROP DATABASE`` need it)."""
        try:
            return psycopg.connect(self.dsn(dbname=dbname), autocommit=autocommit)
        except psycopg.Error as e:
            where = f"{self.host}:{self.port}/{dbname or self.dbname} as {self.user}"
            raise ForgeError(f"could not connect to postgres at {where}: {e}") from e


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
    env = svc.get("environment") or {}
    env = env if isinstance(env, Mapping) else {}
    user, db = sql_dump.postgres_credentials(options or {}, env)
    port_in = sql_dump.direct_port(svc)
    host, port = (service, port_in) if inside else compose.port(service, port_in)
    password = env.get("POSTGRES_PASSWORD")
    return PostgresParams(host, port, user, str(password) if password else None, database or db)


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
            socket_timeout=CONNECT_TIMEOUT * 3,
            single_connection_client=True,
            decode_responses=decode_responses,
        )


def redis_params(
    compose: PortLookup, service: str, config: Mapping[str, Any], db: int = 0, *, inside: bool = False
) -> RedisParams:
    svc = service_config(config, service)
    port_in = redis_dump.direct_port(svc)
    host, port = (service, port_in) if inside else compose.port(service, port_in)
    return RedisParams(host, port, redis_dump.command_option(svc, "requirepass"), db)


def redis(stack: Stack, service: str, *, db: int = 0) -> RedisParams:
    """Parameters for a redis service of a provisioned stack."""
    return redis_params(stack.compose, service, stack.config, db)


def redis_url(stack: Stack, service: str, *, db: int = 0) -> str:
    return redis(stack, service, db=db).url()


def redis_client(stack: Stack, service: str, *, db: int = 0) -> redis_lib.Redis:
    return redis(stack, service, db=db).client()
