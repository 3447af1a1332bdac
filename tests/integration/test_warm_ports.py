"""A warm stack's ephemeral service that publishes a port gets a new container every trial, on a new host
port: what the trial is told (its ``ports``, trial.yaml's, and the address its HTTP checks and clients
resolve) must be the port of the container the trial actually runs on, never the first trial's."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.stacks import TIMEOUTS, make_project

from forgelib.runner import SubprocessRunner
from forgelib.spec import models as m
from forgelib.stacks.provision import StackContext
from forgelib.stacks.warm import WarmPool

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

REPO = Path(__file__).resolve().parents[2]

# Serves its own hostname (the container's short id) at /id on port 8000.
WEB: dict[str, Any] = {
    "image": "forgelib/python:3.11",
    "command": ["sh", "-c", "hostname > /tmp/id && exec python3 -m http.server -d /tmp 8000"],
    "ports": ["8000"],
    "healthcheck": {
        "test": ["CMD", "curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/id"],
        "interval": "1s",
        "retries": 30,
    },
}


def _docker_port(runner: SubprocessRunner, container: str) -> int:
    out = runner.run(["docker", "port", container, "8000/tcp"], timeout=30).stdout.split()
    return int(out[0].rpartition(":")[2])


def _served_id(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/id", timeout=10) as resp:
        return resp.read().decode().strip()


def test_every_warm_trial_is_told_the_port_of_the_container_it_runs_on(
    tmp_path: Path, runner: SubprocessRunner, run_id: str
) -> None:
    project = make_project(tmp_path / "p", {"web": WEB}, name="warmports")
    task = m.Task("t", tmp_path / "p" / "task.yaml", "", project.environment)
    pool = WarmPool(StackContext(project, TIMEOUTS, runner), workers=1)
    seen = []
    try:
        for i in range(3):  # a fresh stack, then two reuses: a new web container each time
            trial = pool.acquire(task, run_id=run_id, trial_dir=tmp_path / f"t{i}")
            try:
                container = trial.compose.container("web")
                live = _docker_port(runner, container)
                cid = json.loads(runner.run(["docker", "inspect", container], timeout=30).stdout)[0]["Id"]
                assert _served_id(live) == cid[:12]  # that port is this container's
                assert trial.ports["web"] == [f"127.0.0.1:{live}->8000/tcp"], (i, trial.ports)
                assert trial.compose.port("web", 8000) == ("127.0.0.1", live), i  # checks, clients
                seen.append((trial.source["reuse"], cid))
            finally:
                pool.release(trial)
    finally:
        pool.close()
    assert [r for r, _ in seen] == [0, 1, 2] and len({c for _, c in seen}) == 3, seen


def test_a_warm_run_records_and_checks_each_trials_own_port(tmp_path: Path, runner: SubprocessRunner) -> None:
    """`forge run --stacks warm --repeats 3`: the HTTP check of every trial reaches the web container the
    trial's oracle ran in, and trial.yaml records a port of its own for each trial."""
    pack = tmp_path / "pack"
    subprocess.run(["cp", "-r", str(REPO / "tests/fixtures/run_project"), str(pack)], check=True)
    compose = pack / "shared" / "compose.yaml"
    doc = yaml.safe_load(compose.read_text())
    doc["services"]["web"] = WEB
    compose.write_text(yaml.safe_dump(doc))
    task = pack / "tasks" / "web_port"
    task.mkdir()
    (task / "task.yaml").write_text(
        yaml.safe_dump({"oracle": {"service": "web", "command": ["cat", "/tmp/id"], "timeout": 60}})
    )
    http = {"service": "web", "port": 8000, "path": "/id", "status": 200}
    (task / "grading.yaml").write_text(yaml.safe_dump({"checks": [{"name": "web_id", "http": http}]}))
    config = pack / "run_configs" / "web.yaml"
    config.write_text(yaml.safe_dump({"project": "..", "tasks": ["web_port"], "repeats": 3, "stacks": "warm",
                                      "output": "../runs"}))  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", "run", "--config", str(config), "--output",
         str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    ports = []
    for i in range(3):
        d = run_dir / "trials" / "web_port" / str(i)
        trial = yaml.safe_load((d / "trial.yaml").read_text())
        grade = yaml.safe_load((d / "grade.yaml").read_text())
        assert trial["stack"]["reuse"] == i, trial["stack"]
        (check,) = grade["checks"]
        assert check["observed"].strip() == (d / "oracle.stdout").read_text().strip(), (i, check)
        ports.append(trial["ports"]["web"])
    assert len({p[0] for p in ports}) == 3, ports  # each trial's own container, its own port
