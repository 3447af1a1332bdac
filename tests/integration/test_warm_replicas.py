"""A warm stack's ephemeral service of several replicas: spares stand for one container per service, so
its containers are recreated by compose every trial — every replica new, the run saying so once (an event,
a line), not a spare attempt that fails (and warns) on every trial."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.stacks import IDLE, TIMEOUTS, make_project

from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner
from forgelib.spec import models as m
from forgelib.stacks.provision import StackContext
from forgelib.stacks.warm import WarmPool

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

REPO = Path(__file__).resolve().parents[2]
WEB: dict[str, Any] = {**IDLE, "deploy": {"replicas": 2}}


def _web(runner: SubprocessRunner, project: str) -> dict[str, str]:
    """id -> state of every container of the stack's `web` service."""
    fmt = "{{.ID}} {{.State}}"
    argv = ["docker", "ps", "--all", "--no-trunc", "--format", fmt]
    argv += lab.filters({lab.COMPOSE_PROJECT: project, lab.COMPOSE_SERVICE: "web"})
    rows = runner.run(argv, timeout=30).stdout.split("\n")
    return dict(r.split(" ", 1) for r in rows if r)


def test_every_replica_is_new_every_trial(tmp_path: Path, runner: SubprocessRunner, run_id: str) -> None:
    project = make_project(tmp_path / "p", {"web": WEB}, name="warmreplicas")
    task = m.Task("t", tmp_path / "p" / "task.yaml", "", project.environment)
    pool = WarmPool(StackContext(project, TIMEOUTS, runner), workers=1)
    before: set[str] = set()
    said = []
    try:
        for i in range(3):
            trial = pool.acquire(task, run_id=run_id, trial_dir=tmp_path / f"t{i}")
            try:
                web = _web(runner, trial.name)
                # both replicas running, none of them a container an earlier trial had, nothing else left
                assert sorted(web.values()) == ["running", "running"] and not set(web) & before, (i, web)
                before |= set(web)
                said.append(trial.source.get("ephemeral_recreated"))
                assert trial.source["reuse"] == i
            finally:
                pool.release(trial)
    finally:
        pool.close()
    assert said[0] and "web (2 replicas)" in said[0] and said[1:] == [None, None], said  # once per run


def test_a_warm_run_records_the_recreate_path_once_and_warns_no_trial(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    pack = tmp_path / "pack"
    subprocess.run(["cp", "-r", str(REPO / "tests/fixtures/run_project"), str(pack)], check=True)
    compose = pack / "shared" / "compose.yaml"
    doc = yaml.safe_load(compose.read_text())
    doc["services"]["web"] = WEB
    compose.write_text(yaml.safe_dump(doc))
    config = pack / "run_configs" / "warm.yaml"
    cfg = {"project": "..", "tasks": ["write_file"], "repeats": 3, "stacks": "warm"}
    config.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "forge.log"
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", "run", "--config", str(config), "--output",
         str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "FORGE_LOG": str(log)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    slower = [e for e in events if e["kind"] == "warm_ephemeral_recreated"]
    assert len(slower) == 1 and "web (2 replicas)" in slower[0]["reason"], slower
    assert res.stderr.count("web (2 replicas)") == 1
    assert "unusable" not in log.read_text()  # no spare tried (and failed) per trial
    trials = [yaml.safe_load((run_dir / f"trials/write_file/{i}/trial.yaml").read_text()) for i in range(3)]
    assert [t["stack"]["reuse"] for t in trials] == [0, 1, 2]


def test_a_service_on_its_images_volume_gets_a_new_container_and_volume_every_trial(
    tmp_path: Path, runner: SubprocessRunner, run_id: str
) -> None:
    """An ephemeral service whose image declares a VOLUME (redis's /data: an anonymous volume of each
    container's own, carrying the run's labels) beside another ephemeral one: both successors are made
    while the trial before runs. Every trial finds a new container of each, a new, labelled volume at
    /data, empty, and nothing is left once the pool is closed."""
    cache = {"image": "forgelib/redis:7.0", "command": ["redis-server", "--save", ""]}
    cache["healthcheck"] = {"test": ["CMD", "redis-cli", "ping"], "interval": "1s", "retries": 30}
    project = make_project(tmp_path / "p", {"cache": cache, "idle": IDLE}, name="warmimagevol")
    task = m.Task("t", tmp_path / "p" / "task.yaml", "", project.environment)
    pool = WarmPool(StackContext(project, TIMEOUTS, runner), workers=1)
    containers: set[str] = set()
    volumes: set[str] = set()
    try:
        for i in range(3):
            trial = pool.acquire(task, run_id=run_id, trial_dir=tmp_path / f"t{i}")
            try:
                assert trial.source["reuse"] == i
                info = json.loads(
                    runner.run(["docker", "inspect", trial.compose.container("cache")], timeout=30).stdout
                )[0]
                (vol,) = [str(mt["Name"]) for mt in info["Mounts"] if mt["Destination"] == "/data"]
                assert info["Id"] not in containers, (i, info["Id"])
                assert vol not in volumes, (i, vol)
                containers.add(info["Id"])
                volumes.add(vol)
                labelled = lab.resources_with_labels(runner, {lab.RUN: run_id})["volumes"]
                assert vol in labelled, (i, vol, labelled)  # label queries (leak checks, reap) see it
                seen = trial.compose.exec("cache", ["ls", "-A", "/data"], timeout=30).stdout.split()
                assert seen == [], (i, seen)  # what the trial before left there is gone
                trial.compose.exec("cache", ["sh", "-c", f"echo {i} > /data/left-by-{i}"], timeout=30)
                idle = json.loads(
                    runner.run(["docker", "inspect", trial.compose.container("idle")], timeout=30).stdout
                )[0]
                assert idle["State"]["Status"] == "running" and idle["Id"] not in containers, (i, idle["Id"])
                containers.add(idle["Id"])
            finally:
                pool.release(trial)
    finally:
        pool.close()
    names = runner.run(["docker", "volume", "ls", "-q"], timeout=30).stdout.split()
    assert not set(names) & volumes, "a trial's image volume outlived the pool"
