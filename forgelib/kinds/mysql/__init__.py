"""mysql: a MySQL or MariaDB server's state, seeded from a ``sql_dump`` with the server's own client
(``mariadb``/``mysql``), observed by ``sql`` checks and the ``sql_query`` tool, reached with PyMySQL.

Recognised by image (the official ``mysql``/``mariadb`` images, Percona's, the stand-in) or by its
command (``mysqld``/``mariadbd``); any other image says what it runs with the compose label
``io.forgelib.kind: mysql`` (``forgelib.kinds.registry.DECLARED``)."""

from __future__ import annotations

from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds.kind import Kind, StandIn
from forgelib.kinds.postgres import SQL_QUERY  # the one sql_query tool, shared

SEED = "sql_dump"
ROW_LIMIT = 1000  # rows sql_query returns (as postgres); more are counted, not sent
SERVERS = ("mysqld", "mariadbd")


def _detect(svc: ServiceConfig) -> bool:
    """A server started by its command line (``mysqld``/``mariadbd``, any path)."""
    return bool(svc.command) and svc.command[0].rsplit("/", 1)[-1] in SERVERS


PORT = 3306  # the server's port unless the service says otherwise (``Kind.port``)

KIND = Kind(
    name="mysql",
    package=__name__,
    seeds={SEED: "seed"},
    images=("mysql", "mariadb", "percona"),
    port=PORT,
    detect=_detect,
    strategies=("restart",),
    checks={"sql": "check"},
    tools=(SQL_QUERY,),
    tool_module="tool",
    client="client",
    rules="rules",
    host_checks="hostcheck",
    stand_in=StandIn("mariadb", "forgelib/mariadb:10.11", "FORGE_IMAGE_MARIADB"),
)
