"""The like-for-like baseline: ``shell_baseline.sh`` (plain ``docker compose`` + ``psql`` doing what one
forge trial does), its arguments derived from the pack by forge's own loader. Shared by the overhead,
parallel and memory benchmarks."""

from __future__ import annotations

import os
import resource
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO

SHELL = REPO / "benchmarks" / "shell_baseline.sh"


# ------------------------------------------------------------------------------ the shell loop's arguments
@dataclass
class Baseline:
    """What shell_baseline.sh needs, read from the pack's spec files (the same ones forge reads)."""

    compose_file: Path
    seed_service: str
    seed_file: Path
    pguser: str
    pgdatabase: str
    oracle: list[str]  # `docker compose exec -T` arguments, empty for none
    oracle_stdin: Path | None
    check: list[str]  # `docker compose exec -T` arguments printing the observed value
    expect: str
    match: str  # equals | contains
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, trials: int = 1) -> list[str]:
        return ["bash", str(SHELL), "-n", str(trials), *self.oracle, "--", *self.check]

    def environ(self, project: str) -> dict[str, str]:
        env = {
            **os.environ,
            **self.env,
            "BASELINE_COMPOSE_FILE": str(self.compose_file),
            "BASELINE_SEED_SERVICE": self.seed_service,
            "BASELINE_SEED_FILE": str(self.seed_file),
            "BASELINE_PGUSER": self.pguser,
            "BASELINE_PGDATABASE": self.pgdatabase,
            "BASELINE_EXPECT": self.expect,
            "BASELINE_MATCH": self.match,
            "BASELINE_PROJECT": project,
        }
        if self.oracle_stdin:
            env["BASELINE_ORACLE_STDIN"] = str(self.oracle_stdin)
        return env


def image_env() -> dict[str, str]:
    """The FORGE_IMAGE_* overlay forge merges into every compose call (the same function forge uses)."""
    from forgelib.images import ImageFacts
    from forgelib.runner import SubprocessRunner

    env = ImageFacts().env(SubprocessRunner(default_timeout=60))
    return {k: v for k, v in env.items() if v is not None}


def baseline_for(config: Path) -> Baseline:
    """Derive the shell loop's arguments from the run config's pack, read by forge's own loader: its one
    reset sql_dump service, its first task's oracle and that task's first check (file or sql)."""
    from forgelib.kinds.postgres.client import postgres_credentials
    from forgelib.spec.loader import load_project_config, load_run_config

    cfg = load_run_config(config)
    project = load_project_config(cfg.project)
    env = project.environment
    reset = [s for s in env.services.values() if s.reset is not None]
    if len(reset) != 1 or reset[0].reset is None:
        raise SystemExit(f"{project.root}: the shell baseline handles one reset service, found {reset}")
    seed_service, binding = reset[0].name, reset[0].reset
    tasks = [t for t in project.tasks if not cfg.tasks or t.name in cfg.tasks]
    if not tasks:
        raise SystemExit(f"{project.root}: no task")
    task = tasks[0]

    oracle: list[str] = []
    oracle_stdin = None
    if (spec := task.oracle) is not None:
        for k, v in spec.env.items():
            oracle += ["-e", f"{k}={v}"]
        if spec.workdir:
            oracle += ["-w", spec.workdir]
        oracle.append(spec.service)
        if spec.script is not None:
            oracle += list(spec.interpreter)
            oracle_stdin = spec.script
        else:
            oracle += list(spec.command or ())

    # user/database as the sql_dump recipe picks them (the binding's options, else the service's env)
    svc_env = (env.compose.get("services") or {}).get(seed_service, {}).get("environment") or {}
    if isinstance(svc_env, list):
        svc_env = dict(item.split("=", 1) for item in svc_env if "=" in item)
    user, database = postgres_credentials(binding.options, svc_env)
    if task.grading is None or not task.grading.checks:
        raise SystemExit(f"{task.path}: the shell baseline needs a state check")
    check = task.grading.checks[0]
    argv, expect, match = _check_argv(
        {"name": check.name, check.type: dict(check.spec)}, {"user": user, "database": database}
    )
    return Baseline(
        compose_file=env.compose_files[0],
        seed_service=seed_service,
        seed_file=project.seeds[binding.seed].path,
        pguser=user,
        pgdatabase=database,
        oracle=oracle,
        oracle_stdin=oracle_stdin,
        check=argv,
        expect=expect,
        match=match,
        env=image_env(),
    )


def _check_argv(check: Mapping[str, Any], binding: Mapping[str, Any]) -> tuple[list[str], str, str]:
    def matcher(spec: Mapping[str, Any]) -> tuple[str, str]:
        for key, shell in (("equals", "equals"), ("contains", "contains"), ("icontains", "contains")):
            if key in spec:
                return str(spec[key]), shell
        raise SystemExit(f"check {check.get('name')}: the shell baseline handles equals/contains only")

    if "file" in check:
        spec = check["file"]
        expect, match = matcher(spec)
        return [spec["service"], "cat", spec["path"]], expect, match
    if "sql" in check:
        spec = check["sql"]
        expect, match = matcher(spec)
        user = str(spec.get("user") or binding.get("user") or "postgres")
        db = str(spec.get("database") or binding.get("database") or user)
        return [spec["service"], "psql", "-At", "-U", user, "-d", db, "-c", spec["query"]], expect, match
    raise SystemExit(f"check {check.get('name')}: the shell baseline handles file and sql checks only")


@dataclass
class ShellRun:
    rc: int
    wall: float
    steps: dict[str, float]  # step -> seconds, from the script's "time <step> <ms>" lines
    stderr: str
    client_cpu_s: float = 0.0  # user+system CPU of bash and the docker/compose CLIs it ran


def run_shell(baseline: Baseline, *, split: bool = False, timeout: float = 600.0) -> ShellRun:
    project = f"benchsh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            baseline.argv(1),
            env={**baseline.environ(project), "BASELINE_SPLIT_UP": "1" if split else "0"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as e:
        subprocess.run(
            ["docker", "compose", "-p", f"{project}-1", "-f", str(baseline.compose_file), "down", "-v"],
            capture_output=True,
            timeout=120,
            check=False,
        )
        return ShellRun(124, time.monotonic() - start, {}, f"timeout: {e}")
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    steps: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "time":
            steps[parts[1]] = int(parts[2]) / 1000
    return ShellRun(proc.returncode, wall, steps, proc.stderr, cpu)
