"""``sql_dump`` on a mysql service: stream the dump into the server's own client (``mariadb``, else
``mysql``) inside the service, stopping at the first error, the way ``mysql < dump.sql`` does.

The client reads a script from stdin in batch mode and stops at the first failing statement, printing
``ERROR 1064 (42000) at line 3: ...``: that line and the server's message become the reason. The dump goes
to stdin straight from the file, so its size never matters.

Warm stacks (``exact``, the only strategy; ``restart`` is another name for it): right after the first
seeding the server is stopped cleanly and its data directory copied where no trial can reach it; a reset
puts back what changed and restarts the server, so databases, users and grants, every table, and the
global variables (a restart drops every ``SET GLOBAL``) are what the fresh stack had. The fingerprint
digests all of that and is compared after every reset. Where it can (``supervisor.wrap``: a root
container, a known entrypoint), the server runs under ``forgelib.kinds.supervisor``'s loop in every mode,
which restarts it in place and keeps the copy in the container's root-only ``/forge`` (a trial sees the
same in a fresh stack); elsewhere a helper container keeps the copy and a reset stops and starts the
service's container (``forgelib.kinds.datadir.PristineDir``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.docker.compose import ImageProcess
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandError, ForgeError, Interrupted, RecipeError, tail
from forgelib.kinds import supervisor
from forgelib.kinds.base import (
    ApplyContext,
    Fingerprint,
    SeedTarget,
    fingerprint_part,
    no_checkpoint_restore,
    no_mount,
    no_settle,
)
from forgelib.kinds.datadir import PristineDir
from forgelib.kinds.mysql.client import (
    NO_CLIENT,
    MysqlParams,
    client_argv,
    connection_params,
    credentials,
    message,
)
from forgelib.kinds.mysql.client import direct_port as direct_port  # the Recipe's
from forgelib.kinds.mysql.dumps import flavour_of, refusal, scan
from forgelib.spec.models import ResetStrategy

if TYPE_CHECKING:
    import pymysql
else:  # loaded at first use (forgelib.clients says why)
    pymysql = deferred("pymysql")

OPTIONS = frozenset({"user", "database", "strategy"})
EXACT = ResetStrategy("exact")
STRATEGIES = (EXACT, ResetStrategy("restart"))  # one strategy, under either name
MARKER = "ibdata1"  # a file every MySQL/MariaDB data directory holds (the system tablespace)


def check(target: SeedTarget) -> None:
    if not target.seed.path.is_file():
        raise target.fail("guard", f"seed {target.seed.name!r} is not a file: {target.seed.path}")
    if (target.options.get("strategy") or EXACT) not in STRATEGIES:
        raise target.fail("guard", "a mysql service resets with strategy: exact only; remove strategy")


def _read_file(ctx: ApplyContext) -> Any:
    """Reads a ``*_FILE`` password inside the service (a docker secret's path), once per stack."""

    def read(path: str) -> str:
        key = ("mysql_secret", ctx.compose.name, ctx.service, path)
        return ctx.memo.get(key, lambda: str(ctx.compose.exec(ctx.service, ["cat", path], timeout=30).stdout))

    return read


def _client_failure(ctx: ApplyContext, step: str, e: CommandError, what: str) -> RecipeError:
    """The client's failure in one sentence: no client, refused credentials, or the server's error with
    the line it stopped at."""
    creds = credentials(ctx.options, ctx.environment())
    err = e.stderr_tail or e.stdout_tail
    if e.rc == NO_CLIENT:
        return ctx.fail(
            step,
            f"service {ctx.service!r} has neither the mariadb nor the mysql client, so it is not a MySQL or "
            f"MariaDB server (image {ctx.service_config.image or '?'!r}); bind this seed to the service "
            "that runs MySQL, or remove the io.forgelib.kind label that declares it one",
        )
    m = re.search(r"ERROR (\d+) \((\w+)\)(?: at line (\d+))?[^:]*: (.*)", err)
    if m and m[1] in ("1045", "1698"):
        held = " or ".join(creds.password_vars) or "no password variable"
        return ctx.fail(
            step,
            f"the server refused user {creds.user!r} with the password from {held} ({m[4].strip()}); "
            "set the service's environment to the password its data directory was initialised with "
            "(a kept volume keeps the old one), or bind user: to a user it knows",
        )
    if m and m[3]:
        return ctx.fail(
            step,
            f"{what} failed at line {m[3]}: ERROR {m[1]} ({m[2]}): {m[4].strip()} "
            f"(seed file {ctx.seed.path}, fed to the client on stdin; it stopped at the first error)",
        )
    return ctx.fail(step, f"{what}: {tail(err, 5).strip() or f'the client exited {e.rc}'}")


def server_version(ctx: ApplyContext) -> str:
    """``select version()`` by the service's own client (once per stack): also proves the client, the
    credentials and the server before the dump goes in."""
    creds = credentials(ctx.options, ctx.environment())
    argv = client_argv(creds, "--batch", "--skip-column-names", "--execute", "select version()")

    def ask() -> str:
        try:
            return str(ctx.compose.exec(ctx.service, argv, timeout=ctx.timeouts.command).stdout).strip()
        except CommandError as e:
            raise _client_failure(ctx, "preflight", e, "asking the server its version") from e

    return ctx.memo.get(("mysql_version", ctx.compose.name, ctx.service), ask)


def apply(ctx: ApplyContext) -> None:
    version = server_version(ctx)
    facts = ctx.memo.get(("mysql_dump", str(ctx.seed.path), ctx.seed.digest), lambda: scan(ctx.seed.path))
    why = refusal(facts, flavour_of(version), version)
    if why:
        raise ctx.fail("preflight", why)
    creds = credentials(ctx.options, ctx.environment())
    try:
        ctx.compose.exec(
            ctx.service, client_argv(creds, "--batch"), stdin=ctx.seed.path, timeout=ctx.timeouts.recipe
        )
    except CommandError as e:
        raise _client_failure(ctx, "client", e, "the dump") from e


# ------------------------------------------------------------------------------------------ warm stacks


def _params(ctx: ApplyContext) -> MysqlParams:
    """A direct connection as root (the fingerprint reads the grant tables), on the published port."""
    root = {**ctx.options, "user": "root", "database": None}
    return connection_params(ctx.service_config, root, ctx.address, read_file=_read_file(ctx))


def _fail(ctx: ApplyContext, step: str, e: BaseException) -> RecipeError:
    text = message(e) if isinstance(e, pymysql.Error) else str(e)
    return ctx.fail(step, f"{type(e).__name__}: {text}".strip())


@dataclass
class Exact:
    """What the exact strategy keeps: the pristine data directory, in the supervised container's own
    root-only directory (``kinds.supervisor``) or else in a helper container (``kinds.datadir``)."""

    pristine: PristineDir | supervisor.Supervised

    @property
    def restarts_container(self) -> bool:
        return self.pristine.restarts_container


def warm_process(
    target: SeedTarget, service: ServiceConfig, image: ImageProcess | None
) -> dict[str, Any] | None:
    """In every mode: the server under ``kinds.supervisor``'s loop, so a reset restarts the server alone."""
    return supervisor.wrap(service, image)


def prepare(ctx: ApplyContext) -> Exact:
    path = golden_path(ctx)
    if not path:
        raise ctx.fail("prepare", "the server did not name its data directory (select @@datadir)")
    # The copy is taken after SIGTERM (a clean shutdown); a reset stops the server with SIGKILL, at once:
    # whatever it was writing is undone by the restore with the trial's changes, and it has no children.
    pristine = supervisor.Supervised.capture(ctx, path, marker=MARKER, stop="TERM", kill="KILL")
    exact = Exact(pristine or PristineDir.capture(ctx, path, marker=MARKER))
    _await_server(ctx)
    return exact


def reset(ctx: ApplyContext, prepared: object) -> None:
    """Put the pristine data directory back (the server restarts: see the module doc)."""
    reset_staged(ctx, prepared, lambda: None)


def reset_staged(ctx: ApplyContext, prepared: object, restored: Callable[[], None]) -> None:
    """``reset``, calling ``restored`` once the data directory is back (the server killed, its pristine
    files in place, the server starting), before waiting for the server (``PreparedSeed.reset``)."""
    assert isinstance(prepared, Exact)
    prepared.pristine.restore()
    restored()
    _await_server(ctx)


def _await_server(ctx: ApplyContext) -> None:
    """Until the restarted server takes connections on its new host port (a service without a
    healthcheck counts as ready as soon as it runs)."""
    deadline = time.monotonic() + ctx.timeouts.compose_up
    while True:
        try:
            with _params(ctx).connect():
                return
        except Interrupted:
            raise
        except ForgeError as e:
            if time.monotonic() >= deadline:
                raise _fail(ctx, "reset", e) from e
            time.sleep(0.05)


# What a trial can change, each a named part (a mismatch says which). The grant tables are read whole
# (password hashes included: a changed password shows); the global variables are every one but those that
# move on their own (counters, timestamps, the server's identity of this start).
_SCHEMA = "information_schema"
_SYSTEM = ("'mysql'", "'information_schema'", "'performance_schema'", "'sys'")
_USER_SCHEMAS = f"schema_name not in ({', '.join(_SYSTEM)})"
_VOLATILE_VARIABLES = (
    "gtid_binlog_pos",
    "gtid_current_pos",
    "gtid_binlog_state",
    "gtid_executed",
    "timestamp",
    "pseudo_thread_id",
    "rand_seed1",
    "rand_seed2",
    "server_uuid",
    "server_uid",
    # named after the container's hostname: a golden restored into a new container differs only here
    "hostname",
    "general_log_file",
    "slow_query_log_file",
    "log_slow_query_file",
    "wsrep_node_name",
    # chosen at start from the file system the redo log is on (a golden's is another than the seeding's)
    "innodb_log_write_ahead_size",
    "innodb_log_file_buffering",
    "innodb_buffer_pool_load_now",
    "innodb_buffer_pool_dump_now",
    "last_insert_id",
    "warning_count",
    "error_count",
)
_FINGERPRINT: dict[str, str] = {
    "databases": f"select schema_name, default_character_set_name, default_collation_name from {_SCHEMA}"
    f".schemata where {_USER_SCHEMAS} order by 1",
    "users": f"select grantee, privilege_type, is_grantable from {_SCHEMA}.user_privileges order by 1, 2",
    "schema_grants": f"select grantee, table_schema, privilege_type, is_grantable from {_SCHEMA}"
    ".schema_privileges order by 1, 2, 3",
    "table_grants": f"select grantee, table_schema, table_name, privilege_type from {_SCHEMA}"
    ".table_privileges order by 1, 2, 3, 4",
    "column_grants": f"select grantee, table_schema, table_name, column_name, privilege_type from {_SCHEMA}"
    ".column_privileges order by 1, 2, 3, 4, 5",
    "tables": f"select table_schema, table_name, table_type, engine, table_collation from {_SCHEMA}.tables"
    f" where table_schema not in ({', '.join(_SYSTEM)}) order by 1, 2",
    "columns": f"select table_schema, table_name, column_name, ordinal_position, column_type, is_nullable,"
    f" column_default, extra from {_SCHEMA}.columns where table_schema not in ({', '.join(_SYSTEM)})"
    " order by 1, 2, 4",
    "routines": f"select routine_schema, routine_name, routine_type, definer, routine_definition from "
    f"{_SCHEMA}.routines where routine_schema not in ({', '.join(_SYSTEM)}) order by 1, 2, 3",
    "triggers": f"select trigger_schema, trigger_name, action_statement, definer from {_SCHEMA}.triggers"
    f" where trigger_schema not in ({', '.join(_SYSTEM)}) order by 1, 2",
    "views": f"select table_schema, table_name, view_definition, definer from {_SCHEMA}.views"
    f" where table_schema not in ({', '.join(_SYSTEM)}) order by 1, 2",
    "events": f"select event_schema, event_name, event_definition, status from {_SCHEMA}.events"
    " order by 1, 2",
    "variables": f"select variable_name, variable_value from {_SCHEMA}.global_variables where lower("
    f"variable_name) not in ({', '.join(repr(v) for v in _VOLATILE_VARIABLES)}) order by 1",
}
# The grant tables themselves (password hashes, account locks, roles): MariaDB keeps them in global_priv,
# MySQL in user; whichever the server has.
_ACCOUNTS = (
    "select user, host, priv from mysql.global_priv order by 1, 2",
    "select user, host, authentication_string, account_locked from mysql.user order by 1, 2",
)


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    """Databases, accounts and grants, schema objects, global variables and every user table's rows
    (``seeded_rows``): the exact reset is checked for content too, not only the catalogs."""
    try:
        with _params(ctx).connect() as conn, conn.cursor() as cur:
            out: Fingerprint = {}
            for part, query in _FINGERPRINT.items():
                cur.execute(query)
                out[part] = fingerprint_part(cur.fetchall())
            for query in _ACCOUNTS:
                try:
                    cur.execute(query)
                except pymysql.err.ProgrammingError:  # the other server's table
                    continue
                out["accounts"] = fingerprint_part(cur.fetchall())
                break
            out["seeded_rows"] = fingerprint_part(_rows(cur))
            return out
    except (pymysql.Error, ForgeError) as e:
        raise _fail(ctx, "fingerprint", e) from e


def _rows(cur: Any) -> list[Any]:
    """Each user table with its content checksum, computed by the server in one scan per table (rows are
    never fetched): an empty, partial or different table never matches."""
    cur.execute(
        f"select table_schema, table_name from {_SCHEMA}.tables where table_type = 'BASE TABLE' and "
        f"table_schema not in ({', '.join(_SYSTEM)}) order by 1, 2"
    )
    tables = [f"{_quote(str(s))}.{_quote(str(t))}" for s, t in cur.fetchall()]
    if not tables:
        return []
    cur.execute(f"checksum table {', '.join(tables)} extended")
    return sorted(cur.fetchall())


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# ------------------------------------------------------------------------------------------------ goldens

RECIPE_VERSION = 1
SUPPORTS_GOLDEN = True


def golden_path(ctx: ApplyContext) -> str | None:
    """The server's data directory, as the running server reports it."""
    try:
        with _params(ctx).connect() as conn, conn.cursor() as cur:
            cur.execute("select @@datadir")
            row = cur.fetchone()
    except (pymysql.Error, ForgeError) as e:
        raise _fail(ctx, "golden", e) from e
    path = str(row[0]).rstrip("/") if row and row[0] else ""
    return path or None


golden_fingerprint = fingerprint  # it already digests every seeded row


def checkpoint_path(ctx: ApplyContext) -> str | None:
    """The data directory: a copy of it taken while the server is paused is crash-consistent (InnoDB
    replays its redo log when it starts from the copy, as after a power cut)."""
    return golden_path(ctx)


checkpoint_settle = no_settle  # each fork's InnoDB replays its redo log as it starts
checkpoint_restore = no_checkpoint_restore  # restored through the checkpoint's image
checkpoint_prepare = prepare  # the pristine copy is of the live data directory: the checkpoint's


seed_mount = no_mount  # it works in the running container: no extra mount
