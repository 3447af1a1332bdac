"""How forge (and a test, through ``forgelib.stacks.connect``) reaches a postgres service: the credentials its
seed used, the port the server listens on, and a direct psycopg connection to its published port."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from forgelib.clients import deferred
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds.base import CONNECT_TIMEOUT, Address
from forgelib.kinds.postgres import PORT as DEFAULT_PORT

if TYPE_CHECKING:
    import psycopg
    import psycopg.conninfo
else:  # loaded at first use (forgelib.clients says why)
    psycopg = deferred("psycopg")

DEFAULT_USER = "postgres"


def postgres_credentials(options: Mapping[str, Any], environment: Mapping[str, Any]) -> tuple[str, str]:
    """(user, database): ``options``' user/database, else the service's POSTGRES_USER / POSTGRES_DB.

    Like the official image, the database defaults to the user's name (``postgres`` when neither is set).
    The seed and the SQL state checks both connect this way, from the *resolved* compose config, so a
    check reads the database the seed wrote.
    """
    user = str(options.get("user") or environment.get("POSTGRES_USER") or DEFAULT_USER)
    database = str(options.get("database") or environment.get("POSTGRES_DB") or user)
    return user, database


def direct_port(service_config: ServiceConfig) -> int:
    """Where the server listens in the container: ``PGPORT`` (the official image honours it), else 5432."""
    port = service_config.environment.get("PGPORT") or ""
    return int(port) if port.isdigit() else DEFAULT_PORT


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

    client = connect  # the name ``forgelib.stacks.connect.client`` opens every kind's params by


def connection_params(
    service_config: ServiceConfig,
    options: Mapping[str, Any],
    address: Callable[[int], tuple[str, int]],
    *,
    database: str | None = None,
) -> PostgresParams:
    """A postgres service's direct connection: its *resolved* compose config, the seed binding's
    ``options`` (user/database), and ``address`` (container port -> published host and port)."""
    env = service_config.environment
    user, db = postgres_credentials(options, env)
    host, port = address(direct_port(service_config))
    password = env.get("POSTGRES_PASSWORD")
    return PostgresParams(host, port, user, str(password) if password else None, database or db)


# The kind's ``Client`` (``forgelib.kinds.base``): what ``forgelib.stacks.connect`` dispatches to. Its
# ``params`` are the connection; ``PostgresParams`` opens it (``client``) and spells it (``url``).
params = connection_params


def connection_strings(
    service_config: ServiceConfig, options: Mapping[str, Any], address: Address
) -> dict[str, str]:
    """What the agent's manifest gives for the service: a libpq DSN and a URL."""
    pg = connection_params(service_config, options, address)
    return {"dsn": pg.dsn(), "url": pg.url()}
