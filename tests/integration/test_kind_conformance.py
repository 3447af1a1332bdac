"""Every kind passes the same checks on the real engine (``forgelib.kinds``), like inspect's sandbox
``self_check``: its seed applied, each reset strategy restoring it, a stable fingerprint that sees every
sort of change the kind claims it does, its grading observer, its MCP tool backend and its client. One
warm stack serves the module (a service per kind and reset strategy); every test that changes it resets
it before it ends. A kind that does not support a check says so itself (``Kind.unsupported``): the check
is skipped with the kind's reason, never edited per kind. A new kind adds its ``Case`` (with its
``Mutation``s) to ``CASES`` and its services to ``_project``: the checks stay as they are."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.stacks import IDLE, MARIADB, PG, REDIS, TIMEOUTS, make_project, provision

from forgelib.docker import labels as lab
from forgelib.docker.resolved import ResolvedConfig
from forgelib.kinds import KINDS, Kind
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import ApplyContext, Fingerprint, PreparedSeed, fingerprint_diff
from forgelib.mcp.tools import Toolbox
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import checkpoints, connect
from forgelib.stacks.provision import (
    FreshSteps,
    StackContext,
    StackPlan,
    WarmSteps,
    provision_stack,
    teardown_trial,
)
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import store
from forgelib.stacks.stack import Stack

pytestmark = pytest.mark.integration

RDB = Path(__file__).parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"


@dataclass(frozen=True)
class Mutation:
    """One sort of change a trial could make that the kind's fingerprint claims to see: ``change`` (argv in
    the service) must make the fingerprint parts ``sees`` differ from the baseline, and the reset must
    restore it. ``only``: the case's services whose fingerprint covers it (empty: all of them; a reset that
    recreates the seeded state whole leaves that state out). ``kept``: services whose reset leaves the
    change (the fingerprint must still see it: that is what replaces such a stack), removed by ``undo``."""

    name: str
    change: list[str]
    sees: tuple[str, ...]
    only: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    undo: list[str] | None = None


def _psql(statement: str, database: str = "postgres") -> list[str]:
    return ["psql", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", database, "-c", statement]


def _sh(script: str) -> list[str]:
    return ["sh", "-ec", script]


# The postgres stack's services: `db` resets by data directory (exact: the fingerprint digests the seeded
# database's rows too), `tdb` by template (the seeded database is recreated whole, so its fingerprint covers
# only the cluster around it, which that reset leaves).
# `db` runs under forge's loop (the server restarted in its container); `sdb` runs as the server's own user,
# which the loop declines: the same exact reset, through the helper container.
EXACT_ONLY = ("db", "sdb")
TEMPLATE = ("tdb",)
MAINTENANCE = "template1"  # the database forge's postgres recipe connects to when the seeded one is postgres


def _beside(name: str, create: str, drop: str) -> Mutation:
    """An object created in the maintenance database, which no reset of the seeded one touches (the template
    strategy keeps it, and its fingerprint must still see it)."""
    return Mutation(
        name, _psql(create, MAINTENANCE), ("maintenance_db",), kept=TEMPLATE, undo=_psql(drop, MAINTENANCE)
    )


POSTGRES_MUTATIONS = (
    Mutation("row_changed", _psql("update t set v = 'changed'"), ("seeded_rows",), only=EXACT_ONLY),
    Mutation("table_added", _psql("create table extra (x int)"), ("seeded_rows",), only=EXACT_ONLY),
    Mutation(
        "schema_added",
        _psql("create schema forge_conf; create table forge_conf.t (x int)"),
        ("seeded_rows",),
        only=EXACT_ONLY,
    ),
    _beside("table_added_beside", "create table forge_conf_t (x int)", "drop table forge_conf_t"),
    _beside("empty_schema_added_beside", "create schema forge_conf_s", "drop schema forge_conf_s"),
    _beside(
        "function_added_beside",
        "create function forge_conf_f() returns int language sql as 'select 1'",
        "drop function forge_conf_f()",
    ),
    Mutation(
        "role_added",
        _psql("create role forge_conf"),
        ("roles",),
        kept=TEMPLATE,
        undo=_psql("drop role forge_conf"),
    ),
    Mutation(
        "role_password_changed",
        _psql("alter role postgres password 'forge-conf'"),
        ("role_rows",),
        only=EXACT_ONLY,  # a catalog row's version never goes back: no undo, the template reset keeps it
    ),
    Mutation(
        "system_setting",
        _psql("alter system set work_mem = '7MB'"),
        ("system",),
        kept=TEMPLATE,
        undo=_psql("alter system reset work_mem"),
    ),
    Mutation(
        "database_setting",
        _psql(f"alter database {MAINTENANCE} set work_mem = '7MB'"),
        ("settings",),
        kept=TEMPLATE,
        undo=_psql(f"alter database {MAINTENANCE} reset work_mem"),
    ),
    Mutation(
        "role_setting",
        _psql("alter role postgres set work_mem = '7MB'"),
        ("settings",),
        kept=TEMPLATE,
        undo=_psql("alter role postgres reset work_mem"),
    ),
    Mutation(
        "database_added",
        _psql("create database forge_conf"),
        ("databases",),
        kept=TEMPLATE,
        undo=_psql("drop database forge_conf"),
    ),
)

SEEDED_KEY = "order:4017"  # a string key of the redis seed (cache_poisoned.rdb)

REDIS_MUTATIONS = (
    Mutation("key_added", ["redis-cli", "SET", "forge:conf", "x"], ("keyspace",)),
    Mutation("key_deleted", ["redis-cli", "DEL", SEEDED_KEY], ("keyspace",)),
    Mutation(
        "key_type_changed",  # values are rewritten by every reset: only names and types are digested
        _sh(f"redis-cli DEL {SEEDED_KEY}; redis-cli RPUSH {SEEDED_KEY} x"),
        ("keyspace",),
    ),
    Mutation("key_in_another_db", ["redis-cli", "-n", "3", "SET", "forge:conf", "x"], ("keyspace",)),
    Mutation(
        "config_changed", ["redis-cli", "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"], ("config",)
    ),
    Mutation(
        "acl_user_added", ["redis-cli", "ACL", "SETUSER", "forge-conf", "on", ">pw", "~k*", "+get"], ("acl",)
    ),
    Mutation(
        "acl_rules_changed", ["redis-cli", "ACL", "SETUSER", "default", "-debug", "(~s* +set)"], ("acl",)
    ),
    Mutation("made_a_replica", ["redis-cli", "REPLICAOF", "127.0.0.1", "1"], ("config",)),  # of nothing
    Mutation(
        "function_loaded",
        [
            "redis-cli",
            "FUNCTION",
            "LOAD",
            "#!lua name=forgeconf\nredis.register_function('forgeconf', function() return 1 end)",
        ],
        ("functions",),
    ),
)

TREE_MUTATIONS = (
    Mutation("file_added", ["touch", "/workspace/new.txt"], ("tree",)),
    # to another size: the listing digests sizes (the reset's own verify compares contents)
    Mutation("file_changed", _sh("echo vandal > /workspace/a.txt"), ("tree",)),
    Mutation("file_deleted", ["rm", "/workspace/b.txt"], ("tree",)),
    Mutation("mode_changed", ["chmod", "600", "/workspace/a.txt"], ("tree",)),
    Mutation("root_mode_changed", ["chmod", "700", "/workspace"], ("tree",)),
    Mutation("owner_changed", ["chown", "1234:1234", "/workspace/a.txt"], ("tree",)),
    Mutation("symlink_added", ["ln", "-s", "a.txt", "/workspace/link"], ("tree",)),
    Mutation("directory_added", ["mkdir", "/workspace/sub"], ("tree",)),
)


def _mariadb(statement: str) -> list[str]:
    return ["mariadb", "-uroot", "-proot", "app", "-e", statement]


MYSQL_MUTATIONS = (
    Mutation("row_changed", _mariadb("update t set v = 'changed'"), ("seeded_rows",)),
    Mutation("table_added", _mariadb("create table extra (x int)"), ("tables", "columns", "seeded_rows")),
    Mutation("column_added", _mariadb("alter table t add column x int"), ("columns",)),
    Mutation("database_added", _mariadb("create database forge_conf"), ("databases",)),
    Mutation(
        "account_added", _mariadb("create user 'forge_conf'@'%' identified by 'x'"), ("accounts", "users")
    ),
    Mutation("grant_added", _mariadb("grant select on app.* to 'root'@'localhost'"), ("schema_grants",)),
    Mutation("view_added", _mariadb("create view v as select v from t"), ("views", "tables", "columns")),
    Mutation("global_variable", _mariadb("set global max_connections = 77"), ("variables",)),
)


@dataclass(frozen=True)
class Case:
    """How the suite exercises one kind: its services in the stack, a way to change the seeded state and
    to read it back (``probe``: what it must read after apply and after every reset)."""

    services: tuple[str, ...]
    seed: str
    probe: list[str]  # argv in the service whose stdout is the seeded state
    expected: str
    change: list[str]  # argv in the service that changes the seeded state
    check: dict[str, Any] | None = None  # the spec of the kind's check (service filled in)
    tool: tuple[str, dict[str, Any], str] | None = None  # (tool, arguments, text the result holds)
    # Each sort of change the kind's fingerprint claims to see (none: the kind declares no fingerprint).
    mutations: tuple[Mutation, ...] = ()


CASES: dict[str, Case] = {
    "postgres": Case(
        ("db", "sdb", "tdb"),
        "sql",
        ["psql", "-At", "-U", "postgres", "-c", "select v from t"],
        "seeded",
        ["psql", "-U", "postgres", "-c", "update t set v = 'changed'"],
        check={"query": "select v from t"},
        tool=("sql_query", {"query": "select v from t"}, '"rows": [["seeded"]]'),
        mutations=POSTGRES_MUTATIONS,
    ),
    "redis": Case(
        ("cache",),
        "rdb",
        ["redis-cli", "--raw", "DBSIZE"],
        "",  # filled from the stack after apply
        ["redis-cli", "FLUSHALL"],
        check={"command": ["DBSIZE"]},
        tool=("redis_command", {"command": ["DBSIZE"]}, '"reply"'),
        mutations=REDIS_MUTATIONS,
    ),
    "tree": Case(
        ("ws",),
        "tree",
        ["sh", "-c", "cat /workspace/a.txt"],
        "a",
        ["sh", "-c", "echo vandal > /workspace/a.txt; rm -f /workspace/b.txt"],
        mutations=TREE_MUTATIONS,
    ),
    "bare": Case(("bare",), "order", ["sh", "-c", 'cat "$FORGE_SEED_ORDER"'], "order-7", ["true"]),
    "mysql": Case(
        ("my",),
        "mysql",
        ["mariadb", "-uroot", "-proot", "-NB", "app", "-e", "select v from t"],
        "seeded",
        ["mariadb", "-uroot", "-proot", "app", "-e", "update t set v = 'changed'"],
        check={"query": "select v from t"},
        tool=("sql_query", {"query": "select v from t"}, '"rows": [["seeded"]]'),
        mutations=MYSQL_MUTATIONS,
    ),
}


def _skip_unless(kind: Kind, what: str) -> None:
    if what in kind.unsupported:
        pytest.skip(f"{kind.name}: {kind.unsupported[what]}")


def _project(
    tmp: Path, *, only: Sequence[str] = (), name: str = "itest", env: Mapping[str, str] | None = None
) -> Project:
    """The suite's project: a service per kind and reset strategy, each reset from its kind's seed.
    ``only``: just these services (empty: all); ``env`` is added to each one's environment."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    tree = tmp / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("a")
    (tree / "b.txt").write_text("b")
    (tmp / "order.txt").write_text("order-7")
    (tmp / "mysql.sql").write_text("create table t (v varchar(20)); insert into t values ('seeded');\n")
    services: dict[str, dict[str, Any]] = {
        "db": PG,
        "sdb": {**PG, "user": "postgres"},
        "tdb": PG,
        "cache": {**REDIS, "command": ["redis-server", "--save", "", "--appendonly", "no"]},
        "ws": {**IDLE, "volumes": ["work:/workspace"]},
        "bare": IDLE,
        "my": MARIADB,
    }
    reset: dict[str, str | tuple[str, Mapping[str, Any]]] = {
        "db": "sql",
        "sdb": "sql",
        "tdb": ("sql", {"strategy": "template"}),
        "cache": "rdb",
        "ws": "tree",
        "bare": "order",
        "my": "mysql",
    }
    keep = set(only or services)
    if env:
        services = {
            n: {**svc, "environment": {**svc.get("environment", {}), **env}} for n, svc in services.items()
        }
    return make_project(
        tmp / "p",
        {n: svc for n, svc in services.items() if n in keep},
        seeds={
            "sql": (tmp / "seed.sql", SeedKind.SQL_DUMP),
            "rdb": (RDB, SeedKind.REDIS_DUMP),
            "tree": (tree, SeedKind.FILESYSTEM_DIR),
            "order": (tmp / "order.txt", SeedKind.BARE),
            "mysql": (tmp / "mysql.sql", SeedKind.SQL_DUMP),
        },
        reset={n: b for n, b in reset.items() if n in keep},
        volumes={"work": {}},
        name=name,
    )


@pytest.fixture(scope="module")
def stack(
    docker_ready: None, runner: SubprocessRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("kinds")
    project = _project(tmp)
    run_id = f"it-kinds-{secrets.token_hex(4)}"
    name = f"itkinds-{run_id}"
    spec = StackPlan(project.environment, name, lab.run_labels(run_id, "kinds-0"), tmp / "stack")
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        yield trial
    finally:
        teardown_trial(trial)
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))


@pytest.fixture(scope="module")
def seeded(stack: Stack) -> dict[str, str]:
    """service -> what its probe reads right after the first seeding."""
    return {s: _probe(stack, s, CASES[k.name]) for k in KINDS for s in CASES[k.name].services}


def _probe(stack: Stack, service: str, case: Case) -> str:
    return str(stack.compose.exec(service, case.probe, timeout=30).stdout.strip())


def _prepared(stack: Stack, service: str) -> PreparedSeed | None:
    return next((p for p in stack.prepared if p.ctx.service == service), None)


KIND_IDS = [k.name for k in KINDS]


def test_every_kind_has_a_case() -> None:
    assert set(CASES) == set(KIND_IDS)


@pytest.mark.parametrize("name", KIND_IDS)
def test_apply_seeds_the_service(stack: Stack, seeded: dict[str, str], name: str) -> None:
    case = CASES[name]
    for service in case.services:
        assert seeded[service], service
        if case.expected:
            assert seeded[service] == case.expected, service


@pytest.mark.parametrize("name", KIND_IDS)
def test_each_reset_strategy_restores_the_seed(stack: Stack, seeded: dict[str, str], name: str) -> None:
    kind = kinds.by_name(name)
    _skip_unless(kind, "reset")
    case = CASES[name]
    for service in case.services:  # one service per strategy
        prepared = _prepared(stack, service)
        assert prepared is not None, service
        stack.compose.exec(service, case.change, timeout=30)
        assert _probe(stack, service, case) != seeded[service], service
        prepared.reset()
        assert _probe(stack, service, case) == seeded[service], service


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_fingerprint_is_stable_across_a_reset(stack: Stack, name: str) -> None:
    kind = kinds.by_name(name)
    _skip_unless(kind, "fingerprint")
    for service in CASES[name].services:
        prepared = _prepared(stack, service)
        assert prepared is not None and prepared.baseline, service
        prepared.reset()
        assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == [], service


def test_every_kind_with_a_fingerprint_declares_what_it_sees() -> None:
    for kind in KINDS:
        mutations = CASES[kind.name].mutations
        assert bool(mutations) == ("fingerprint" not in kind.unsupported), kind.name
        assert len({m.name for m in mutations}) == len(mutations), kind.name
        for m in mutations:
            assert set(m.only + m.kept) <= set(CASES[kind.name].services), (kind.name, m.name)
            assert bool(m.kept) == (m.undo is not None), (kind.name, m.name)


MUTATIONS = [pytest.param(k, m, id=f"{k}-{m.name}") for k in KIND_IDS for m in CASES[k].mutations]


@pytest.mark.parametrize(("name", "mutation"), MUTATIONS)
def test_the_fingerprint_sees_a_change_of_each_sort(stack: Stack, name: str, mutation: Mutation) -> None:
    for service in mutation.only or CASES[name].services:
        prepared = _prepared(stack, service)
        assert prepared is not None and prepared.baseline, service
        assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == [], f"{service}: dirty before"
        undo = mutation.undo if service in mutation.kept else None
        stack.compose.exec(service, mutation.change, timeout=30)
        reset = False
        try:
            differ = fingerprint_diff(prepared.baseline, prepared.fingerprint())
            assert set(mutation.sees) <= set(differ), f"{service}: {mutation.name} changed only {differ}"
            prepared.reset()
            reset = True
            if undo is not None:  # the reset leaves it: the fingerprint still sees it (the stack is replaced)
                differ = fingerprint_diff(prepared.baseline, prepared.fingerprint())
                assert set(mutation.sees) <= set(differ), f"{service}: {mutation.name} unseen after reset"
        finally:  # whatever failed, the next test gets the seeded state
            if undo is not None:
                stack.compose.exec(service, undo, timeout=30)
            if not reset:
                prepared.reset()
        assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == [], f"{service}: after reset"


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_observer_reads_the_seeded_state(stack: Stack, seeded: dict[str, str], name: str) -> None:
    kind = kinds.by_name(name)
    case = CASES[name]
    if not kind.checks or case.check is None:
        pytest.skip(f"{name} observes no check type of its own (the generic file check reads it)")
    config = ResolvedConfig.of(stack.config)
    for check_type in kind.checks:
        for service in case.services:
            svc = config.service(service)
            assert kinds.kind_for_check(check_type, svc) is kind
            got = kinds.observer(kind, check_type)(stack.compose, {**case.check, "service": service}, svc, 30)
            assert got.strip() == seeded[service], service


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_mcp_backend_answers_its_tools(stack: Stack, seeded: dict[str, str], name: str) -> None:
    kind = kinds.by_name(name)
    case = CASES[name]
    if not kind.tools or case.tool is None:
        pytest.skip(f"{name} backs no MCP tool")
    tool, args, holds = case.tool
    box = Toolbox(stack)
    try:
        for service in case.services:
            result = box.call(tool, {**args, "service": service})
            assert holds in result, result
            assert seeded[service] in json.dumps(json.loads(result)), result
    finally:
        box.close()


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_client_connects(stack: Stack, name: str) -> None:
    kind = kinds.by_name(name)
    if kinds.client(kind) is None:
        pytest.skip(f"{name}: forge never connects to it directly")
    service = CASES[name].services[0]
    if name == "postgres":
        with connect.postgres(stack, service).connect() as conn:
            assert conn.execute("select v from t").fetchone() == ("seeded",)
    elif name == "mysql":
        with connect.mysql(stack, service).connect() as conn, conn.cursor() as cur:
            cur.execute("select v from t")
            assert cur.fetchone() == ("seeded",)
    else:
        assert connect.redis(stack, service).client().ping()


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_client_is_reached_by_the_services_kind(stack: Stack, name: str) -> None:
    """``connect.client``/``url`` with no kind named: dispatched by the kind recognised for the service,
    to the same connection as the named form."""
    kind = kinds.by_name(name)
    if kinds.client(kind) is None:
        pytest.skip(f"{name}: forge never connects to it directly")
    service = CASES[name].services[0]
    assert stack.kind(service) is kind
    assert connect.url(stack, service) == connect.params(stack, service, kind=kind).url()
    with contextlib.closing(connect.client(stack, service)) as client:
        if name == "redis":
            assert client.ping()
        elif name == "postgres":
            assert client.execute("select v from t").fetchone() == ("seeded",)
        else:
            with client.cursor() as cur:
                cur.execute("select v from t")
                assert cur.fetchone() == ("seeded",)


def _golden_trial(
    project: Project, run_id: str, tmp: Path, runner: SubprocessRunner, idx: int
) -> dict[str, tuple[dict[str, Any], Fingerprint, str]]:
    """A fresh trial from goldens (``forgelib.stacks.snapshots``), torn down after: service -> (what its
    golden did, its golden fingerprint, what its probe reads)."""
    trial = provision(project, run_id, tmp, runner, idx, snapshots=True)
    try:
        config = ResolvedConfig.of(trial.config)
        out = {}
        for name, svc in project.environment.services.items():
            assert svc.reset is not None, name
            seed = project.seeds[svc.reset.seed]
            recipe = kinds.recipe_for(seed.kind, config.service(name))
            assert recipe is not None, name
            ctx = ApplyContext(
                name, seed, svc.reset.options, compose=trial.compose, service_config=config.service(name),
                timeouts=TIMEOUTS,
            )  # fmt: skip
            case = next(c for c in CASES.values() if name in c.services)
            out[name] = (
                dict(trial.snapshots[name]),
                recipe.golden_fingerprint(ctx),
                _probe(trial, name, case),
            )
        return out
    finally:
        teardown_trial(trial)


@pytest.mark.parametrize("name", KIND_IDS)
def test_a_golden_restores_the_seeded_state(
    runner: SubprocessRunner, run_id: str, tmp_path: Path, seeded: dict[str, str], name: str
) -> None:
    kind = kinds.by_name(name)
    _skip_unless(kind, "golden")
    services = CASES[name].services
    # A project of its own, named in the services' environment too (part of every golden key): no other
    # session restores these goldens or has us restore its own, and ours are found by project to remove.
    project_name = f"kconf{secrets.token_hex(3)}"
    project = _project(tmp_path, only=services, name=project_name, env={"FORGE_CONFORMANCE": project_name})
    try:
        captured = _golden_trial(project, run_id, tmp_path, runner, 0)
        restored = _golden_trial(project, run_id, tmp_path, runner, 1)
    finally:
        for golden in store.list_goldens(runner, project=project_name):
            assert store.remove(runner, golden, force_untag=True) is None, golden.id
            store.forget(golden.key)
        assert store.list_goldens(runner, project=project_name) == []
    for service in services:
        took, fingerprint, probe = captured[service]
        assert took["outcome"] == "captured" and fingerprint, took
        assert restored[service][0] == {"outcome": "restored", "golden": took["golden"]}, service
        assert fingerprint_diff(fingerprint, restored[service][1]) == [], service
        assert probe == restored[service][2] == seeded[service], service


# The services a checkpoint restores in place, in the same container: postgres under the supervisor loop
# (``db``: not ``sdb``, which runs as the postgres user, nor ``tdb``, on the template strategy: those go
# through the checkpoint's image), redis, the tree. mysql has no in-place restore.
IN_PLACE = {"db", "cache", "ws"}


@pytest.fixture(scope="module")
def checkpointed(
    docker_ready: None, runner: SubprocessRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A fresh stack of every kind a checkpoint captures, checkpointed right after its seeding."""
    tmp = tmp_path_factory.mktemp("kinds-ck")
    services = [s for k in KINDS if "checkpoint" not in k.unsupported for s in CASES[k.name].services]
    name = f"kck{secrets.token_hex(3)}"
    project = _project(tmp, only=services, name=name)
    run_id = f"it-kinds-ck-{secrets.token_hex(4)}"
    spec = StackPlan(
        project.environment, f"{name}-{run_id}", lab.run_labels(run_id, "kinds-0"), tmp / "stack"
    )
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, FreshSteps())
    held: dict[str, Any] = {"project": project, "trial": trial, "id": None}
    try:
        held["id"] = checkpoints.capture(project, trial, runner, TIMEOUTS).id
        yield held
    finally:
        teardown_trial(held["trial"])
        if held["id"]:
            assert ckstore.remove(runner, held["id"]) is None
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))


@pytest.mark.parametrize("name", KIND_IDS)
def test_a_checkpoint_restores_the_captured_state_in_place(
    checkpointed: dict[str, Any], runner: SubprocessRunner, name: str
) -> None:
    """Changed after the capture, the kind's services are rolled back to it (their fingerprints equal
    the capture's, or the restore raises); those the kind restores in place keep their containers."""
    kind = kinds.by_name(name)
    _skip_unless(kind, "checkpoint")
    case = CASES[name]
    trial: Stack = checkpointed["trial"]
    at_capture = {s: _probe(trial, s, case) for s in case.services}
    before = {s: str(f[0]["Id"]) for s, f in trial.compose.served(list(case.services)).items()}
    for service in case.services:
        trial.compose.exec(service, case.change, timeout=30)
        assert _probe(trial, service, case) != at_capture[service], service
    trial = checkpoints.roll_back(checkpointed["project"], trial, checkpointed["id"], runner, TIMEOUTS)
    checkpointed["trial"] = trial
    after = {s: str(f[0]["Id"]) for s, f in trial.compose.served(list(case.services)).items()}
    for service in case.services:
        assert _probe(trial, service, case) == at_capture[service], service
        assert f"restore:{service}" in trial.timings, service
        if service in IN_PLACE:
            assert after[service] == before[service], service


def test_postgres_template_sees_template1_when_the_seeded_database_is_not_postgres(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """Seeded into ``app``, the template strategy's maintenance database is ``postgres``; ``template1``
    (which every ``CREATE DATABASE`` copies) is outside it and outside the seeded database the reset
    recreates, so its fingerprint digests it too: a table added there is seen, and still seen after a
    reset (which leaves it), until it is dropped."""
    (tmp_path / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    project = make_project(
        tmp_path / "p",
        {"adb": {**PG, "environment": {**PG["environment"], "POSTGRES_DB": "app"}}},
        seeds={"sql": (tmp_path / "seed.sql", SeedKind.SQL_DUMP)},
        reset={"adb": ("sql", {"strategy": "template"})},
        name="ittpl1",
    )
    run_id = f"it-tpl1-{secrets.token_hex(4)}"
    spec = StackPlan(
        project.environment, f"ittpl1-{run_id}", lab.run_labels(run_id, "tpl1-0"), tmp_path / "s"
    )
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        prepared = _prepared(trial, "adb")
        assert prepared is not None and prepared.baseline
        assert "template1_db" in prepared.baseline
        for database, part in (("template1", "template1_db"), ("postgres", "maintenance_db")):
            trial.compose.exec("adb", _psql("create table forge_conf_t (x int)", database), timeout=30)
            try:
                assert part in fingerprint_diff(prepared.baseline, prepared.fingerprint()), database
                prepared.reset()  # recreates `app` only
                assert part in fingerprint_diff(prepared.baseline, prepared.fingerprint()), database
            finally:
                trial.compose.exec("adb", _psql("drop table forge_conf_t", database), timeout=30)
            assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == [], database
    finally:
        teardown_trial(trial)
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
