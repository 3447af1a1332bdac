"""How forge reaches a MySQL/MariaDB service: the credentials the official images read from the service's
environment, the server's port, a direct PyMySQL connection to its published port, and the server's own
client run inside the service.

Credentials, as the official ``mysql`` and ``mariadb`` images read them: root's password from
``MARIADB_ROOT_PASSWORD`` or ``MYSQL_ROOT_PASSWORD`` (or their ``_FILE`` forms; none with
``MYSQL_ALLOW_EMPTY_PASSWORD``/``MARIADB_ALLOW_EMPTY_ROOT_PASSWORD``), the application user's from
``M*_USER``/``M*_PASSWORD``, the database from ``M*_DATABASE``. forge connects as root (a dump may create
databases, users and definers) unless the binding says ``user:``, or root's password is random
(``M*_RANDOM_ROOT_PASSWORD``) and the application user is all there is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from forgelib.clients import deferred
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds.base import CONNECT_TIMEOUT, Address
from forgelib.kinds.mysql import PORT as DEFAULT_PORT

if TYPE_CHECKING:
    import pymysql
else:  # loaded at first use (forgelib.clients says why)
    pymysql = deferred("pymysql")

ROOT = "root"
ROOT_PASSWORD = ("MARIADB_ROOT_PASSWORD", "MYSQL_ROOT_PASSWORD")
USER = ("MARIADB_USER", "MYSQL_USER")
USER_PASSWORD = ("MARIADB_PASSWORD", "MYSQL_PASSWORD")
DATABASE = ("MARIADB_DATABASE", "MYSQL_DATABASE")
RANDOM_ROOT = ("MARIADB_RANDOM_ROOT_PASSWORD", "MYSQL_RANDOM_ROOT_PASSWORD")


def _first(env: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)


def _set(env: Mapping[str, str], names: Sequence[str]) -> bool:
    return any(env.get(n) or env.get(f"{n}_FILE") for n in names)


@dataclass(frozen=True)
class Credentials:
    """Who forge connects as: the user, the variables holding its password (first set wins, each also in
    its ``_FILE`` form; none: no password) and the database (None: the dump chooses with ``USE``)."""

    user: str
    password_vars: tuple[str, ...]
    database: str | None

    def password(self, env: Mapping[str, str], read_file: Callable[[str], str] | None = None) -> str | None:
        """The password from ``env``; a ``_FILE`` form is read with ``read_file`` (a path inside the
        service's container), or refused when there is none to read it with."""
        for name in self.password_vars:
            if env.get(name):
                return env[name]
            path = env.get(f"{name}_FILE")
            if path:
                if read_file is None:
                    raise ForgeError(
                        f"the password of {self.user!r} is in a file in the container ({name}_FILE)"
                    )
                return read_file(path).rstrip("\n")
        return None


def credentials(options: Mapping[str, Any], env: Mapping[str, str]) -> Credentials:
    """The binding's ``user``/``database`` options, else what the official images set up (module doc)."""
    app_user = _first(env, USER)
    user = options.get("user")
    if not user:
        random_root = _set(env, RANDOM_ROOT) and not _set(env, ROOT_PASSWORD)
        user = app_user if random_root and app_user else ROOT
    user = str(user)
    if user == ROOT:
        vars_: tuple[str, ...] = ROOT_PASSWORD
    elif user == app_user:
        vars_ = USER_PASSWORD
    else:
        vars_ = ()
    database = options.get("database") or _first(env, DATABASE)
    return Credentials(user, vars_, str(database) if database else None)


def direct_port(service_config: ServiceConfig) -> int:
    """Where the server listens in the container: ``--port=N``/``--port N`` on its command line, else
    ``MYSQL_TCP_PORT``, else 3306."""
    argv = service_config.command
    for i, arg in enumerate(argv):
        value = arg.removeprefix("--port=") if arg.startswith("--port=") else None
        if arg in ("--port", "-P") and i + 1 < len(argv):
            value = argv[i + 1]
        if value and value.isdigit():
            return int(value)
    port = service_config.environment.get("MYSQL_TCP_PORT") or ""
    return int(port) if port.isdigit() else DEFAULT_PORT


# The server's own client inside the service, as the given user, its password read from the service's own
# environment (the variables the entrypoint read; never in forge's argv, logs or errors):
#   sh -c CLIENT forge-mysql USER DATABASE VAR... -- CLIENT-ARGS...
CLIENT = (
    "u=$1; d=$2; shift 2; pw=; found=; "
    'while [ $# -gt 0 ] && [ "$1" != -- ]; do '
    'if [ -z "$found" ]; then eval "v=\\${$1:-}; f=\\${$1_FILE:-}"; '
    'if [ -n "$v" ]; then pw=$v; found=1; elif [ -n "$f" ]; then pw=$(cat "$f") || exit 1; found=1; fi; fi; '
    "shift; done; shift; "
    'c=$(command -v mariadb || command -v mysql) || { echo "neither the mariadb nor the mysql client is in '
    'this service: is it a MySQL or MariaDB server?" >&2; exit 127; }; '
    '[ -z "$pw" ] || export MYSQL_PWD="$pw"; '
    '[ -z "$d" ] || set -- --database="$d" "$@"; '
    'exec "$c" --user="$u" "$@"'
)
NO_CLIENT = 127  # CLIENT's exit status when the service has neither client


def client_argv(creds: Credentials, *args: str) -> list[str]:
    """argv running the server's client (``mariadb``, else ``mysql``) in the service with ``args``."""
    return [
        "sh",
        "-c",
        CLIENT,
        "forge-mysql",
        creds.user,
        creds.database or "",
        *creds.password_vars,
        "--",
        *args,
    ]


@dataclass(frozen=True)
class MysqlParams:
    host: str
    port: int
    user: str
    password: str | None
    database: str | None

    def url(self, *, database: str | None = None) -> str:
        """A ``mysql://`` URL (SQLAlchemy-style tools take ``mysql+pymysql://`` with the same rest)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        db = database or self.database or ""
        return f"mysql://{auth}@{self.host}:{self.port}/{quote(db, safe='')}"

    def connect(self, *, database: str | None = None, autocommit: bool = True) -> pymysql.Connection[Any]:
        """A PyMySQL connection (autocommit by default), utf8mb4."""
        try:
            return pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password or "",
                database=database or self.database,
                autocommit=autocommit,
                charset="utf8mb4",
                connect_timeout=CONNECT_TIMEOUT,
                client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS,  # "a; b" as the client takes it
            )
        except pymysql.Error as e:
            where = f"{self.host}:{self.port}/{database or self.database or ''} as {self.user}"
            raise ForgeError(f"could not connect to mysql at {where}: {message(e)}") from e

    client = connect  # the name ``forgelib.stacks.connect.client`` opens every kind's params by


def message(e: BaseException) -> str:
    """A PyMySQL error as the server said it: ``(1045, "Access denied ...")`` -> ``1045: Access ...``."""
    args: tuple[Any, ...] = tuple(getattr(e, "args", ()))
    if len(args) == 2 and isinstance(args[0], int):
        return f"{args[0]}: {args[1]}"
    return str(e).strip() or type(e).__name__


def connection_params(
    service_config: ServiceConfig,
    options: Mapping[str, Any],
    address: Callable[[int], tuple[str, int]],
    *,
    database: str | None = None,
    read_file: Callable[[str], str] | None = None,
) -> MysqlParams:
    """A MySQL service's direct connection: its *resolved* compose config, the binding's ``options``
    (user/database) and ``address`` (container port -> published host and port)."""
    env = service_config.environment
    creds = credentials(options, env)
    password = creds.password(env, read_file)
    host, port = address(direct_port(service_config))
    return MysqlParams(host, port, creds.user, password, database or creds.database)


# The kind's ``Client`` (``forgelib.kinds.base``): what ``forgelib.stacks.connect`` dispatches to. Its
# ``params`` are the connection; ``MysqlParams`` opens it (``client``) and spells it (``url``).
params = connection_params


def connection_strings(
    service_config: ServiceConfig, options: Mapping[str, Any], address: Address
) -> dict[str, str]:
    """What the agent's manifest gives for the service: a URL, and the parts a driver takes."""
    p = connection_params(service_config, options, address)
    return {"url": p.url(), "host": p.host, "port": str(p.port), "user": p.user, "database": p.database or ""}
