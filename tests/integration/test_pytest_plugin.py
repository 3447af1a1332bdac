"""The pytest plugin on the real engine, driven through ``pytester`` (a pytest session inside the test).

Provisioning dominates the cost (~5 s a stack), so one xdist session (``-n 2``) proves most of it at once:
the reaper run once by the controller before any test, a passing test per reference pack, a module-scoped
and a session-scoped stack each reset between tests that mutate and then observe the baseline, a failing
assertion whose report carries the services' logs, a broken seed reported as an error with forge's reason
line, run ids naming the worker, and nothing left by label or on disk.
A second session proves the clean-up when a worker is killed and when the whole session gets Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.owners import dead_pid

from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import SeedKind
from forgelib.stacks.reaper import PYTEST_DIR

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PG = EXAMPLES / "multi_service_postgres_reset"
CACHE = EXAMPLES / "multi_service_cache_debug"
ENDPOINT = EXAMPLES / "multi_service_endpoint_add"
BYO = Path(__file__).resolve().parents[1] / "fixtures" / "byo_compose"  # a compose profile (`extra`)
SESSION_TIMEOUT = 900  # bounds a hang of a whole inner session; never reached when things work

# The inner sessions' tests record what they saw here (one JSON file per test), for the outer assertions.
RECORD = """
import json, os, subprocess
from pathlib import Path

RECORDS = Path({records!r})

def _containers(label):
    argv = ["docker", "ps", "-aq", *(a for kv in label.items() for a in ("--filter", "label=%s=%s" % kv))]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.split()

def record(name, stack, **extra):
    RECORDS.mkdir(exist_ok=True)
    labelled = _containers({{"io.forgelib.run": stack.run_id, "com.docker.compose.project": stack.name}})
    data = dict(worker=os.environ.get("PYTEST_XDIST_WORKER"), run_id=stack.run_id, stack=stack.name,
                labelled_containers=len(labelled), pid=os.getpid(),
                planted_left=len(_containers({{"io.forgelib.run": {planted!r}}})) if {planted!r} else None,
                **extra)
    (RECORDS / (name + ".json")).write_text(json.dumps(data))

def mutate_after_baseline(forge_stack, name):
    with forge_stack.postgres("app-db") as conn:
        assert conn.execute("select name from widgets where id = 1").fetchone() == ("baseline",)
        conn.execute("update widgets set name = %s where id = 1", (name,))
        assert conn.execute("select name from widgets where id = 1").fetchone() == (name,)
"""


# xdist's --dist loadfile, except that the two modules sharing the session-scoped stack go to one worker
# (--dist loadgroup would do, but its xdist_group marks are lost with pytest 9.2: it sets item._nodeid).
INNER_CONFTEST = """
import os
from pathlib import Path
from xdist.scheduler import LoadFileScheduling

class Scheduling(LoadFileScheduling):
    def _split_scope(self, nodeid):
        module = super()._split_scope(nodeid)
        return "session" if module in ("test_postgres_pack.py", "test_session_scope.py") else module

def pytest_xdist_make_scheduler(config, log):
    return Scheduling(config, log)

def pytest_configure(config):  # the controller's pid: its temp dirs must be gone too
    if not hasattr(config, "workerinput"):
        Path({records!r}).mkdir(exist_ok=True)
        (Path({records!r}) / "controller.pid").write_text(str(os.getpid()))
"""


def _mini_project(root: Path, dump: str) -> Path:
    """One postgres service bound to a sql_dump seed holding ``dump`` (the cheapest stack there is)."""
    root.mkdir(parents=True)
    (root / "seed.sql").write_text(dump)
    (root / "compose.yaml").write_text(
        "services:\n"
        "  db:\n"
        "    image: forgelib/postgres:15\n"
        "    environment: {POSTGRES_USER: app, POSTGRES_PASSWORD: app, POSTGRES_DB: app}\n"
        "    stop_signal: SIGINT\n"
        "    healthcheck:\n"
        '      test: ["CMD", "pg_isready", "-h", "127.0.0.1", "-U", "app"]\n'
        "      interval: 1s\n"
        "      retries: 60\n"
    )
    digest = seed_digest(root / "seed.sql", SeedKind.SQL_DUMP)
    (root / "project.yaml").write_text(
        f"name: mini\n"
        f"assets:\n  seeds:\n    seed: {{path: seed.sql, kind: sql_dump, digest: '{digest}'}}\n"
        f"default_environment:\n  compose_file: compose.yaml\n"
        f"  services:\n    db: {{isolation: reset, reset: {{seed: seed}}}}\n"
    )
    return root


def _plant_dead_owners_leftover(runner: SubprocessRunner, run_id: str) -> None:
    """A container labelled as a stack of a forge process that has exited: a killed session's leftover."""
    pid, start = dead_pid()
    me = lab.current_owner()
    labels = lab.run_labels(run_id, "t.0", lab.Owner(me.host, pid, me.boot_id, start))
    labels[lab.COMPOSE_PROJECT] = f"{run_id}-stack"
    argv = ["docker", "create", "--name", f"{run_id}-c", *(f"--label={k}={v}" for k, v in labels.items())]
    runner.run([*argv, "forgelib/debian:bookworm", "true"], timeout=60)


def _records(path: Path) -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}


def _leftovers(runner: SubprocessRunner, uid: str, pids: set[int]) -> dict[str, dict[str, list[str]]]:
    """Everything labelled with a run of this inner session (any worker), and the temp dirs of its
    processes (``pids``: the controller and the workers)."""
    out = {}
    prefix = f"pytest-{uid[:8]}"
    fmt = ["--format", '{{.Label "io.forgelib.run"}}']
    listed: list[str] = []
    for ls in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
        listed += runner.run(["docker", *ls, *fmt]).stdout.split()
    for run_id in sorted({r for r in listed if r.startswith(prefix)}):
        out[run_id] = lab.resources_with_labels(runner, {lab.RUN: run_id})
    temp = Path(tempfile.gettempdir())
    owners = {d: lab.dir_owner(d, PYTEST_DIR) for d in temp.glob(f"{PYTEST_DIR}*")}
    dirs = sorted(str(d) for d, owner in owners.items() if owner is not None and owner[0] in pids)
    if dirs:
        out["temp dirs"] = {"dirs": dirs}
    return out


def test_one_xdist_session_proves_packs_scopes_failures_and_custody(
    pytester: pytest.Pytester, runner: SubprocessRunner, docker_ready: None, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    broken = _mini_project(tmp_path / "broken", "SELECT 1;\nTHIS IS NOT SQL;\n")
    planted = f"pytest-plugin-it-{secrets.token_hex(5)}"
    pytester.makepyfile(_record=RECORD.format(records=str(records), planted=planted))
    pytester.makeconftest(INNER_CONFTEST.format(records=str(records)))
    pytester.makeini("[pytest]\nforge_profiles = extra\n")
    pytester.makepyfile(
        test_postgres_pack=f"""
import json, urllib.request
import pytest
from _record import record, mutate_after_baseline

@pytest.mark.forge(project={str(PG)!r}, task="read_widget", scope="session")
def test_postgres_pack(forge_stack):
    record("postgres_pack", forge_stack)
    with urllib.request.urlopen(forge_stack.url("widgets-api", 8000, "/widgets/1"), timeout=30) as r:
        assert json.load(r) == {{"id": 1, "name": "baseline"}}
    conn = forge_stack.client("app-db")  # closed when the test ends
    assert conn.execute("select name from widgets where id = 1").fetchone() == ("baseline",)
    assert forge_stack.url("app-db").startswith("postgresql://")
    assert forge_stack.stack is forge_stack.trial and forge_stack.stack.kind("app-db").name == "postgres"
    mutate_after_baseline(forge_stack, "pack")
""",
        test_session_scope=f"""
import pytest
from _record import record, mutate_after_baseline

@pytest.mark.forge(project={str(PG)!r}, task="read_widget", scope="session")
def test_session_scope(forge_stack):
    record("session_second", forge_stack)
    mutate_after_baseline(forge_stack, "second")
""",
        test_cache_pack=f"""
import json, urllib.request
import pytest
from _record import record

@pytest.mark.forge(project={str(CACHE)!r}, task="diagnose_stale_order")
def test_cache_pack(forge_stack):
    record("cache_pack", forge_stack)
    cached = json.loads(forge_stack.redis("redis").get("order:4021"))
    assert cached["status"] == "processing"
    # the kind's client and URL by the service alone, the same connection as the named forms
    assert json.loads(forge_stack.client("redis", decode_responses=True).get("order:4021")) == cached
    assert forge_stack.url("redis") == forge_stack.redis_url("redis")
    with urllib.request.urlopen(forge_stack.url("orders-api", 8000, "/orders/4021/source"), timeout=30) as r:
        assert json.load(r)["status"] == "shipped"
""",
        test_endpoint_pack=f"""
import pytest
from _record import record

@pytest.mark.forge(project={str(ENDPOINT)!r}, task="add_summary_endpoint")
def test_endpoint_pack(forge_stack):
    record("endpoint_pack", forge_stack)
    seeded = forge_stack.exec("runner", ["cat", "/work/app.py"]).stdout
    assert "def " in seeded and "summary" not in seeded
""",
        test_module_scope=f"""
import pytest
from _record import record, mutate_after_baseline

pytestmark = pytest.mark.forge(project={str(PG)!r}, task="read_widget", scope="module")

def test_first_mutates(forge_stack):
    record("module_first", forge_stack)
    mutate_after_baseline(forge_stack, "first")

def test_second_mutates(forge_stack):
    record("module_second", forge_stack)
    mutate_after_baseline(forge_stack, "second")

def test_fails_with_logs(forge_stack):
    record("module_failing", forge_stack)
    assert forge_stack.exec("app-db", ["echo", "observed"]).stdout.strip() == "expected"
""",
        test_profiles=f"""
import pytest
from _record import record

# The ini's forge_profiles (written below) enables `extra`: the byo fixture's `probe` service runs only then.
@pytest.mark.forge(project={str(BYO)!r}, task="byo")
def test_profiles(forge_stack):
    record("profiles", forge_stack)
    assert "probe" in forge_stack.services
    assert forge_stack.exec("probe", ["cat", "/tmp/profile"]).stdout == "on"
""",
        test_broken_seed=f"""
import pytest

@pytest.mark.forge(project={str(broken)!r})
def test_broken_seed(forge_stack):
    raise AssertionError("never runs: the stack cannot be provisioned")
""",
    )
    uid = secrets.token_hex(8)
    _plant_dead_owners_leftover(runner, planted)
    try:
        result = pytester.runpytest_subprocess(
            "-n", "2", f"--testrunuid={uid}", "-p", "no:cacheprovider", "-rA",
            timeout=SESSION_TIMEOUT,
        )  # fmt: skip
    finally:
        runner.run(["docker", "rm", "-f", f"{planted}-c"], timeout=60, check=False)
    out = result.stdout.str()
    result.assert_outcomes(passed=7, failed=1, errors=1)
    seen = _records(records)

    # The reaper ran before any test: the planted leftover was gone for every one of them. It ran in the
    # controller (the workers' notes reach its summary too), so at most once; on a shared engine another
    # forge process's reaper may remove the leftover first, so its note is not required here (the unit
    # test proves the controller alone reaps, with a recorder in place of the reaper).
    assert all(rec["planted_left"] == 0 for rec in seen.values()), seen
    assert out.count("forge: removed leftovers of dead forge processes") <= 1, out
    assert out.count(f"{planted}-stack") <= 1, out

    # Each reference pack provisioned and answered on its real clients.
    for name in ("postgres_pack", "cache_pack", "endpoint_pack", "profiles"):
        assert name in seen, out
    # One stack for the module's three tests, reset in place between them (both mutators saw the baseline).
    module = {seen[n]["stack"] for n in ("module_first", "module_second", "module_failing")}
    assert len(module) == 1, seen
    # One stack for the session's two tests in two modules, reset in place between them; not the module's.
    session = {seen[n]["stack"] for n in ("postgres_pack", "session_second")}
    assert len(session) == 1 and session != module, seen
    assert "replaces a stack not proven clean" not in out, out
    # Run ids name the worker; both workers made stacks, each labelled with its worker's run id.
    for rec in seen.values():
        assert rec["run_id"] == f"pytest-{uid[:8]}-{rec['worker']}", rec
        assert rec["labelled_containers"], rec
    assert {rec["worker"] for rec in seen.values()} == {"gw0", "gw1"}, seen

    # The failing assertion's report carries every service's log tail.
    failing = out[out.index("test_fails_with_logs") :]
    for service in ("app-db", "widgets-api", "runner"):
        assert f"forge log: {service}" in failing, out
    assert "database system is ready to accept connections" in failing, out

    # The broken seed: an error (not a failure) whose message is forge's reason line, no traceback.
    reason = (
        "provisioning failed at reset_recipe: reset recipe for service 'db' (seed 'seed', kind 'sql_dump') "
        "failed: psql step on service 'db': "
    )
    assert re.search(r"ERROR at setup of test_broken_seed", out), out
    error = out[out.index("ERROR at setup of test_broken_seed") :]
    error = error[: error.index("forge log: db")]
    message = [line for line in error.splitlines()[1:] if not line.startswith("[gw")]  # xdist's host line
    assert message[0].startswith(reason), error
    assert 'syntax error at or near "THIS"' in error, error
    assert "Traceback" not in error and "def test_broken_seed" not in error, error

    pids = {int(str(rec["pid"])) for rec in seen.values()} | {int((records / "controller.pid").read_text())}
    assert _leftovers(runner, uid, pids) == {}


def _wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen[str], timeout: float) -> None:
    """Poll ``condition`` (an observable state, not a duration) until true; fail early if pytest ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"pytest exited (rc={proc.returncode}) before {what}\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_killed_worker_and_ctrl_c_leave_nothing(
    pytester: pytest.Pytester, runner: SubprocessRunner, docker_ready: None, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    release = tmp_path / "never-created"  # the inner tests wait for it: only a signal ends them
    mini = _mini_project(tmp_path / "mini", "CREATE TABLE t (x int);\n")
    pytester.makepyfile(_record=RECORD.format(records=str(records), planted=""))
    body = f"""
import time
from pathlib import Path
import pytest
from _record import record

@pytest.mark.forge(project={str(mini)!r})
def test_held(forge_stack):
    record(NAME, forge_stack)
    deadline = time.monotonic() + 600
    while not Path({str(release)!r}).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
"""
    pytester.makepyfile(
        test_killed=body.replace("NAME", "'killed'"), test_interrupted=body.replace("NAME", "'interrupted'")
    )
    uid = secrets.token_hex(8)
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", f"--testrunuid={uid}"]
    argv += ["--max-worker-restart=0", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.Popen(
        argv, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: the Ctrl-C below reaches pytest and its workers
    )  # fmt: skip
    try:
        _wait_for(lambda: len(_records(records)) == 2, "both stacks to be up", proc, SESSION_TIMEOUT)
        seen = _records(records)
        killed = seen["killed"]
        os.kill(int(str(killed["pid"])), signal.SIGKILL)
        # The controller notices the dead worker and reaps its run (its owner pid is provably gone).
        _wait_for(
            lambda: lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: str(killed["run_id"])})),
            "the killed worker's stack to be reaped",
            proc,
            SESSION_TIMEOUT,
        )
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = proc.communicate(timeout=SESSION_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, f"{out}\n{err}"
    pids = {proc.pid} | {int(str(rec["pid"])) for rec in seen.values()}
    assert _leftovers(runner, uid, pids) == {}, f"{out}\n{err}"
