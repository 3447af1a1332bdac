"""Ctrl-C during a warm run on the real engine: the stack being reused (registered both as the trial's and
as the pool's) is torn down like a fresh one, the run exits 130 with the interruption on record, and
nothing labelled with the run is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.interrupt import finished_interrupted, progress_until

from forgelib.docker import labels as lab
from forgelib.run.events import EVENTS_FILE, STACK_ACQUIRED, read_events
from forgelib.runner import SubprocessRunner
from forgelib.stacks import reaper

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


CACHE = {"image": "forgelib/redis:7.0", "command": ["redis-server", "--save", ""]}


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_a_warm_run_cut_short_leaves_none_of_its_ephemeral_image_volumes(
    how: str, docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """An ephemeral service whose image declares a VOLUME (redis's /data): each of its containers, the
    running one and its precreated successor, has an anonymous volume of its own, labelled with the run.
    After Ctrl-C the run removes every one; after SIGKILL of forge and the commands it runs, the reaper
    does. Checked by name too, not only by label."""
    pack = tmp_path / "pack"
    subprocess.run(["cp", "-r", str(DEV.parents[1]), str(pack)], check=True)
    compose = pack / "shared" / "compose.yaml"
    doc = yaml.safe_load(compose.read_text())
    doc["services"]["cache"] = CACHE
    compose.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(pack / "run_configs" / "dev.yaml")]
    argv += ["--stacks", "warm", "--repeats", "3", "--json", "--output", str(tmp_path / "runs")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_id = ""
    mounted: set[str] = set()
    try:
        run_id, _ = progress_until(proc, "write_file[1] solve", timeout=300)
        mounted = _volumes_of_caches(runner, run_id)
        assert mounted, "the cache's container mounts a volume at /data"
        for vol in mounted:  # each carries the run's label (one the pool removed meanwhile: gone, fine)
            res = runner.run(["docker", "volume", "inspect", vol], timeout=30, check=False)
            labels = json.loads(res.stdout)[0]["Labels"] if res.rc == 0 else {lab.RUN: run_id}
            assert labels.get(lab.RUN) == run_id, (vol, labels)
        if how == "SIGINT":
            proc.send_signal(signal.SIGINT)
            finished_interrupted(proc, runner, tmp_path / "runs", run_id)
        else:
            for pid in [proc.pid, *_children(proc.pid)]:
                os.kill(pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            report = reaper.reap(runner, run_id=run_id)
            assert report.outcomes and all(o.code == "owner_gone" for o in report.outcomes), report.outcomes
            assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if run_id:
            reaper.reap(runner, run_id=run_id)
        raise
    existing = set(runner.run(["docker", "volume", "ls", "-q"], timeout=30).stdout.split())
    assert not mounted & existing, f"left: {mounted & existing}"


def _volumes_of_caches(runner: SubprocessRunner, run_id: str) -> set[str]:
    """The names of the volumes every container of the run's `cache` service mounts (any state)."""
    argv = ["docker", "ps", "-a", "-q", *lab.filters({lab.RUN: run_id, lab.COMPOSE_SERVICE: "cache"})]
    ids = runner.run(argv, timeout=30).stdout.split()
    # One the pool removes meanwhile (the last trial's) is left out: inspect prints the others'.
    res = runner.run(["docker", "inspect", *ids], timeout=30, check=False) if ids else None
    infos = json.loads(res.stdout or "[]") if res is not None else []
    return {str(mt["Name"]) for i in infos for mt in i["Mounts"] if mt["Type"] == "volume"}


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (the runner starts each in its own session, so no group kill)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []
