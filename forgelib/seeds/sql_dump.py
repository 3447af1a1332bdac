"""``sql_dump``: stream the dump into ``psql`` inside the service, stopping at the first SQL error.

``ON_ERROR_STOP=1`` turns any SQL error into a non-zero exit (psql's default is to carry on and exit 0),
and the dump goes to stdin straight from the file, so its size never matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from forgelib import connect
from forgelib.errors import CommandError, ForgeError, RecipeError
from forgelib.seeds.base import ApplyContext, Fingerprint, SeedTarget, fingerprint_part

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
        # The dump goes in on stdin, so the argv cannot show which file failed: name it (the error itself
        # carries psql's rc and stderr).
        raise ctx.fail("psql", f"seed file {ctx.seed.path} (on psql's stdin): {e}") from e


def direct_port(service_config: Mapping[str, Any]) -> int:
    """Where the server listens in the container: ``PGPORT`` (the official image honours it), else 5432."""
    env = service_config.get("environment") or {}
    port = str(env.get("PGPORT") or "") if isinstance(env, Mapping) else ""
    return int(port) if port.isdigit() else DEFAULT_PORT


# ---------------------------------------------------------------------------------------------- warm
#
# prepare: right after the dump went in (no dependent connected yet), copy the seeded database into a
# template database named after the seed digest, closed to connections. reset: ``DROP DATABASE … WITH
# (FORCE)`` (ends every session on it) and ``CREATE DATABASE … TEMPLATE`` the template, under the name the
# services expect and with the original owner. All on a direct connection to the maintenance database.


@dataclass(frozen=True)
class Prepared:
    params: connect.PostgresParams  # dbname: the maintenance database forge connects to
    database: str  # the seeded database the services use
    template: str
    owner: str


def template_name(digest: str) -> str:
    return "forge_tpl_" + digest.removeprefix("sha256:")[:16]


def _params(ctx: ApplyContext) -> connect.PostgresParams:
    user, database = credentials(ctx)
    host, port = ctx.address(direct_port(ctx.service_config))
    password = ctx.environment().get("POSTGRES_PASSWORD")
    # The maintenance database: never the seeded one (it is dropped), template1 when that is `postgres`.
    maint = "template1" if database == "postgres" else "postgres"
    return connect.PostgresParams(host, port, user, str(password) if password else None, maint)


def _fail(ctx: ApplyContext, step: str, e: Exception) -> RecipeError:
    return ctx.fail(step, f"{type(e).__name__}: {e}".strip())


def prepare(ctx: ApplyContext) -> Prepared:
    _, database = credentials(ctx)
    params = _params(ctx)
    tpl = template_name(ctx.seed.digest)
    try:
        with params.connect() as conn:
            row = conn.execute(
                "select pg_get_userbyid(datdba) from pg_database where datname = %s", (database,)
            ).fetchone()
            if row is None:
                raise ctx.fail("prepare", f"database {database!r} does not exist after seeding")
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(tpl)))
            create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
            conn.execute(create.format(sql.Identifier(tpl), sql.Identifier(database)))
            # Closed to connections: nothing can change it, and CREATE … TEMPLATE never waits on a session.
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                    sql.Identifier(tpl)
                )
            )
    except (psycopg.Error, ForgeError) as e:
        if isinstance(e, RecipeError):
            raise
        raise _fail(ctx, "prepare", e) from e
    return Prepared(params, database, tpl, str(row[0]))


def reset(ctx: ApplyContext, prepared: object) -> None:
    assert isinstance(prepared, Prepared)
    p = prepared
    db, tpl, owner = (sql.Identifier(x) for x in (p.database, p.template, p.owner))
    try:
        with p.params.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(db, tpl, owner))
    except (psycopg.Error, ForgeError) as e:
        raise _fail(ctx, "reset", e) from e


# What a trial can change in the cluster beyond its database. xmin of a catalog row changes on every
# update of the row, so a flag flipped and flipped back (ALTER DATABASE tpl ALLOW_CONNECTIONS …) shows too.
_FINGERPRINT: dict[str, str] = {
    "databases": "select datname, pg_get_userbyid(datdba), encoding, datcollate, datctype, datistemplate,"
    " datallowconn, datconnlimit, datacl::text, case when datname = %(db)s then '' else xmin::text end"
    " from pg_database order by datname",
    "roles": "select rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, rolreplication,"
    " rolbypassrls, rolconnlimit, rolvaliduntil::text, rolconfig::text from pg_roles order by rolname",
    "memberships": "select roleid::regrole::text, member::regrole::text, admin_option from pg_auth_members"
    " order by 1, 2",
    "settings": "select coalesce(d.datname, ''), coalesce(r.rolname, ''), s.setconfig::text"
    " from pg_db_role_setting s left join pg_database d on d.oid = s.setdatabase"
    " left join pg_roles r on r.oid = s.setrole order by 1, 2",
    "tablespaces": "select spcname, spcacl::text, spcoptions::text from pg_tablespace order by 1",
    "system": "select name, setting from pg_file_settings where sourcefile like %(auto)s order by 1, 2",
    "slots": "select slot_name from pg_replication_slots order by 1",
    "prepared_xacts": "select gid, database from pg_prepared_xacts order by 1",
    # The maintenance database itself (a trial's new table there survives any reset of the seeded one).
    "maintenance_db": "select n.nspname, c.relname, c.relkind from pg_class c join pg_namespace n"
    " on n.oid = c.relnamespace where n.nspname not in ('pg_catalog', 'information_schema')"
    " and n.nspname not like 'pg_toast%%' and n.nspname not like 'pg_temp%%' order by 1, 2",
}


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    """The cluster outside the seeded database: databases (with their flags, owners, ACLs, and the catalog
    row version of every one but the seeded database), roles and memberships, per-database/role settings,
    tablespaces, ``ALTER SYSTEM`` settings, replication slots, prepared transactions, and the relations of
    the maintenance database; for a superuser also each role's catalog row version (a password change).
    The seeded database itself is not digested: ``reset`` recreates it whole from the template."""
    _, database = credentials(ctx)
    args = {"db": database, "auto": "%postgresql.auto.conf"}
    try:
        with _params(ctx).connect() as conn:
            out = {k: fingerprint_part(conn.execute(q, args).fetchall()) for k, q in _FINGERPRINT.items()}
            try:  # a password change shows only in pg_authid, which only a superuser reads
                rows = conn.execute("select rolname, xmin::text from pg_authid order by 1").fetchall()
                out["role_rows"] = fingerprint_part(rows)
            except psycopg.errors.InsufficientPrivilege:
                pass
            return out
    except (psycopg.Error, ForgeError) as e:
        raise _fail(ctx, "fingerprint", e) from e


# ------------------------------------------------------------------------------------------------ goldens

RECIPE_VERSION = 1
SUPPORTS_GOLDEN = True

# The seeded database's content, which ``fingerprint`` leaves out (a warm reset recreates it whole): how
# many user tables, and an md5 over each table's name and rows (as text, sorted), so an empty, partial or
# different database never matches the golden's.
SEEDED_ROWS = r"""
select count(*) || ' tables ' || coalesce(md5(string_agg(t || '=' || (xpath('/row/h/text()',
  query_to_xml(format('select md5(coalesce(string_agg(x::text, E''\n'' order by x::text), '''')) as h '
                      'from %s x', t), false, true, '')))[1]::text, ',' order by t)), '-')
from (select format('%I.%I', n.nspname, c.relname) as t
      from pg_class c join pg_namespace n on n.oid = c.relnamespace
      where c.relkind in ('r', 'p') and n.nspname <> 'information_schema' and n.nspname !~ '^pg_') s
"""


def golden_path(ctx: ApplyContext) -> str | None:
    """The server's data directory, as the running server reports it."""
    try:
        with _params(ctx).connect() as conn:
            row = conn.execute("show data_directory").fetchone()
    except (psycopg.Error, ForgeError) as e:
        raise _fail(ctx, "golden", e) from e
    return str(row[0]) if row and row[0] else None


def golden_fingerprint(ctx: ApplyContext) -> Fingerprint:
    _, database = credentials(ctx)
    try:
        with _params(ctx).connect(dbname=database) as conn:
            row = conn.execute(SEEDED_ROWS).fetchone()
    except (psycopg.Error, ForgeError) as e:
        raise _fail(ctx, "golden", e) from e
    return {**fingerprint(ctx), "seeded_rows": fingerprint_part([row[0] if row else None])}
