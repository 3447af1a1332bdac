"""postgres: a PostgreSQL server's state, seeded from a ``sql_dump``, observed by ``sql`` checks and the
``sql_query`` tool, reached with psycopg."""

from __future__ import annotations

from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import toolschema as ts
from forgelib.kinds.kind import Kind, StandIn, ToolSpec

SEED = "sql_dump"
ROW_LIMIT = 1000  # rows sql_query returns; more are counted, not sent


def _detect(svc: ServiceConfig) -> bool:
    """The official image's environment contract (``POSTGRES_*``)."""
    return any(k.startswith("POSTGRES_") for k in svc.environment)


# Shared by every SQL kind (mysql backs it too): one tool, the service decides which kind answers.
SQL_QUERY = ToolSpec(
    "sql_query",
    "Run SQL on a postgres or mysql service (autocommit; several statements may be separated by ';') and "
    'return JSON {"columns", "rows", "rowcount", "status", "rows_truncated"}: the last '
    f"statement's result, at most {ROW_LIMIT} rows. Values that are not JSON types come back as "
    "strings.",
    ts.obj(
        {
            "service": ts.service("running postgres or mysql"),
            "query": {"type": "string", "minLength": 1, "description": "The SQL."},
            "database": {
                "type": "string",
                "minLength": 1,
                "description": "Database (default the service's).",
            },
            "timeout": ts.TIMEOUT,
        },
        ["service", "query"],
    ),
)

NAME = {"type": "string", "minLength": 1}
# The ``sql`` check's fields, shared by every SQL kind as the tool is.
SQL_CHECK = ts.check(
    {"service": NAME, "query": NAME, "user": NAME, "database": NAME},
    ["service", "query"],
)

PORT = 5432  # the server's port unless the service says otherwise (``Kind.port``)

KIND = Kind(
    name="postgres",
    package=__name__,
    seeds={SEED: "seed"},
    shorthand={".sql": SEED},
    images=("postgres", "postgis"),
    port=PORT,
    detect=_detect,
    strategies=("restart", "template"),
    checks={"sql": "check"},
    check_fields={"sql": SQL_CHECK},
    tools=(SQL_QUERY,),
    tool_module="tool",
    client="client",
    host_checks="hostcheck",
    stand_in=StandIn("postgres", "forgelib/postgres:15", "FORGE_IMAGE_POSTGRES"),
)
