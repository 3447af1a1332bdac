"""The mysql kind on the real engine (the MariaDB stand-in): bad input fails with a clear error and leaves
nothing behind; a dump far larger than the memory the forge process may grow by is applied, streamed;
a golden is captured once and restored with its fingerprint checked; the fingerprint sees each sort of
change a trial can make (what the exact reset must undo)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.stacks import IDLE, MARIADB, make_project, provision

from forgelib.docker import labels as lab
from forgelib.errors import ProvisionError
from forgelib.kinds.base import fingerprint_diff
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import connect
from forgelib.stacks.provision import teardown_trial
from forgelib.stacks.snapshots import store
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

# Healthy once the server answers over TCP, whatever the credentials (ping succeeds on "access denied").
DB: dict[str, Any] = {**MARIADB, "healthcheck": {**MARIADB["healthcheck"], "test": [
    "CMD", "mariadb-admin", "ping", "-h", "127.0.0.1"]}}  # fmt: skip
SEED = (
    "create table orders (id int primary key, item varchar(20));\ninsert into orders values (1, 'kettle');\n"
)
MYSQL8 = (
    "-- MySQL dump 10.13  Distrib 8.0.36, for Linux (x86_64)\n--\n-- Server version\t8.0.36\n"
    "/*!80016 SET @@default_collation_for_utf8mb4 = utf8mb4_0900_ai_ci */;\n"
    "CREATE TABLE orders (id int) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_0900_ai_ci;\n"
    "/*!50017 DEFINER=`root`@`localhost`*/ /*!50003 TRIGGER t BEFORE INSERT ON orders"
    " FOR EACH ROW SET @x=1 */;\n"
)


def _gone(runner: SubprocessRunner, run_id: str) -> None:
    left = lab.resources_with_labels(runner, {lab.RUN: run_id})
    assert lab.is_empty(left), f"leaked: {left}"


def _project(tmp: Path, sql: str, db: dict[str, Any] | None = None, name: str = "itmysql") -> Project:
    (tmp / "seed.sql").write_text(sql)
    return make_project(
        tmp / "p",
        {"db": db or DB},
        seeds={"s": (tmp / "seed.sql", SeedKind.SQL_DUMP)},
        reset={"db": "s"},
        name=name,
    )


def _fails(project: Project, run_id: str, tmp: Path, runner: SubprocessRunner) -> str:
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp, runner)
    assert err.value.stage == "reset_recipe", err.value
    _gone(runner, run_id)
    return err.value.reason


def test_a_syntax_error_names_the_line_and_the_servers_message(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    reason = _fails(_project(tmp_path, SEED + "selec 1;\n"), run_id, tmp_path, runner)
    assert "the dump failed at line 3: ERROR 1064 (42000): You have an error in your SQL syntax" in reason
    assert "near 'selec 1'" in reason and str((tmp_path / "seed.sql").resolve()) in reason


def test_a_mysql8_dump_on_mariadb_is_refused_with_the_fix(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    reason = _fails(_project(tmp_path, MYSQL8), run_id, tmp_path, runner)
    assert "preflight step on service 'db': the dump was written by MySQL 8" in reason
    assert "its header says MySQL 8; MySQL 8's collation utf8mb4_0900_* at line 4" in reason
    assert "a /*!80xxx */ version comment at line 4; DEFINER= clauses (first at line 6)" in reason
    assert "but the service runs MariaDB (10.11" in reason and "sed -E" in reason


def test_a_wrong_root_password_says_which_variable_held_it(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    init = tmp_path / "init"
    init.mkdir()
    (init / "other.sql").write_text(
        "ALTER USER 'root'@'localhost' IDENTIFIED BY 'other'; ALTER USER 'root'@'%' IDENTIFIED BY 'other';\n"
    )
    db = {**DB, "volumes": [f"{init}:/docker-entrypoint-initdb.d:ro"]}
    reason = _fails(_project(tmp_path, SEED, db), run_id, tmp_path, runner)
    assert "the server refused user 'root' with the password from MARIADB_ROOT_PASSWORD" in reason
    assert "Access denied for user 'root'@'localhost'" in reason


def test_a_service_declared_mysql_that_is_not_is_named(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    fake = {**IDLE, "labels": {"io.forgelib.kind": "mysql"}}
    reason = _fails(_project(tmp_path, SEED, fake), run_id, tmp_path, runner)
    assert "service 'db' has neither the mariadb nor the mysql client, so it is not a MySQL" in reason
    assert "io.forgelib.kind" in reason


# ------------------------------------------------------------------------------ a dump larger than memory

MB = 1024 * 1024
# The dump's size, and the most the forge process's peak RSS may grow by while it digests, preflights and
# applies it. A dump held whole (read, decoded, or passed as `input=`) grows it by at least the dump's
# size; streamed from the file into the client's stdin, it barely moves.
BIG_DUMP_MB = 32
GROWTH_LIMIT_MB = BIG_DUMP_MB // 4

# A fresh interpreter (argv[1]: JSON of the stack and the dump) that runs the sql_dump recipe the registry
# picks for the service, as provisioning does, and reports its own peak RSS (children excluded) before
# and after, as JSON.
_APPLY = r"""
import json, resource, sys
from pathlib import Path
from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import registry
from forgelib.kinds.base import ApplyContext
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import Seed, SeedKind, Timeouts

a = json.loads(sys.argv[1])
timeouts = Timeouts(recipe=600, command=60)
compose = ComposeProject(a["name"], tuple(Path(f) for f in a["files"]), SubprocessRunner(), timeouts,
                         a["image_env"], cwd=Path(a["cwd"]))
svc = ServiceConfig.of(a["service"], a["service_name"])
recipe = registry.recipe_for(SeedKind.SQL_DUMP, svc)
dump = Path(a["dump"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seed = Seed("big", dump, SeedKind.SQL_DUMP, seed_digest(dump, SeedKind.SQL_DUMP))
ctx = ApplyContext(a["service_name"], seed, {}, compose=compose, timeouts=timeouts, service_config=svc)
recipe.apply(ctx)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"recipe": recipe.__name__, "before_kb": before, "after_kb": after}))
"""


def _big_dump(path: Path, size_mb: int) -> int:
    """A mysqldump-style dump of ``size_mb`` MiB (extended INSERTs of a thousand rows); its row count."""
    payload = os.urandom(24).hex()
    rows = 0
    with path.open("w") as f:
        f.write("CREATE TABLE big_rows (id INT PRIMARY KEY, payload CHAR(48) NOT NULL);\n")
        while f.tell() < size_mb * MB:
            values = ",".join(f"({rows + i},'{payload}')" for i in range(1000))
            f.write(f"INSERT INTO big_rows VALUES {values};\n")
            rows += 1000
    return rows


def test_a_dump_larger_than_memory_is_applied_without_being_read_whole(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    t = provision(_project(tmp_path, "select 1;\n"), run_id, tmp_path, runner)
    dump = tmp_path / "big.sql"
    try:
        rows = _big_dump(dump, BIG_DUMP_MB)
        size = dump.stat().st_size
        assert size >= BIG_DUMP_MB * MB
        stack = {
            "name": t.compose.name, "files": [str(f) for f in t.compose.files], "dump": str(dump),
            "image_env": dict(t.compose.image_env), "cwd": str(t.compose.cwd or t.compose.files[0].parent),
            "service": dict(t.config["services"]["db"]), "service_name": "db",
        }  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", _APPLY, json.dumps(stack)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["recipe"] == "forgelib.kinds.mysql.seed", got
        growth_mb = (got["after_kb"] - got["before_kb"]) / 1024
        assert growth_mb < GROWTH_LIMIT_MB, f"peak RSS grew {growth_mb:.1f} MB over a {size / MB:.0f} MB dump"
        with connect.mysql(t, "db", database="app").connect() as conn, conn.cursor() as cur:
            cur.execute("select count(*), max(id) from big_rows")
            assert cur.fetchone() == (rows, rows - 1)
    finally:
        dump.unlink(missing_ok=True)
        teardown_trial(t)
    _gone(runner, run_id)


# ------------------------------------------------------------------------------------------------- goldens


@pytest.fixture
def name(runner: SubprocessRunner) -> Iterator[str]:
    """A project name of its own; every golden taken under it is removed afterwards."""
    n = f"goldmy{secrets.token_hex(3)}"
    yield n
    for g in [g for g in store.list_goldens(runner) if g.part("project") == n]:
        store.remove(runner, g, force_untag=True)


def test_a_golden_is_taken_once_and_restored_with_its_rows(
    runner: SubprocessRunner, run_id: str, tmp_path: Path, name: str
) -> None:
    project = _project(tmp_path, f"-- {name}\n{SEED}", name=name)
    outcomes = []
    for idx in (0, 1):
        t = provision(project, run_id, tmp_path, runner, idx, snapshots=True)
        try:
            outcomes.append(t.snapshots["db"]["outcome"])
            with connect.mysql(t, "db", database="app").connect() as conn, conn.cursor() as cur:
                cur.execute("select id, item from orders")
                assert cur.fetchall() == ((1, "kettle"),)
        finally:
            teardown_trial(t)
    assert outcomes == ["captured", "restored"]
    _gone(runner, run_id)


# ----------------------------------------------------------------------------------------- the fingerprint

CHANGES = {
    "databases": "create database extra",
    "accounts": "create user 'intruder'@'%' identified by 'x'",
    "users": "grant process on *.* to 'intruder'@'%'",
    "schema_grants": "grant select on app.* to 'intruder'@'%'",
    "seeded_rows": "update app.orders set item = 'toaster'",
    "columns": "alter table app.orders add column note text",
    "variables": "set global max_connections = 77",
}


def test_the_fingerprint_sees_each_sort_of_change_and_the_reset_undoes_all(
    runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    """Each change shows in its fingerprint part; the exact reset (MariaDB restarted in place under the
    supervisor: the same container and host port) undoes them all, and what a trial sees of the container
    from inside it as the server's user (PID 1, its children, ``ls -la /``, the stat of ``/forge``) is
    what it sees in a fresh stack of the same project."""
    project = _project(tmp_path, SEED)
    from support.stacks import TIMEOUTS
    from support.trialview import seen

    from forgelib.stacks.provision import StackContext, StackPlan, WarmSteps, provision_stack

    spec = StackPlan(project.environment, f"itmy-{run_id}", lab.run_labels(run_id, "fp"), tmp_path / "stack")
    t: Stack = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        (prepared,) = t.prepared
        port = t.compose.published_ports().get("db")
        for part, statement in CHANGES.items():
            with connect.mysql(t, "db").connect() as conn, conn.cursor() as cur:
                cur.execute(statement)
            assert part in fingerprint_diff(prepared.baseline, prepared.fingerprint()), part
        prepared.reset()
        assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == []
        assert not prepared.restarts and t.compose.published_ports().get("db") == port
        restored = seen(t, "db", "mysql")
        assert restored[0].rstrip().endswith(" forge-supervise docker-entrypoint.sh mariadbd"), restored
        assert "forge: 700 root:root 3 4096 directory" in restored, restored
    finally:
        teardown_trial(t)
    fresh = provision(project, run_id, tmp_path, runner)
    try:
        assert seen(fresh, "db", "mysql") == restored
    finally:
        teardown_trial(fresh)
    _gone(runner, run_id)
