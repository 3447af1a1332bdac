"""Fault injection on a real engine: each fault gives the named stage and error, the right trial accounting,
and leaves **zero** containers, networks and volumes carrying the run's labels.

Provisioning faults run in-process through ``run_project`` with the real ``DockerBackend`` (so a fault can be
injected between loading the project and provisioning it); the signal faults run ``forge run`` as a child
process and deliver SIGINT at the named moment.

Not here: the Docker daemon stopped mid-run — stopping the shared engine would break every other test and
engineer using it; it needs a dedicated engine (a CI job of its own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.interrupt import finished_interrupted, progress_until
from support.stacks import PG, REDIS, RUNNER

from forgelib.cli.run import build_plan
from forgelib.docker.labels import RUN, is_empty, resources_with_labels
from forgelib.run.events import EVENTS_FILE, RunState, read_events, summarize
from forgelib.run.execute import run_project
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.loader import load_project_config, load_run_config
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import DockerBackend
from forgelib.stacks import reaper as custody
from forgelib.stacks.provision import StackContext

# engine_alone: this file stops and restarts dockerd and takes every address pool (noxfile runs it after
# the parallel files).
pytestmark = [pytest.mark.integration, pytest.mark.engine_alone]

# The run config's `timeouts:` (a mapping, written to YAML), not stacks.TIMEOUTS: a run has oracle and
# grading phases too.
RUN_TIMEOUTS = {"compose_up": 90, "recipe": 60, "oracle": 60, "grading": 30, "teardown": 60, "command": 30}
ORACLE_OK = ["sh", "-c", "echo done > /work/out.txt"]


def make_pack(
    root: Path,
    services: Mapping[str, Any],
    *,
    seeds: Mapping[str, tuple[str, SeedKind, bytes | Mapping[str, str]]] = {},
    resets: Mapping[str, str] = {},
    oracle: list[str] | None = None,
    timeouts: Mapping[str, float] = RUN_TIMEOUTS,
) -> Path:
    """A one-task pack on disk; returns its run config.

    ``seeds``: name -> (path, kind, bytes or {file: text}); ``resets``: service -> seed name."""
    root.mkdir(parents=True)
    seed_specs = {}
    for name, (rel, kind, content) in seeds.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.mkdir()
            for f, text in content.items():
                (path / f).write_text(text)
        seed_specs[name] = {"path": rel, "kind": kind.value, "digest": seed_digest(path, kind)}
    all_services = {**services, "runner": RUNNER}
    (root / "compose.yaml").write_text(yaml.safe_dump({"services": all_services}))
    project = {
        "name": "faults",
        "assets": {"seeds": seed_specs},
        "default_environment": {
            "compose_file": "compose.yaml",
            "services": {svc: {"isolation": "reset", "reset": {"seed": s}} for svc, s in resets.items()},
        },
    }
    (root / "project.yaml").write_text(yaml.safe_dump(project))
    task = root / "tasks" / "t"
    task.mkdir(parents=True)
    (task / "task.yaml").write_text(
        yaml.safe_dump({"name": "t", "oracle": {"service": "runner", "command": oracle or ORACLE_OK}})
    )
    check = {"name": "out", "file": {"service": "runner", "path": "/work/out.txt", "contains": "done"}}
    (task / "grading.yaml").write_text(yaml.safe_dump({"threshold": 1.0, "checks": [check]}))
    cfg = root / "run_configs" / "dev.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        yaml.safe_dump({"project": "..", "repeats": 1, "output": "../runs", "timeouts": dict(timeouts)})
    )
    return cfg


def run_in_process(cfg: Path, mutate: Callable[[Project], Project] | None = None) -> tuple[Path, RunState]:
    config = load_run_config(cfg)
    project = load_project_config(config.project)
    if mutate is not None:
        project = mutate(project)
    plan = build_plan(config, project)
    runner = SubprocessRunner(default_timeout=config.timeouts.command)
    backend = DockerBackend(StackContext(project, config.timeouts, runner))
    return run_project(plan, backend, lambda line: None)


def assert_provision_failure(
    runner: SubprocessRunner, run_dir: Path, state: RunState, stage: str, *reason_parts: str
) -> str:
    """The accounting of a provisioning failure, zero leftovers; returns the trial's reason."""
    summary = summarize(state)
    tot = summary["totals"]
    assert (tot["trials"], tot["passed"], tot["failed"], tot["failed_attempts"]) == (1, 0, 1, 1), summary
    assert tot["errors_by_stage"] == {stage: 1}
    (trial,) = summary["trials"]
    assert trial["termination_reason"] == "PROVISION_ERROR" and trial["retryable"] is False
    assert trial["binary_pass"] is False and trial["score"] == 0.0
    (reason,) = trial["reasons"]
    assert reason.startswith(f"Provisioning failed at {stage}: "), reason
    for part in reason_parts:
        assert part in reason, reason
    phases = [e.get("phase") for e in read_events(run_dir / EVENTS_FILE)]
    assert "solve" not in phases, phases  # the oracle never ran
    assert_no_leftovers(runner, str(state.run_id))
    return reason


def assert_no_leftovers(runner: SubprocessRunner, run_id: str) -> None:
    left = resources_with_labels(runner, {RUN: run_id})
    assert is_empty(left), f"run {run_id} left {left}"


RECIPE = "reset recipe for service '{svc}' (seed '{seed}', kind '{kind}') failed: "


# ------------------------------------------------------------------------------------ provisioning faults


# A seed's own failure text per kind (SQL syntax error, corrupt or too-new RDB) is proven where the recipe
# runs (test_recipes.py), and a failing seed's run accounting by test_run.py's broken seed: not again here.


def _fs_pack(root: Path) -> Path:
    return make_pack(
        root,
        {"files": RUNNER},
        seeds={"tree": ("seeds/tree", SeedKind.FILESYSTEM_DIR, {"a.txt": "a\n", ".hidden": "h\n"})},
        resets={"files": "tree"},
    )


def test_filesystem_seed_replaced_by_a_file(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    cfg = _fs_pack(tmp_path / "p")
    tree = tmp_path / "p" / "seeds" / "tree"

    def replace(project: Project) -> Project:  # after the load verified it: swapped under our feet
        shutil.rmtree(tree)
        tree.write_text("not a directory\n")
        return project

    run_dir, state = run_in_process(cfg, replace)
    assert_provision_failure(
        runner, run_dir, state, "reset_recipe", RECIPE.format(svc="files", seed="tree", kind="filesystem_dir")
    )


def test_unknown_seed_name(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    cfg = _fs_pack(tmp_path / "p")  # the loader rejects unknown names; models built otherwise must too
    run_dir, state = run_in_process(cfg, lambda p: dataclasses.replace(p, seeds={}))
    reason = assert_provision_failure(runner, run_dir, state, "reset_recipe", "service 'files'", "'tree'")
    assert "no seed named 'tree'" in reason


def test_seed_edited_after_load(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    cfg = _fs_pack(tmp_path / "p")

    def edit(project: Project) -> Project:
        (tmp_path / "p" / "seeds" / "tree" / "a.txt").write_text("edited\n")
        return project

    run_dir, state = run_in_process(cfg, edit)
    reason = assert_provision_failure(
        runner, run_dir, state, "reset_recipe", RECIPE.format(svc="files", seed="tree", kind="filesystem_dir")
    )
    assert "changed since the project was loaded" in reason


def test_image_that_does_not_exist(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    ghost = {"image": "forgelib/no-such-image:0", "pull_policy": "missing"}
    cfg = make_pack(tmp_path / "p", {"ghost": ghost})
    run_dir, state = run_in_process(cfg)
    reason = assert_provision_failure(runner, run_dir, state, "compose_up")
    assert "no-such-image" in reason


def test_healthcheck_never_passes(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    sick = {**REDIS, "healthcheck": {"test": ["CMD", "false"], "interval": "1s", "retries": 2}}
    cfg = make_pack(tmp_path / "p", {"sick": sick})
    run_dir, state = run_in_process(cfg)
    reason = assert_provision_failure(runner, run_dir, state, "readiness")
    assert "sick" in reason


def test_hanging_recipe_times_out(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    cfg = make_pack(
        tmp_path / "p",
        {"db": PG},
        seeds={"slow": ("seeds/slow.sql", SeedKind.SQL_DUMP, b"SELECT pg_sleep(600);\n")},
        resets={"db": "slow"},
        timeouts={**RUN_TIMEOUTS, "recipe": 5},
    )
    run_dir, state = run_in_process(cfg)
    reason = assert_provision_failure(
        runner, run_dir, state, "reset_recipe", RECIPE.format(svc="db", seed="slow", kind="sql_dump")
    )
    assert "timed out after 5s" in reason  # the recipe's own timeout ended it (no wall-clock bound here)


# ---------------------------------------------------------------------------------------- SIGINT faults


def _forge_run(cfg: Path) -> subprocess.Popen[str]:
    """``forge run`` as a child, its debug log (every command it starts) next to the config."""
    return subprocess.Popen(
        [sys.executable, "-m", "forgelib", "run", "--config", str(cfg), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FORGE_LOG": str(_log(cfg))},
    )


def _log(cfg: Path) -> Path:
    return cfg.parent / "forge.log"


def _started(cfg: Path, *words: str, after: int = 0) -> int:
    """Block until the child's debug log records a command containing every one of ``words`` (the runner
    logs each command as it starts it), past the first ``after`` lines; that line's number. A condition,
    not a guess at how long the child takes (bounded at 180 s)."""
    deadline = time.monotonic() + 180
    while True:
        lines = _log(cfg).read_text().splitlines() if _log(cfg).exists() else []
        for i, line in enumerate(lines[after:], start=after):
            if " run " in line and all(w in line for w in words):
                return i + 1
        assert time.monotonic() < deadline, f"never started a command with {words}"
        time.sleep(0.05)


def _downs(cfg: Path) -> list[str]:
    """The `compose down` commands the child started, in order."""
    return [ln for ln in _log(cfg).read_text().splitlines() if " run docker compose" in ln and " down " in ln]


def _interrupt(
    runner: SubprocessRunner,
    proc: subprocess.Popen[str],
    run_id: str,
    run_dir: Path,
    *,
    signal_sent: bool = False,
) -> str:
    """SIGINT (unless sent already); then exit 130, the interruption on record, and nothing left with the
    run's labels. Returns stderr."""
    if not signal_sent:
        proc.send_signal(signal.SIGINT)
    return finished_interrupted(proc, runner, run_dir, run_id)


@pytest.mark.parametrize("moment", ["compose_up", "recipe", "oracle"])
def test_sigint(moment: str, docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    slow_sql = b"SELECT pg_sleep(600);\n" if moment == "recipe" else b"CREATE TABLE w (id int);\n"
    oracle = ["sh", "-c", "echo started; sleep 600"] if moment == "oracle" else None
    services: dict[str, Any] = {"db": PG}
    if moment == "compose_up":  # a service that takes its time to become healthy, after db is seeded
        services["slow"] = {
            **RUNNER,
            "healthcheck": {"test": ["CMD", "false"], "interval": "2s", "retries": 300},
        }
    cfg = make_pack(
        tmp_path / "p",
        services,
        seeds={"s": ("seeds/s.sql", SeedKind.SQL_DUMP, slow_sql)},
        resets={"db": "s"},
        oracle=oracle,
        timeouts={**RUN_TIMEOUTS, "compose_up": 600, "recipe": 600, "oracle": 600},
    )
    proc = _forge_run(cfg)
    run_id, _ = progress_until(proc, "run ")
    # the slow part has started: readiness probing `slow`'s healthcheck (forgelib.docker.readiness runs it
    # through `docker exec`) / psql sleeping / the oracle sleeping
    slow = {
        "compose_up": ("docker exec", " false"),
        "recipe": ("exec", "psql"),
        "oracle": ("exec", "sleep 600"),
    }
    _started(cfg, *slow[moment])
    live = resources_with_labels(runner, {RUN: run_id})
    assert live["containers"], f"nothing was up at {moment}"
    _interrupt(runner, proc, run_id, tmp_path / "p" / "runs")


# A service whose teardown takes its time: PID 1 ignores SIGTERM, so `down` waits out the grace period
# before it kills — unless the test releases it (a file in the pack's `release/`): then it exits at once,
# so a graceful `down` ends when the test says, not after the grace period.
STUBBORN: dict[str, Any] = {
    **RUNNER,
    "command": ["sh", "-c", "trap '' TERM; until [ -e /release/go ]; do sleep 0.1; done"],
    "volumes": ["./release:/release"],
    "stop_grace_period": "60s",
}
HURRIED = "--timeout 0"  # what a hurried `down` carries; a graceful one waits out the grace period


def test_second_sigint_during_the_stops_teardown_hurries_it(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """Ctrl-C in the oracle starts a graceful teardown (waiting on `stubborn`); a second Ctrl-C kills that
    `down` and redoes it without waits."""
    cfg = make_pack(tmp_path / "p", {"db": PG, "stubborn": STUBBORN}, oracle=["sh", "-c", "sleep 600"])
    (tmp_path / "p" / "release").mkdir()
    proc = _forge_run(cfg)
    run_id, _ = progress_until(proc, "run ")
    seen = _started(cfg, "exec", "sleep 600")
    proc.send_signal(signal.SIGINT)
    _started(cfg, " down ", after=seen)  # the stop's graceful teardown is under way...
    proc.send_signal(signal.SIGINT)  # ...and the second signal hurries it
    try:
        err = _interrupt(runner, proc, run_id, tmp_path / "p" / "runs", signal_sent=True)
    finally:  # should the assertion fail, the reaper (the owner is gone now) removes what the run left
        custody.reap(runner, run_id=run_id)
    assert "skipping graceful waits" in err
    downs = _downs(cfg)
    assert HURRIED not in downs[0] and HURRIED in downs[-1], downs  # graceful first, then redone hurried


@pytest.mark.parametrize("signals", [1, 2])
def test_sigint_during_teardown(
    signals: int, docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """One SIGINT during the trial's own teardown lets the graceful `down` finish (no hurried one); a
    second kills it and redoes it without waits. Both exit 130 with nothing left."""
    cfg = make_pack(tmp_path / "p", {"db": PG, "stubborn": STUBBORN})
    (tmp_path / "p" / "release").mkdir()
    proc = _forge_run(cfg)
    run_id, _ = progress_until(proc, "] teardown")
    _started(cfg, " down ")  # inside `down`, which waits on `stubborn`
    proc.send_signal(signal.SIGINT)
    progress_until(proc, "stopping; tearing down")  # the first signal was handled, with `down` still waiting
    if signals == 2:
        proc.send_signal(signal.SIGINT)
    else:
        (tmp_path / "p" / "release" / "go").touch()  # `stubborn` exits: the graceful down can finish
    try:
        err = _interrupt(runner, proc, run_id, tmp_path / "p" / "runs", signal_sent=True)
    finally:  # should the assertion fail, the reaper (the owner is gone now) removes what the run left
        custody.reap(runner, run_id=run_id)
    downs = _downs(cfg)
    if signals == 1:
        assert "skipping graceful waits" not in err
        assert len(downs) == 1 and HURRIED not in downs[0], downs  # the graceful down was left to finish
    else:
        assert "skipping graceful waits" in err
        assert HURRIED not in downs[0] and HURRIED in downs[-1], downs


# ------------------------------------------------------------------------------------ the daemon stopped


def _dockerd_pid(runner: SubprocessRunner) -> int:
    return int(runner.run(["pidof", "-s", "dockerd"], timeout=10).stdout.split()[0])


# Cases that disturb everything else on the engine (stop the daemon, take every address pool) run only
# where the tests own the engine: CI (.ci/run sets it), or a developer who opts in.
owns_engine = pytest.mark.skipif(
    os.environ.get("FORGE_TEST_OWNS_ENGINE") != "1",
    reason="disturbs everything else on this Docker engine: opt in with FORGE_TEST_OWNS_ENGINE=1 "
    "(.ci/run does)",
)


@owns_engine
def test_daemon_stopped_mid_run(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> None:
    """The engine dies during the oracle: forge fails the trial with the cause named (exit 1, no traceback,
    no hang); once the engine is back, the leftovers of the dead run are the reaper's to remove."""
    cfg = make_pack(tmp_path / "p", {"db": PG}, oracle=["sh", "-c", "sleep 600"])
    proc = _forge_run(cfg)
    run_id, _ = progress_until(proc, "] solve")
    time.sleep(1)
    try:
        os.kill(_dockerd_pid(runner), signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        runner.run(["bash", "scripts/engine.sh"], timeout=180)  # the engine back for everyone after us
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    summary = json.loads(out)
    (trial,) = summary["trials"]
    assert trial["status"] != "passed"
    assert trial["termination_reason"] in {"AGENT_ERROR", "ENGINE_LOST", "INTERNAL_ERROR"}
    trial_yaml = yaml.safe_load(
        (tmp_path / "p" / "runs" / run_id / "trials" / "t" / "0" / "trial.yaml").read_text()
    )
    assert "docker daemon" in (trial_yaml["teardown_error"] or "").lower(), trial_yaml
    report = custody.reap(runner, run_id=run_id)
    assert not report.failed, report.table()
    assert_no_leftovers(runner, run_id)


MAX_NETWORKS = 300


@owns_engine
def test_exhausted_address_pools_read_as_the_fix(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    """Every default address pool taken (leftovers, too many parallel trials): the trial fails at
    compose_up with what to do, not only Docker's words, and leaves nothing."""
    hog = f"forgetest-pool-{os.getpid()}"
    made: list[str] = []
    try:
        # Docker 20.10's defaults hold about 30 networks, scripts/engine.sh's pools 128.
        for i in range(MAX_NETWORKS):
            r = runner.run(
                ["docker", "network", "create", "--label", f"{hog}=1", f"{hog}-{i}"], timeout=30, check=False
            )
            if r.rc != 0:
                assert "address pool" in r.stderr, r.stderr
                break
            made.append(f"{hog}-{i}")
        else:
            pytest.fail(f"{MAX_NETWORKS} networks did not exhaust this engine's address pools")
        run_dir, state = run_in_process(make_pack(tmp_path / "p", {"db": PG}))
    finally:
        if made:
            runner.run(["docker", "network", "rm", *made], timeout=120)
    reason = assert_provision_failure(runner, run_dir, state, "compose_up")
    assert "Docker has no free network address pool left" in reason and "forge reap" in reason
