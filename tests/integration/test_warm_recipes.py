"""Each seed kind's warm life on the real engine: ``prepare`` after the first seeding, ``reset`` in place,
``fingerprint`` equal again after a reset, and different when a trial changed what the reset cannot reach.

One stack for the module (postgres with the default exact reset, supervised in its own container; the same
run as the postgres user, where the exact reset falls back to the helper container; postgres with the
template strategy; redis and a workspace tree): every test vandalises it, resets it and checks; the last
ones leave it in states only a replacement fixes, so they run last (file order)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from support.stacks import IDLE, PG, REDIS, TIMEOUTS, make_project
from support.trialview import seen

from forgelib.docker import labels as lab
from forgelib.errors import RecipeError
from forgelib.kinds.base import PreparedSeed, fingerprint_diff
from forgelib.kinds.postgres import seed as sql_dump
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import connect
from forgelib.stacks.provision import (
    FreshSteps,
    StackContext,
    StackPlan,
    WarmSteps,
    provision_stack,
    teardown_trial,
)
from forgelib.stacks.stack import Stack

pytestmark = pytest.mark.integration

RDB = Path(__file__).parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"
WS = "/workspace"


def _tree(root: Path) -> Path:
    (root / "src/pkg").mkdir(parents=True)
    (root / "src/pkg/app.py").write_text("print('seed')\n")
    (root / ".env").write_text("MODE=seed\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").mkdir()
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    tmp = tmp_path_factory.mktemp("warm-project")
    (tmp / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    redis = {**REDIS, "command": ["redis-server", "--save", "", "--appendonly", "no"]}
    return make_project(
        tmp / "p",
        # hdb runs as the server's own user: the supervisor declines it (it could not keep its copy from
        # the server), and its exact reset goes through the helper container
        {
            "db": PG,
            "hdb": {**PG, "user": "postgres"},
            "tdb": PG,
            "cache": redis,
            "ws": {**IDLE, "volumes": [f"work:{WS}"]},
        },
        seeds={
            "sql": (tmp / "seed.sql", SeedKind.SQL_DUMP),
            "rdb": (RDB, SeedKind.REDIS_DUMP),
            "tree": (_tree(tmp / "tree"), SeedKind.FILESYSTEM_DIR),
        },
        reset={
            "db": "sql",
            "hdb": "sql",
            "tdb": ("sql", {"strategy": "template"}),
            "cache": "rdb",
            "ws": "tree",
        },
        volumes={"work": {}},
    )


@pytest.fixture(scope="module")
def stack(
    docker_ready: None, runner: SubprocessRunner, tmp_path_factory: pytest.TempPathFactory, project: Project
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("warm")
    # one stack per session (per xdist worker): a fixed name made two sessions on one engine, or `-n 2`,
    # share (and tear down) each other's compose project
    run_id = f"it-warm-recipes-{secrets.token_hex(4)}"
    name = f"itwarm-{run_id}"
    for only in ({lab.RUN: run_id}, {lab.COMPOSE_PROJECT: name}):  # nobody else's stack is taken for ours
        assert lab.is_empty(lab.resources_with_labels(runner, only)), only
    spec = StackPlan(project.environment, name, lab.run_labels(run_id, "warm-0"), tmp / "stack")
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        yield trial
    finally:
        teardown_trial(trial)
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))


def _seed(trial: Stack, service: str) -> PreparedSeed:
    return next(p for p in trial.prepared if p.ctx.service == service)


def _reset_and_diff(trial: Stack, service: str) -> list[str]:
    p = _seed(trial, service)
    p.reset()
    return fingerprint_diff(p.baseline, p.fingerprint())


def _sh(trial: Stack, script: str) -> str:
    return trial.compose.exec("ws", ["sh", "-c", script]).stdout


@pytest.mark.parametrize("db", ["db", "tdb"])
def test_postgres_rows_schema_and_tables_are_restored(stack: Stack, db: str) -> None:
    with connect.postgres(stack, db).connect() as conn:
        conn.execute("update t set v = 'vandalised'")
        conn.execute("alter table t add column extra int")
        conn.execute("create table intruder (x int)")
    assert _reset_and_diff(stack, db) == []
    with connect.postgres(stack, db).connect() as conn:
        assert conn.execute("select * from t").fetchall() == [("seeded",)]
        assert conn.execute("select to_regclass('intruder')").fetchone() == (None,)


@pytest.mark.parametrize("db", ["db", "tdb"])
def test_postgres_open_sessions_do_not_block_the_reset(stack: Stack, db: str) -> None:
    held = connect.postgres(stack, db).connect(autocommit=False)
    held.execute("update t set v = 'in a transaction'")  # holds a lock and a session on the database
    assert _reset_and_diff(stack, db) == []
    with pytest.raises(psycopg.OperationalError):  # the reset ended the session (server stopped / FORCE)
        held.execute("select 1")
    held.close()
    with connect.postgres(stack, db).connect() as conn:
        assert conn.execute("select v from t").fetchall() == [("seeded",)]


def test_redis_keys_in_several_indexes_and_config_are_restored(stack: Stack) -> None:
    params = connect.redis(stack, "cache")
    seeded = {k: params.client().dump(k) for k in params.client().keys("*")}
    assert seeded
    for db in (0, 3, 9):
        c = params.client(db=db)
        c.set(f"intruder:{db}", "x")
        c.close()
    first = next(iter(seeded))
    params.client().set(first, "vandalised")
    params.client().execute_command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    assert _reset_and_diff(stack, "cache") == []
    client = params.client()
    assert {k: client.dump(k) for k in client.keys("*")} == seeded
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert params.client(db=3).dbsize() == 0 and params.client(db=9).dbsize() == 0


FUNCTION = "#!lua name=intruder\nredis.register_function('intruder', function() return 1 end)"


def test_redis_acl_users_functions_scripts_and_logs_are_restored_in_place(stack: Stack) -> None:
    """A trial's ACL users and rules, a replica role, a function library, a cached script and what the slow
    log recorded are all gone after the reset, and the fingerprint is the first seeding's: such a stack is
    reused. The same server answers (its run_id: the reset never restarted it)."""
    client = connect.redis(stack, "cache").client(decode_responses=True)
    seeded_acl, run_id = client.acl_list(), client.info("server")["run_id"]
    client.execute_command("ACL", "SETUSER", "intruder", "on", ">secret", "~*", "+@all")
    client.execute_command("ACL", "SETUSER", "default", "-debug", "(~s* +set)")
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("slowlog-log-slower-than", "0")  # every command from here on is in the slow log
    client.function_load(FUNCTION)
    sha = client.script_load("return 'intruder'")
    client.execute_command("REPLICAOF", "127.0.0.1", "1")
    assert set(fingerprint_diff(_seed(stack, "cache").baseline, _seed(stack, "cache").fingerprint())) == {
        "acl",
        "config",
        "functions",
    }
    assert _logged(client, "intruder")
    client.close()
    assert _reset_and_diff(stack, "cache") == []
    client = connect.redis(stack, "cache").client(decode_responses=True)
    assert client.acl_list() == seeded_acl
    assert client.info("server")["run_id"] == run_id
    assert client.function_list() == [] and client.script_exists(sha) == [False]
    assert client.execute_command("ROLE")[0] == "master"
    assert not _logged(client, "intruder")
    client.close()


def _logged(client: redis.Redis, word: str) -> bool:
    """Whether the slow log holds a command with ``word`` among its arguments."""
    return any(word in str(entry["command"]) for entry in client.slowlog_get(1024))


def test_redis_a_trials_write_pause_is_lifted_and_the_server_reset_in_place(stack: Stack) -> None:
    """A trial's ``CLIENT PAUSE … WRITE`` (for an hour) would hold the reset's writes until it ended: the
    reset lifts it first, so the same server is reset in place (not replaced) and takes writes again."""
    client = connect.redis(stack, "cache").client(decode_responses=True)
    run_id = client.info("server")["run_id"]
    client.execute_command("CLIENT", "PAUSE", "3600000", "WRITE")
    client.close()
    try:
        assert _reset_and_diff(stack, "cache") == []
        client = connect.redis(stack, "cache").client(decode_responses=True)
        assert client.info("server")["run_id"] == run_id
        assert client.delete("forge:absent") == 0  # a write: it would wait out the pause
        client.close()
    finally:  # whatever failed, the next tests get a server that takes writes
        connect.redis(stack, "cache").client().execute_command("CLIENT", "UNPAUSE")


def test_tree_edits_deletions_dotfiles_and_modes_are_restored(stack: Stack) -> None:
    before = _sh(stack, f"cd {WS} && find . -printf '%m %y %p\\n' | sort && cat .env src/pkg/app.py")
    _sh(
        stack,
        f"cd {WS} && echo evil > src/pkg/app.py && rm -rf empty .env && chmod 600 run.sh"
        " && mkdir -p new/deep && touch new/deep/.hidden && chmod 700 .",
    )
    assert _reset_and_diff(stack, "ws") == []
    assert _sh(stack, f"cd {WS} && find . -printf '%m %y %p\\n' | sort && cat .env src/pkg/app.py") == before


LISTING = (
    "select (select string_agg(datname, ',' order by datname) from pg_database),"
    " (select string_agg(rolname, ',' order by rolname) from pg_roles),"
    " (select string_agg(extname, ',' order by extname) from pg_extension),"
    " (select count(*) from pg_file_settings where sourcefile like '%auto.conf'), current_setting('work_mem')"
)


def _vandalise_cluster(trial: Stack, service: str) -> tuple[object, ...]:
    """Roles, databases, ALTER SYSTEM and extensions changed (what the template strategy cannot reach);
    the listing before."""
    with connect.postgres(trial, service).connect() as conn:
        before = conn.execute(LISTING).fetchone()
        assert before is not None and not any("forge" in str(v) for v in before)
        conn.execute("create role intruder login")
        conn.execute("create database other")
        conn.execute("create extension pg_trgm")
        conn.execute("alter system set work_mem = '77MB'")
        conn.execute("select pg_reload_conf()")
    return tuple(before)


def test_the_exact_reset_undoes_the_whole_cluster_and_a_trial_sees_a_fresh_stack(
    stack: Stack, project: Project, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """The exact reset of a supervised server restores the whole cluster (the listing is the first
    seeding's) in its own container: the same container and host port, no helper. What a trial sees of
    that container from inside it (PID 1, its children, ``ls -la /``, the stat of ``/forge``) is what it
    sees in a fresh stack of the same project, which runs the same loop: fresh and restored are equal,
    not merely free of forge's names. ``/forge`` is root's and mode 0700 (the server's OS user, all a
    trial reaches through the server, cannot list it), no volume is mounted there, and the server's data
    directory and /tmp hold nothing of forge's."""
    port = stack.compose.published_ports().get("db")
    before = _vandalise_cluster(stack, "db")
    assert _reset_and_diff(stack, "db") == []
    assert not _seed(stack, "db").restarts  # restarted in place: the host ports stay
    assert stack.compose.published_ports().get("db") == port
    with connect.postgres(stack, "db").connect() as conn:
        assert conn.execute(LISTING).fetchone() == before
    restored = seen(stack, "db", "postgres")
    pid1 = restored[0].rstrip()
    assert pid1.startswith("pid1: sh -c ") and pid1.endswith(" forge-supervise docker-entrypoint.sh postgres")
    assert "root: drwx------ 3 root root 4096 forge" in restored, restored
    assert "forge: 700 root:root 3 4096 directory" in restored, restored
    fresh_run = f"it-warm-fresh-{secrets.token_hex(4)}"
    spec = StackPlan(
        stack.environment, f"itfresh-{fresh_run}", lab.run_labels(fresh_run, "fresh-0"), tmp_path
    )
    fresh = provision_stack(StackContext(project, TIMEOUTS, runner), spec, FreshSteps())
    try:
        assert fresh.prepared == ()
        assert seen(fresh, "db", "postgres") == restored
    finally:
        teardown_trial(fresh)
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: fresh_run}))
    found = stack.compose.exec("db", ["sh", "-c", "ls -a /tmp /var/lib/postgresql"]).stdout
    assert "forge" not in found
    db = stack.compose.container("db")
    as_server = ["docker", "exec", "--user", "postgres", db, "ls", "/forge"]
    denied = stack.compose.runner.run(as_server, check=False)
    assert denied.rc != 0 and "Permission denied" in denied.stderr
    mounts = stack.compose.runner.run(
        ["docker", "inspect", "--format", "{{range .Mounts}}{{.Destination}} {{end}}", db]
    ).stdout
    assert "/forge" not in mounts  # in the container's own layer: no volume outlives it
    assert not stack.compose.inspect([f"{stack.compose.name}-forge-pristine-db"]), "no helper container"


def test_the_helper_reset_undoes_the_whole_cluster_and_keeps_nothing_in_the_service(
    stack: Stack,
) -> None:
    """Where the supervisor declines (a server run as its own user), the exact reset restores the same
    (roles, databases, ALTER SYSTEM and extensions gone, the listing the first seeding's) through a helper
    container, and neither the server nor its container holds anything of forge's: no loop, no ``/forge``
    (its pristine copy is in the helper's own layer)."""
    before = _vandalise_cluster(stack, "hdb")
    assert _reset_and_diff(stack, "hdb") == []
    with connect.postgres(stack, "hdb").connect() as conn:
        assert conn.execute(LISTING).fetchone() == before
    found = stack.compose.exec("hdb", ["sh", "-c", "ls -a / /tmp /var/lib/postgresql"]).stdout
    assert "forge" not in found
    assert "forge" not in seen(stack, "hdb", "postgres")[0]  # PID 1 is the server itself
    helper = f"{stack.compose.name}-forge-pristine-hdb"
    mounts = stack.compose.runner.run(
        [
            "docker",
            "inspect",
            "--format",
            "{{range .Mounts}}{{.Destination}} {{end}}",
            stack.compose.container("hdb"),
        ]
    ).stdout
    assert "/forge-pristine" not in mounts  # the copy is mounted in the helper only
    assert stack.compose.inspect([helper]), "the helper holds the pristine copy"


# Run by the server's own OS user (COPY TO PROGRAM, as a superuser trial could): a file rewritten with its
# mtime set back, a file with another mode, a new file, a new directory and a symlink.
BEHIND_THE_SERVER = (
    "cp -p PG_VERSION /tmp/forge-v && echo 99 > PG_VERSION && touch -r /tmp/forge-v PG_VERSION"
    " && chmod 644 pg_ident.conf && echo x > intruder && mkdir -p base/intruder_dir && ln -s /etc/passwd link"
)
LOOK = "cat PG_VERSION; stat -c %a pg_ident.conf; ls -a . base | grep -c -e intruder -e link || true"


@pytest.mark.parametrize("service", ["db", "hdb"])
def test_the_exact_reset_puts_back_files_changed_behind_the_servers_back(stack: Stack, service: str) -> None:
    """A reset finds what changed by inode change time, which nobody can set back: a rewritten file whose
    mtime was forged is put back too (else the server would not even start on PG_VERSION 99), and modes,
    new files, directories and links are undone (in place, supervised, and by the helper)."""
    with connect.postgres(stack, service).connect() as conn:
        row = conn.execute("show data_directory").fetchone()
        assert row is not None
        pgdata = str(row[0])
        look = ["sh", "-c", f"cd {pgdata} && {LOOK}"]
        before = stack.compose.exec(service, look).stdout
        assert before.split()[1:] == ["600", "0"], before
        # The program reads the row COPY sends it first: one that exits before postgres has written it
        # makes COPY fail on a broken pipe, now and then.
        script = f"cat >/dev/null; cd {pgdata} && {BEHIND_THE_SERVER}".replace("'", "''")
        conn.execute(f"copy (select 1) to program '{script}'")
    changed = stack.compose.exec(service, look).stdout
    assert changed.split() == ["99", "644", "3"], changed
    assert _reset_and_diff(stack, service) == []
    assert stack.compose.exec(service, look).stdout == before


PROCESSES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.mark.parametrize("service", ["db", "hdb"])
def test_the_exact_reset_leaves_no_process_a_trial_started_in_the_service(stack: Stack, service: str) -> None:
    """A process a superuser trial starts in the server's container (COPY TO PROGRAM, detached) could go on
    changing the data directory after the reset: the reset ends it, as stopping the container did."""
    with connect.postgres(stack, service).connect() as conn:
        # read the row first (see above), then leave the process behind
        conn.execute("copy (select 1) to program 'cat >/dev/null; nohup sleep 4242 >/dev/null 2>&1 &'")
    assert "sleep 4242" in stack.compose.exec(service, ["sh", "-c", PROCESSES]).stdout
    assert _reset_and_diff(stack, service) == []
    assert "sleep 4242" not in stack.compose.exec(service, ["sh", "-c", PROCESSES]).stdout


def test_beyond_the_reset_the_fingerprint_differs(stack: Stack) -> None:
    """What a reset does not restore is caught, per kind (these leave the stack dirty: they run last)."""
    with connect.postgres(stack, "tdb").connect() as conn:
        conn.execute("create role intruder login")
        conn.execute("create database other")
    assert set(_reset_and_diff(stack, "tdb")) == {"databases", "roles", "role_rows"}
    # redis's reset restores all a trial can change but a module (it cannot load one: the module command is
    # off), so nothing is left for its fingerprint to see. A trial that locks forge out is loud instead.
    connect.redis(stack, "cache").client().config_set("requirepass", "intruder")
    with pytest.raises(RecipeError, match=r"service 'cache'.*seeded credentials no longer open the server"):
        _seed(stack, "cache").reset()
    # the tree keeps nothing in its service to tamper with: a reset copies the seed from the host
    assert ".forge-pristine" not in _sh(stack, "ls -a /tmp")


def test_a_reset_that_cannot_run_is_loud(stack: Stack) -> None:
    p = _seed(stack, "tdb")
    pg = p.prepared
    assert isinstance(pg, sql_dump.Prepared)
    pg.wait()  # the background job making the next ready copy
    assert pg.ready is not None
    with connect.postgres(stack, "tdb").connect() as conn:  # a trial opening the ready copy changes its row
        conn.execute(f'alter database "{pg.ready[0]}" with allow_connections true')
    with pytest.raises(RecipeError, match=r"reset step on service 'tdb'.*was changed"):
        p.reset()


def test_a_redis_pause_of_every_command_fails_the_reset_loud_naming_it(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """``CLIENT PAUSE … ALL`` holds every command of every client but a replica's, ``CLIENT UNPAUSE`` too:
    nothing lifts it from outside, so the reset times out and says why (the stack is then replaced). Its own
    stack: the pause outlasts the test."""
    redis_svc = {**REDIS, "command": ["redis-server", "--save", "", "--appendonly", "no"]}
    seeds = {"rdb": (RDB, SeedKind.REDIS_DUMP)}
    project = make_project(tmp_path / "p", {"cache": redis_svc}, seeds=seeds, reset={"cache": "rdb"})
    run_id = f"it-redis-pause-{secrets.token_hex(4)}"
    labels = lab.run_labels(run_id, "pause-0")
    spec = StackPlan(project.environment, f"itpause-{run_id}", labels, tmp_path / "s")
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        connect.redis(trial, "cache").client().execute_command("CLIENT", "PAUSE", "3600000", "ALL")
        with pytest.raises(RecipeError, match=r"service 'cache'.*CLIENT PAUSE … ALL"):
            _seed(trial, "cache").reset()
    finally:
        teardown_trial(trial)
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
