"""Ctrl-C during a warm run on the real engine: the stack being reused (registered both as the trial's and
as the pool's) is torn down like a fresh one, the run exits 130 with the interruption on record, and
nothing labelled with the run is left."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.interrupt import finished_interrupted, progress_until

from forgelib.docker import labels as lab
from forgelib.run.events import EVENTS_FILE, STACK_ACQUIRED, read_events
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration

DEV = Path(__file__).resolve().parents[1] / "fixtures" / "run_project" / "run_configs" / "dev.yaml"


def test_sigint_on_a_reused_warm_stack_removes_everything(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(DEV), "--stacks", "warm"]
    argv += ["--repeats", "3", "--json", "--output", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until trial 1 is solving (its oracle): it runs on the stack trial 0 left, reset in place
        # when trial 0 gave it back (off trial 1's path, so not among its progress lines).
        run_id, lines = progress_until(proc, "write_file[1] solve", timeout=300)
        events = read_events(tmp_path / run_id / EVENTS_FILE)
        got = [e for e in events if e.get("kind") == STACK_ACQUIRED and e.get("index") == 1]
        assert [e["decision"] for e in got] == ["reuse"] and got[0]["reset_ahead"] > 0, (got, "".join(lines))
        assert not lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
        proc.send_signal(signal.SIGINT)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    finished_interrupted(proc, runner, tmp_path, run_id)


def test_a_supervised_server_stops_with_its_container_and_ends_it_on_its_own(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    """Under forge's loop (a fresh stack runs it too): ``docker stop`` reaches the server through the loop,
    which exits with the server's status (0, not the 137 of the stop timeout's SIGKILL); a server that
    ends on its own ends its container, with its status."""
    from support.stacks import PG, make_project, provision

    from forgelib.spec.models import SeedKind
    from forgelib.stacks.provision import teardown_trial

    (tmp_path / "seed.sql").write_text("create table t (v text);\n")
    seeds = {"sql": (tmp_path / "seed.sql", SeedKind.SQL_DUMP)}
    project = make_project(tmp_path / "p", {"db": PG}, seeds=seeds, reset={"db": "sql"})
    trial = provision(project, run_id, tmp_path, runner)
    try:
        db = trial.compose.container("db")
        pid1 = runner.run(["docker", "exec", db, "cat", "/proc/1/cmdline"]).stdout
        assert "forge-supervise" in pid1
        runner.run(["docker", "stop", "--time", "120", db], timeout=180)
        state = runner.run(["docker", "inspect", "--format", "{{.State.ExitCode}}", db]).stdout.strip()
        assert state == "0", f"the server did not stop on the forwarded signal (exit {state})"
        runner.run(["docker", "start", db])
        # the server alone (not the container) stops: postgres's fast shutdown, from its pid file
        pidfile = "$PGDATA/postmaster.pid"
        stop = f"until [ -s {pidfile} ]; do sleep 0.1; done; kill -INT $(head -1 {pidfile})"
        runner.run(["docker", "exec", "--user", "postgres", db, "sh", "-c", stop])
        assert runner.run(["docker", "wait", db], timeout=120).stdout.strip() == "0"
    finally:
        teardown_trial(trial)
