"""The reaper on a real engine: labelled leftovers of a dead owner go, an alive / foreign-host owner's stay.

Every stack here carries a run id unique to this test (``custody-it-<hex>``) and every reap is scoped to it
with ``run_id=``, so nothing another engineer (or test) has running on this engine is ever looked at.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from support.owners import dead_pid

from forgelib.docker.builds import built_images
from forgelib.docker.compose import clean_env, labels_override, write_override
from forgelib.docker.labels import (
    COMPOSE_SERVICE,
    RUN,
    WORK_DIR,
    Owner,
    current_owner,
    filters,
    is_empty,
    resources_with_labels,
    run_labels,
)
from forgelib.runner import SubprocessRunner
from forgelib.stacks import reaper as custody

# engine_alone: this file plants stacks of dead owners that any other forge process would reap first
# (noxfile runs it after the parallel files).
pytestmark = [pytest.mark.integration, pytest.mark.engine_alone]

COMPOSE = {
    "services": {
        "cache": {
            "image": "forgelib/redis:7.0",
            "command": ["redis-server", "--save", ""],
            "volumes": ["data:/data"],
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "1s", "retries": 30},
        }
    },
    "volumes": {"data": {}},
}

Up = Callable[..., str]


def _run_id() -> str:
    return f"custody-it-{uuid.uuid4().hex[:10]}"


def _purge(runner: SubprocessRunner, run_id: str) -> None:
    """Remove whatever is left with this test's run id (only ever this test's own resources)."""
    flt = filters({RUN: run_id})
    ids = runner.run(["docker", "ps", "-aq", *flt], timeout=60).stdout.split()
    if ids:
        runner.run(["docker", "rm", "-f", "-v", *ids], timeout=120, check=False)
    for kind in ("network", "volume"):
        names = runner.run(["docker", kind, "ls", "-q", *flt], timeout=60).stdout.split()
        if names:
            runner.run(["docker", kind, "rm", *names], timeout=60, check=False)


@pytest.fixture
def leftovers(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> Iterator[tuple[str, Up]]:
    """(run id, up) where ``up(name, owner)`` brings up a labelled one-service stack and returns its name."""
    run_id = _run_id()

    def up(suffix: str, owner: Owner, trial: str = "t.0") -> str:
        name = f"{run_id}-{suffix}"
        d = tmp_path / name
        d.mkdir()
        compose = d / "compose.yaml"
        compose.write_text(yaml.safe_dump(COMPOSE))
        doc = labels_override(COMPOSE, run_labels(run_id, trial, owner))
        override = write_override(d / "override.yaml", doc)
        files = ["-f", str(compose), "-f", str(override)]
        runner.run(
            ["docker", "compose", "--ansi", "never", "-p", name, *files, "up", "--detach", "--wait"],
            timeout=120,
            env=clean_env(),
            cwd=d,
        )
        return name

    yield run_id, up
    _purge(runner, run_id)


def _left(runner: SubprocessRunner, run_id: str) -> dict[str, list[str]]:
    return resources_with_labels(runner, {RUN: run_id})


def test_dead_owner_is_reaped_alive_and_foreign_host_are_kept(
    leftovers: tuple[str, Up], runner: SubprocessRunner
) -> None:
    run_id, up = leftovers
    me = current_owner()
    pid, start = dead_pid()
    dead = up("dead", Owner(me.host, pid, me.boot_id, start), "t.0")
    alive = up("alive", me, "t.1")
    other = up("other", Owner("some-other-host", pid, me.boot_id, start), "t.2")
    before = _left(runner, run_id)
    assert len(before["containers"]) == 3 and len(before["volumes"]) == 3 and len(before["networks"]) == 3

    dry = custody.reap(runner, run_id=run_id, dry_run=True)
    assert {o.project: o.action for o in dry.outcomes} == {dead: "would remove", alive: "kept", other: "kept"}
    assert _left(runner, run_id) == before

    report = custody.reap(runner, run_id=run_id)
    by = {o.project: o for o in report.outcomes}
    assert by[dead].action == "removed" and by[dead].code == "owner_gone", by[dead]
    assert sorted(r.split()[0] for r in by[dead].removed) == ["container", "network", "volume"]
    assert by[alive].action == "kept" and by[alive].code == "owner_alive"
    assert by[other].action == "kept" and by[other].code == "other_host"

    left = _left(runner, run_id)
    assert not any(dead in n for names in left.values() for n in names)
    assert len(left["containers"]) == 2 and len(left["volumes"]) == 2 and len(left["networks"]) == 2
    # the kept stacks are untouched: still running
    running = runner.run(["docker", "ps", "-q", *filters({RUN: run_id})], timeout=30).stdout
    assert len(running.split()) == 2


def test_reused_pid_counts_as_gone(leftovers: tuple[str, Up], runner: SubprocessRunner) -> None:
    run_id, up = leftovers
    me = current_owner()
    # this very pid, but a start time it never had: the labelled owner exited and the pid was reused
    up("reused", Owner(me.host, me.pid, me.boot_id, str(int(me.start_time) - 1)))
    (o,) = custody.reap(runner, run_id=run_id).outcomes
    assert o.action == "removed" and "reused" in o.reason
    assert is_empty(_left(runner, run_id))


def test_foreign_container_on_our_network_keeps_the_network(
    leftovers: tuple[str, Up], runner: SubprocessRunner
) -> None:
    run_id, up = leftovers
    me = current_owner()
    pid, start = dead_pid()
    name = up("shared-net", Owner(me.host, pid, me.boot_id, start))
    network = f"{name}_default"
    # someone else's container on our network: carries our run id only so this test can clean it up
    foreign = runner.run(
        ["docker", "run", "-d", "--network", network, "--label", f"{RUN}={run_id}", "forgelib/redis:7.0"],
        timeout=60,
    ).stdout.strip()

    (o,) = custody.reap(runner, run_id=run_id).outcomes
    assert o.code == "owner_gone"
    assert o.removed == [f"container {name}-cache-1", f"volume {name}_data"]
    assert len(o.kept) == 1 and o.kept[0].startswith(f"network {network}: containers not ours")
    left = _left(runner, run_id)
    assert left["networks"] == [network] and left["volumes"] == []
    state = runner.run(["docker", "inspect", "-f", "{{.State.Running}}", foreign], timeout=30).stdout
    assert state.strip() == "true"  # never touched


def test_forge_reap_cli_json(leftovers: tuple[str, Up], runner: SubprocessRunner) -> None:
    run_id, up = leftovers
    me = current_owner()
    pid, start = dead_pid()
    dead = up("cli", Owner(me.host, pid, me.boot_id, start))
    out = subprocess.run(
        [sys.executable, "-m", "forgelib", "reap", "--run", run_id, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["removed"] == 1 and data["projects"][0]["project"] == dead
    assert is_empty(_left(runner, run_id))
    table = subprocess.run(
        [sys.executable, "-m", "forgelib", "reap", "--run", run_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.returncode == 0 and "no forgelib-labelled" in table.stdout


# A `forge provision` that builds an image and then waits forever in `up --wait` (a service that never gets
# healthy): killed there, it leaves a stack, its built image and its work directory.
PACK = {
    "compose.yaml": yaml.safe_dump(
        {
            "services": {
                "tool": {"build": "./tool", "command": ["sleep", "infinity"], "init": True},
                "stuck": {
                    "image": "forgelib/redis:7.0",
                    "healthcheck": {"test": ["CMD", "false"], "interval": "1s", "retries": 10000},
                },
            }
        }
    ),
    "tool/Dockerfile": "FROM forgelib/debian:bookworm\nCOPY Dockerfile /built-for-the-trial\n",
    "project.yaml": yaml.safe_dump(
        {
            "name": "itkilled",
            "description": "forge provision SIGKILLed mid-way",
            "default_environment": {
                "compose_file": "compose.yaml",
                "services": {"tool": {"isolation": "ephemeral"}, "stuck": {"isolation": "ephemeral"}},
            },
        }
    ),
}


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (the runner starts each in its own session, so no group kill)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_sigkilled_forge_provision_leaves_stack_image_and_dir_that_the_reaper_removes(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    for rel, text in PACK.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    argv = [sys.executable, "-m", "forgelib", "provision", "--project", str(tmp_path)]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mine = {"io.forgelib.owner.pid": str(child.pid)}
    run_id = ""
    try:
        # up: the stuck service's container exists (so the image was built and the override written)
        flt = _flt(mine, stuck=True)
        for _ in range(600):
            found = runner.run(["docker", "ps", "-a", "-q", *flt], timeout=30).stdout.split()
            if found or child.poll() is not None:
                break
            child_wait(child, 0.5)
        assert found, f"forge provision ended early: {child.communicate()[1]}"
        run_id, work_dir = _label(runner, found[0], RUN), Path(_label(runner, found[0], WORK_DIR))
        assert work_dir.is_dir() and (work_dir / "compose.forge.yaml").exists()
        kept = custody.reap(runner, run_id=run_id)  # the owner is alive: kept
        assert [o.code for o in kept.outcomes] == ["owner_alive"]

        doomed = [child.pid, *_children(child.pid)]  # forge, and the `compose up --wait` it waits on
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        child.wait(timeout=30)
        before = _left(runner, run_id)
        assert len(before["containers"]) == 2 and _built(runner, run_id)  # SIGKILL leaves all of it...

        report = custody.reap(runner, run_id=run_id)  # ...that the reaper removes: stack, image, directory
        (o,) = report.outcomes
        assert (o.action, o.code) == ("removed", "owner_gone"), o
        assert f"directory {work_dir}" in o.removed and any(r.startswith("image built ") for r in o.removed)
        assert is_empty(_left(runner, run_id)) and not _built(runner, run_id) and not work_dir.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        assert child.stderr is not None
        child.stderr.close()
        if run_id:
            _purge(runner, run_id)
            for image in _built(runner, run_id):
                runner.run(["docker", "image", "rm", "-f", image], timeout=60, check=False)


def _flt(labels: dict[str, str], *, stuck: bool = False) -> list[str]:
    return filters({**labels, **({COMPOSE_SERVICE: "stuck"} if stuck else {})})


def _built(runner: SubprocessRunner, run_id: str) -> list[str]:
    return built_images(runner, {RUN: run_id})


def child_wait(child: subprocess.Popen[str], seconds: float) -> None:
    """Wait for ``child`` to exit, at most ``seconds`` (the poll interval of a condition, not a sync)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=seconds)


def _label(runner: SubprocessRunner, container: str, key: str) -> str:
    fmt = f'{{{{index .Config.Labels "{key}"}}}}'
    return runner.run(["docker", "inspect", "-f", fmt, container], timeout=30).stdout.strip()
