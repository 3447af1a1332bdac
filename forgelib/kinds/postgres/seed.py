"""``sql_dump``: stream the dump into ``psql`` inside the service, stopping at the first SQL error.

``ON_ERROR_STOP=1`` turns any SQL error into a non-zero exit (psql's default is to carry on and exit 0),
and the dump goes to stdin straight from the file, so its size never matters.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.docker.compose import ImageProcess
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandError, ForgeError, Interrupted, RecipeError
from forgelib.kinds import supervisor
from forgelib.kinds.base import (
    ApplyContext,
    CheckpointCopy,
    Fingerprint,
    SeedTarget,
    fingerprint_part,
    no_mount,
)
from forgelib.kinds.datadir import PristineDir
from forgelib.kinds.postgres.client import PostgresParams, connection_params, postgres_credentials
from forgelib.kinds.postgres.client import direct_port as direct_port  # the Recipe's
from forgelib.spec.models import ResetStrategy

if TYPE_CHECKING:
    import psycopg
    import psycopg.conninfo
    from psycopg import sql
else:  # loaded at first use (forgelib.clients says why)
    psycopg = deferred("psycopg")
    sql = deferred("psycopg.sql")

OPTIONS = frozenset({"user", "database", "strategy"})
# How a warm stack resets the service (the project's `reset: {strategy: ...}`; see the warm section).
EXACT, RESTART, TEMPLATE = ResetStrategy("exact"), ResetStrategy("restart"), ResetStrategy("template")


def check(target: SeedTarget) -> None:
    if not target.seed.path.is_file():
        raise target.fail("guard", f"seed {target.seed.name!r} is not a file: {target.seed.path}")


def credentials(ctx: ApplyContext) -> tuple[str, str]:
    return postgres_credentials(ctx.options, ctx.environment())


def argv(user: str, database: str) -> list[str]:
    # -q: no "INSERT 0 1" per statement on stdout, which the runner would hold in memory (a dump of
    # single-row INSERTs grew the forge process by about its own size).
    return ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", database]


def apply(ctx: ApplyContext) -> None:
    user, database = credentials(ctx)
    header = read_header(ctx.seed.path)
    if header.needs_preflight:
        preflight(ctx, header, service_versions(ctx, user, database))
    tool = "pg_restore" if header.custom else "psql"
    cmd = restore_argv(user, database) if header.custom else argv(user, database)
    try:
        ctx.compose.exec(ctx.service, cmd, stdin=ctx.seed.path, timeout=ctx.timeouts.recipe)
    except CommandError as e:
        # The dump goes in on stdin, so the argv cannot show which file failed: name it (the error itself
        # carries the tool's rc and stderr).
        raise ctx.fail(tool, f"seed file {ctx.seed.path} (on {tool}'s stdin): {e}") from e


def restore_argv(user: str, database: str) -> list[str]:
    """A custom-format archive (``pg_dump -Fc``) streamed on stdin; the first error stops it, as
    ``ON_ERROR_STOP`` does for psql."""
    return ["pg_restore", "--exit-on-error", "-U", user, "-d", database]


# ------------------------------------------------------------------------------------- format preflight
#
# Like redis_dump's RDB check: read what made the dump (its header) and what the service runs, and refuse a
# pair that cannot work before anything is applied, with both versions and the fix in one sentence.
#
# * pg_dump writes SQL for its own server version: an older server fails on it (pg_dump 17 emits
#   `SET transaction_timeout`, unknown before 17), so pg_dump's major must not exceed the server's.
# * pg_dump of the August 2025 releases brackets a plain dump in `\restrict KEY` / `\unrestrict KEY`,
#   meta-commands only psql of those releases (or newer) knows; an older psql stops at the first one.
# * a custom-format archive carries its format version; pg_restore refuses versions newer than its own.

PGDMP = b"PGDMP"
HEADER_BYTES = 64 * 1024  # pg_dump's header comments and \restrict come first; no need to read further
# The first psql of each major that understands \restrict (CVE-2025-8714 fix, 2025-08-14); 18+ all do.
RESTRICT_SINCE = {13: (13, 22), 14: (14, 19), 15: (15, 14), 16: (16, 10), 17: (17, 6)}
# The newest custom-archive format version each pg_restore major reads (K_VERS_1_x in pg_backup_archiver.h).
ARCHIVE_BY_RESTORE: tuple[tuple[int, tuple[int, int]], ...] = (
    (17, (1, 16)),
    (16, (1, 15)),
    (12, (1, 14)),
    (11, (1, 13)),
    (10, (1, 12)),
)


@dataclass(frozen=True)
class DumpHeader:
    custom: bool = False  # a pg_dump -Fc archive (PGDMP magic)
    archive_version: tuple[int, int, int] | None = None
    dumped_by: str | None = None  # pg_dump's version ("17.6")
    dumped_from: str | None = None  # the source server's version
    restrict: bool = False  # a plain dump with \restrict (needs a psql that knows it)

    @property
    def needs_preflight(self) -> bool:
        return self.custom or self.dumped_by is not None or self.restrict


def read_header(path: Path) -> DumpHeader:
    """What made the dump, from its first bytes (a plain SQL file without pg_dump's header: nothing)."""
    with path.open("rb") as f:
        head = f.read(HEADER_BYTES)
    if head.startswith(PGDMP):
        return _custom_header(head)
    text = head.decode("utf-8", "replace")
    by = re.search(r"^-- Dumped by pg_dump version (\S+)", text, re.MULTILINE)
    source = re.search(r"^-- Dumped from database version (\S+)", text, re.MULTILINE)
    restrict = re.search(r"^\\restrict\s+\S", text, re.MULTILINE) is not None
    return DumpHeader(False, None, by[1] if by else None, source[1] if source else None, restrict)


def _custom_header(head: bytes) -> DumpHeader:
    """The archive's format version and, when the header is complete, the two version strings."""
    version = (head[5], head[6], head[7]) if len(head) >= 8 else None
    by = source = None
    try:
        int_size = head[8]
        pos = 11  # magic(5) + version(3) + intSize + offSize + format
        if version is not None and version[:2] >= (1, 15):
            pos += 1  # compression algorithm
        else:
            pos += 1 + int_size  # compression level as an int (sign byte + intSize bytes)
        pos += 7 * (1 + int_size)  # creation time: sec, min, hour, mday, mon, year, isdst

        def string() -> str | None:
            nonlocal pos
            sign, raw = head[pos], head[pos + 1 : pos + 1 + int_size]
            n = int.from_bytes(raw, "little") * (-1 if sign else 1)
            pos += 1 + int_size
            if n < 0:
                return None
            value = head[pos : pos + n].decode("utf-8", "replace")
            pos += n
            return value

        string()  # the database name
        source, by = string(), string()
    except IndexError:
        pass
    return DumpHeader(True, version, by, source, False)


@dataclass(frozen=True)
class ServiceVersions:
    server: str  # "15.14"
    psql: str
    pg_restore: str


def service_versions(ctx: ApplyContext, user: str, database: str) -> ServiceVersions:
    """The service's psql and pg_restore versions and its server's, in one exec (once per service image
    and backend: ``ctx.memo``)."""
    script = 'psql --version && pg_restore --version && psql -XAtq -U "$1" -d "$2" -c "show server_version"'
    cmd = ["sh", "-c", script, "forge-versions", user, database]

    def ask() -> ServiceVersions:
        try:
            out = ctx.compose.exec(ctx.service, cmd, timeout=ctx.timeouts.command).stdout
        except CommandError as e:
            raise ctx.fail("preflight", f"could not ask the service its PostgreSQL versions: {e}") from e
        lines = [*out.strip().splitlines(), "", "", ""]
        # "psql (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)" -> 15.14; the server: "15.14 (Debian ...)"
        return ServiceVersions(_version_in(lines[2]), _version_in(lines[0]), _version_in(lines[1]))

    return ctx.memo.get(("pg_versions", ctx.service, ctx.service_config.image), ask)


def _version_in(line: str) -> str:
    m = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)", line)
    return m[1] if m else ""


def _parse(version: str | None) -> tuple[int, int]:
    m = re.match(r"(\d+)(?:\.(\d+))?", version or "")
    return (int(m[1]), int(m[2] or 0)) if m else (0, 0)


def compatibility(header: DumpHeader, server: str, client: str) -> str | None:
    """Why this dump cannot be applied with this server and client (psql, or pg_restore for an archive),
    or None. Pure: the rules above, one sentence naming both versions and the fix."""
    srv, cli = _parse(server), _parse(client)
    if header.dumped_by and srv[0] and _parse(header.dumped_by)[0] > srv[0]:
        return (
            f"the dump was made by pg_dump {header.dumped_by}, but the service runs PostgreSQL {server}, "
            f"which cannot load what a newer pg_dump writes: re-dump with pg_dump {srv[0]} (or older), "
            "or use a newer image"
        )
    if header.restrict and cli[0]:
        since = RESTRICT_SINCE.get(cli[0], (0, 0) if cli[0] > max(RESTRICT_SINCE) else (999, 0))
        if cli < since:
            need = f"{since[0]}.{since[1]}" if since[0] != 999 else "13.22"
            return (
                f"the dump has \\restrict lines (pg_dump {header.dumped_by or 'of August 2025 or later'}), "
                f"which psql {client} in the service does not understand (psql {need} or newer does): "
                "re-dump with an older pg_dump, or use a newer image"
            )
    if header.custom and header.archive_version and cli[0]:
        newest = next((v for major, v in ARCHIVE_BY_RESTORE if cli[0] >= major), (1, 11))
        if header.archive_version[:2] > newest:
            got = ".".join(map(str, header.archive_version))
            return (
                f"the archive is custom format {got} (pg_dump {header.dumped_by or '?'}), but the service's "
                f"pg_restore {client} reads formats up to {newest[0]}.{newest[1]}: re-dump with an older "
                "pg_dump, or use a newer image"
            )
    return None


def preflight(ctx: ApplyContext, header: DumpHeader, versions: ServiceVersions) -> None:
    client = versions.pg_restore if header.custom else versions.psql
    why = compatibility(header, versions.server, client)
    if why:
        raise ctx.fail("preflight", f"seed {ctx.seed.name!r} ({ctx.seed.path}): {why}")


# ---------------------------------------------------------------------------------------------- warm
#
# Two strategies (``strategy``). ``exact`` (the default; ``restart`` is another name for it): every reset
# puts back from a pristine copy of the seeded data directory every file and directory that changed since
# the last reset: the server a trial sees is, byte for byte, the one the first seeding left (databases,
# roles, settings, ALTER SYSTEM, tablespaces, extensions). Where it can (``supervisor.wrap``), the server
# runs under ``forgelib.kinds.supervisor``'s loop in every mode forge starts the service in (fresh, warm,
# from a golden, a fork), which restarts it in place and keeps the copy in the container's root-only
# ``/forge``: a trial sees the same loop and the same ``/forge`` in a fresh stack as in a restored one.
# Elsewhere ``forgelib.kinds.datadir`` keeps the copy in a helper container; a reset stops the service's
# container, has the helper put back what changed, and starts it again (slower; nothing of forge's in the
# service).
#
# ``template``: prepare: right after the dump went in (no dependent connected yet), copy the seeded
# database into a template database named after the seed digest, closed to connections, and make one
# ready copy of it.
# reset: close the seeded database to new sessions, end the ones it has, rename it away and rename the
# ready copy into its place — four catalog updates, a few milliseconds — then drop the old one and make the
# next copy in the background, while the trial runs (``CREATE DATABASE … TEMPLATE`` copies files and
# ``DROP DATABASE`` removes them: too slow for the reset's own critical path).
# All on a direct connection (``forgelib.stacks.connect``) to the maintenance database. Both databases are in
# ``pg_database`` for a trial to see, and a superuser can open and change them (the reset then fails and
# the stack is replaced): the strategy is an opt-in.

POOL_PREFIX = "forge_pool_"  # ready copies and dropped-to-be databases; the fingerprint skips these names
_DRAIN_SECONDS = 10.0  # how long ended sessions get to go away before the rename gives up


class Prepared:
    """The template, the one ready copy, and the background job making the next one."""

    def __init__(self, params: PostgresParams, database: str, template: str, owner: str) -> None:
        self.params = params  # dbname: the maintenance database forge connects to
        self.database = database  # the seeded database the services use
        self.template = template
        self.owner = owner
        self.ready: tuple[str, str] | None = None  # (copy name, its catalog row's xmin when made)
        self._tag = template.removeprefix("forge_tpl_")[:12]
        self._n = 0
        self._trash: str | None = None
        self._job: threading.Thread | None = None
        self._error: Exception | None = None

    def refill(self, *, background: bool = True) -> None:
        """Drop the swapped-out database and make the next ready copy (in a thread unless told not to)."""
        if background:
            self._job = threading.Thread(
                target=self._refill, name=f"forge-pg-refill-{self._tag}", daemon=True
            )
            self._job.start()
        else:
            self._refill()
            self.wait()

    def wait(self) -> None:
        """The ready copy, once the background job is done; its error, if it failed."""
        if self._job is not None:
            self._job.join()
            self._job = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _refill(self) -> None:
        try:
            with self.params.connect() as conn:
                if self._trash is not None:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self._trash)))
                    self._trash = None
                self._n += 1
                name = f"{POOL_PREFIX}{self._tag}_c{self._n}"
                ident, tpl, owner = (sql.Identifier(x) for x in (name, self.template, self.owner))
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(ident, tpl, owner))
                # Closed until it is swapped in: nothing can change it unseen (reopening it changes its row).
                conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident))
                self.ready = (name, _xmin(conn, name))
        except (psycopg.Error, ForgeError) as e:  # raised by the next reset's wait(): the stack is replaced
            self._error = e


def _xmin(conn: psycopg.Connection[Any], database: str) -> str:
    row = conn.execute("select xmin::text from pg_database where datname = %s", (database,)).fetchone()
    return str(row[0]) if row else ""


def template_name(digest: str) -> str:
    return "forge_tpl_" + digest.removeprefix("sha256:")[:16]


def _params(ctx: ApplyContext) -> PostgresParams:
    _, database = credentials(ctx)
    # The maintenance database: never the seeded one (it is swapped out), template1 when that is `postgres`.
    maint = TEMPLATE1 if database == "postgres" else "postgres"
    return connection_params(ctx.service_config, ctx.options, ctx.address, database=maint)


def _fail(ctx: ApplyContext, step: str, e: BaseException) -> RecipeError:
    return ctx.fail(step, f"{type(e).__name__}: {e}".strip())


def strategy(ctx: SeedTarget) -> ResetStrategy:
    """The reset strategy: ``exact`` or ``template`` (``restart`` is another name for ``exact``)."""
    found = ResetStrategy(ctx.options.get("strategy") or EXACT)
    return EXACT if found == RESTART else found


@dataclass
class Exact:
    """What the exact strategy keeps: the pristine data directory, in the supervised container's own
    root-only directory (``kinds.supervisor``) or else in a helper container (``kinds.datadir``)."""

    params: PostgresParams
    pristine: PristineDir | supervisor.Supervised

    @property
    def restarts_container(self) -> bool:
        return self.pristine.restarts_container


def warm_process(
    target: SeedTarget, service: ServiceConfig, image: ImageProcess | None
) -> Mapping[str, Any] | None:
    """Exact strategy, in every mode: the server under ``kinds.supervisor``'s loop, so a reset restarts the
    server alone (the copy taken after SIGINT, postgres's fast shutdown; a reset stops it with SIGQUIT,
    immediate)."""
    if strategy(target) != EXACT:
        return None
    return supervisor.wrap(service, image)


def prepare(ctx: ApplyContext) -> Prepared | Exact:
    if strategy(ctx) == EXACT:
        path = golden_path(ctx)
        if not path:
            raise ctx.fail("prepare", "the server did not name its data directory (show data_directory)")
        pristine = supervisor.Supervised.capture(ctx, path) or PristineDir.capture(ctx, path)
        exact = Exact(_params(ctx), pristine)
        _await_server(ctx, exact)
        return exact
    return _prepare_template(ctx)


def _await_server(ctx: ApplyContext, exact: Exact) -> None:
    """Until the restarted server takes connections (a service without a healthcheck counts as ready as
    soon as it runs), on its new host port."""
    exact.params = _wait_for_server(ctx)


def _wait_for_server(ctx: ApplyContext) -> PostgresParams:
    params = _params(ctx)
    deadline = time.monotonic() + ctx.timeouts.compose_up
    while True:
        try:
            with params.connect():
                return params
        except Interrupted:
            raise
        except (psycopg.Error, ForgeError) as e:
            if time.monotonic() >= deadline:
                raise _fail(ctx, "reset", e) from e
            time.sleep(0.02)


def _prepare_template(ctx: ApplyContext) -> Prepared:
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
        prepared = Prepared(params, database, tpl, str(row[0]))
        prepared.refill(background=False)
    except (psycopg.Error, ForgeError) as e:
        if isinstance(e, RecipeError):
            raise
        raise _fail(ctx, "prepare", e) from e
    return prepared


def reset(ctx: ApplyContext, prepared: object) -> None:
    """Restore the data directory (exact), or swap the ready copy in under the seeded database's name
    (template); see the section comment."""
    reset_staged(ctx, prepared, lambda: None)


def reset_staged(ctx: ApplyContext, prepared: object, restored: Callable[[], None]) -> None:
    """``reset``, calling ``restored`` once nothing a trial changed is left in the server
    (``PreparedSeed.reset``): exact, as soon as the data directory is back and the server starting, before
    the wait for its first connection; template, once the swap is done."""
    if isinstance(prepared, Exact):
        prepared.pristine.restore(healthcheck=False)  # ready: the connection _await_server opens
        restored()
        _await_server(ctx, prepared)
        return
    _swap_template(ctx, prepared)
    restored()


def _swap_template(ctx: ApplyContext, prepared: object) -> None:
    assert isinstance(prepared, Prepared)
    p = prepared
    try:
        p.wait()
        if p.ready is None:
            raise ctx.fail("reset", "no ready copy of the template")
        copy, made = p.ready
        db = sql.Identifier(p.database)
        trash = f"{POOL_PREFIX}{p.template.removeprefix('forge_tpl_')[:12]}_t{time.monotonic_ns()}"
        with p.params.connect() as conn:
            if _xmin(conn, copy) != made:
                raise ctx.fail("reset", f"the ready copy {copy!r} was changed or removed since it was made")
            if conn.execute("select 1 from pg_database where datname = %s", (p.database,)).fetchone():
                # No new sessions, then end the open ones (superusers included), then rename it away; not
                # a template (a trial may have made it one), so the background job can drop it.
                conn.execute(
                    sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false ALLOW_CONNECTIONS false").format(db)
                )
                _drain(conn, p.database)
                conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(db, sql.Identifier(trash)))
                p._trash = trash
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(copy), db))
            conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(db))
        p.ready = None
        p.refill()
    except (psycopg.Error, ForgeError) as e:
        if isinstance(e, RecipeError):
            raise
        raise _fail(ctx, "reset", e) from e


def _drain(conn: psycopg.Connection[Any], database: str) -> None:
    """End every session on ``database`` and wait until they are gone (termination is asynchronous)."""
    deadline = time.monotonic() + _DRAIN_SECONDS
    query = (
        "select count(pg_terminate_backend(pid)) from pg_stat_activity"
        " where datname = %s and pid <> pg_backend_pid()"
    )
    while True:
        row = conn.execute(query, (database,)).fetchone()
        if not row or not row[0]:
            return
        if time.monotonic() >= deadline:
            raise ForgeError(f"sessions on {database!r} did not end within {_DRAIN_SECONDS:g}s")
        time.sleep(0.005)


# A schema of the database's own, not the system's ({} the schema's name column).
_USER_SCHEMA = (
    " {0} not in ('pg_catalog', 'information_schema') and {0} not like 'pg_toast%%'"
    " and {0} not like 'pg_temp%%'"
)

# What a trial can change in the cluster beyond its database. xmin of a catalog row changes on every
# update of the row, so a flag flipped and flipped back (ALTER DATABASE tpl ALLOW_CONNECTIONS …) shows too.
_FINGERPRINT: dict[str, str] = {
    "databases": "select datname, pg_get_userbyid(datdba), encoding, datcollate, datctype, datistemplate,"
    " datallowconn, datconnlimit, datacl::text, case when datname = %(db)s then '' else xmin::text end"
    " from pg_database where datname not like 'forge\\_pool\\_%%' order by datname",
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
    # The maintenance database itself (a trial's new table, schema or function there survives any reset of
    # the seeded one): its relations, schemas (an empty one too) and routines (signature, kind, owner,
    # rights and body), outside the system's schemas.
    "maintenance_db": "select 'relation', n.nspname, c.relname || ' ' || c.relkind::text from pg_class c"
    " join pg_namespace n on n.oid = c.relnamespace where" + _USER_SCHEMA.format("n.nspname") + " union all"
    " select 'schema', nspname, pg_get_userbyid(nspowner) || ' ' || coalesce(nspacl::text, '')"
    " from pg_namespace where" + _USER_SCHEMA.format("nspname") + " union all"
    " select 'routine', n.nspname, p.oid::regprocedure::text || ' ' || p.prokind::text || ' '"
    " || pg_get_userbyid(p.proowner) || ' ' || coalesce(p.proacl::text, '') || ' ' || md5(p.prosrc)"
    " from pg_proc p join pg_namespace n on n.oid = p.pronamespace where"
    + _USER_SCHEMA.format("n.nspname")
    + " order by 1, 2, 3",
}


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    """``cluster_fingerprint``; with the exact strategy also the seeded database's rows (``seeded_rows``):
    a reset from the pristine data directory is then checked for content too, not only the catalogs."""
    if strategy(ctx) == EXACT:
        return golden_fingerprint(ctx)
    return cluster_fingerprint(ctx)


def cluster_fingerprint(ctx: ApplyContext) -> Fingerprint:
    """The cluster outside the seeded database: databases (with their flags, owners, ACLs, and the catalog
    row version of every one but the seeded database), roles and memberships, per-database/role settings,
    tablespaces, ``ALTER SYSTEM`` settings, replication slots, prepared transactions, and the relations of
    the maintenance database; with ``template1`` not the maintenance database (the seeded one is not
    ``postgres``), its relations too (``template1_db``): every ``CREATE DATABASE`` copies them. For a
    superuser also each role's catalog row version (a password change). The seeded database itself is not
    digested: the template ``reset`` recreates it whole."""
    _, database = credentials(ctx)
    args = {"db": database, "auto": "%postgresql.auto.conf"}
    params = _params(ctx)
    try:
        with params.connect() as conn:
            out = {k: fingerprint_part(conn.execute(q, args).fetchall()) for k, q in _FINGERPRINT.items()}
            try:  # a password change shows only in pg_authid, which only a superuser reads
                rows = conn.execute("select rolname, xmin::text from pg_authid order by 1").fetchall()
                out["role_rows"] = fingerprint_part(rows)
            except psycopg.errors.InsufficientPrivilege:
                pass
        if params.dbname != TEMPLATE1 and database != TEMPLATE1:
            out["template1_db"] = _objects_of(params, TEMPLATE1, args)
        return out
    except (psycopg.Error, ForgeError) as e:
        raise _fail(ctx, "fingerprint", e) from e


TEMPLATE1 = "template1"


def _objects_of(params: PostgresParams, database: str, args: Mapping[str, str]) -> str:
    """``maintenance_db``'s digest of ``database``; a database that takes no connections (a trial's
    ``ALLOW_CONNECTIONS false``, which ``databases`` sees too) as such."""
    try:
        with params.connect(dbname=database) as conn:
            return fingerprint_part(conn.execute(_FINGERPRINT["maintenance_db"], args).fetchall())
    except ForgeError:  # ``connect``'s: the database refused the connection
        return fingerprint_part(["not connectable"])


# ------------------------------------------------------------------------------------------------ goldens

RECIPE_VERSION = 3
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
    return {**cluster_fingerprint(ctx), "seeded_rows": fingerprint_part([row[0] if row else None])}


seed_mount = no_mount  # it works in the running container: no extra mount


def checkpoint_path(ctx: ApplyContext) -> str | None:
    """The data directory: a copy of it taken while the server is paused is crash-consistent (a server
    started from it replays its WAL, as after a power cut); ``checkpoint_settle`` does that replay once,
    at capture, so the forks start from a cleanly shut-down directory."""
    return golden_path(ctx)


def checkpoint_settle(ctx: ApplyContext, copy_dir: str) -> list[str]:
    """The single-user backend on the copy: it runs the crash recovery (and, with postgres's default
    ``recovery_init_sync_method``, its fsync of every file) and, at the end of its empty stdin, writes a
    shutdown checkpoint. A fork then starts without recovery and without any setting a trial could see.
    ``template1``: a database every cluster has (recovery runs before it is looked up)."""
    return ["postgres", "--single", "-D", copy_dir, "template1"]


def checkpoint_restore(ctx: ApplyContext, copy: CheckpointCopy) -> bool:
    """In place, as the exact warm reset: the server under ``kinds.supervisor``'s loop is stopped at once
    (SIGQUIT), its data directory put back at the checkpoint's copy (staged in the container once) and
    started again; returns once it takes connections. False where the loop does not run (the template
    strategy, or ``supervisor.wrap`` declined)."""
    if not supervisor.restore_copy(ctx, copy.info, copy):
        return False
    _wait_for_server(ctx)
    return True


checkpoint_prepare = prepare  # both strategies copy the live state (data directory, database)
