"""``sql_dump``: stream the dump into ``psql`` inside the service, stopping at the first SQL error.

``ON_ERROR_STOP=1`` turns any SQL error into a non-zero exit (psql's default is to carry on and exit 0),
and the dump goes to stdin straight from the file, so its size never matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.errors import CommandError
from forgelib.seeds.base import ApplyContext, SeedTarget

OPTIONS = frozenset({"user", "database"})
DEFAULT_USER = "postgres"
DEFAULT_PORT = 5432


def check(target: SeedTarget) -> None:
    if not target.seed.path.is_file():
        raise target.fail("guard", f"seed {target.seed.name!r} is not a file: {target.seed.path}")


def postgres_credentials(options: Mapping[str, Any], environment: Mapping[str, Any]) -> tuple[str, str]:
    """(user, database): ``options``' user/database, else the service's POSTGRES_USER / POSTGRES_DB.

    Like the official image, the database defaults to the user's name (``postgres`` when neither is set).
    The seed and the SQL state checks both connect this way, from the *resolved* compose config, so a
    check reads the database the seed wrote.
    """
    user = str(options.get("user") or environment.get("POSTGRES_USER") or DEFAULT_USER)
    database = str(options.get("database") or environment.get("POSTGRES_DB") or user)
    return user, database


def credentials(ctx: ApplyContext) -> tuple[str, str]:
    return postgres_credentials(ctx.options, ctx.environment())


def argv(user: str, database: str) -> list[str]:
    # -q: no "INSERT 0 1" per statement on stdout, which the runner would hold in memory (a dump of
    # single-row INSERTs grew the forge process by about its own size).
    return ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", database]


def apply(ctx: ApplyContext) -> None:
    user, database = credentials(ctx)
    try:
        ctx.compose.exec(ctx.service, argv(user, database), stdin=ctx.seed.path, timeout=ctx.timeouts.recipe)
    except CommandError as e:
        raise ctx.fail("psql", str(e)) from e


def direct_port(service_config: Mapping[str, Any]) -> int:
    """Where the server listens in the container: ``PGPORT`` (the official image honours it), else 5432."""
    env = service_config.get("environment") or {}
    port = str(env.get("PGPORT") or "") if isinstance(env, Mapping) else ""
    return int(port) if port.isdigit() else DEFAULT_PORT
