"""Overhead: per-trial cost of ``forge run`` against a hand-written shell loop doing the same work.

A = ``python -m forgelib run --config PACK/run_configs/dev.yaml --repeats 1 --json --output TMP``;
B = ``benchmarks/shell_baseline.sh`` on the same compose file: ``docker compose up --wait`` -> ``psql`` < the
same seed -> the same oracle -> the same state check -> ``docker compose down --volumes``.
Both get the same ``FORGE_IMAGE_*`` variables (``ImageFacts.env``, as forge sets them). Runs are
interleaved A B A B after one unmeasured warm-up pair; the report gives per-trial medians and forge ÷ shell
(target ≤ 1.10), plus where forge's time goes (process start + load vs. the trial itself, phase by phase
beside the shell's steps, client CPU). A third arm C (A B C A B C ...) runs the shell loop in forge's order
— up the seeded service, seed, then up the rest, so nothing reads the database before the seed — which
separates what that ordering costs from what forge's implementation costs.

Size: ``FORGE_BENCH_OVERHEAD_PAIRS`` (default 5) or ``--pairs``; ``--warmup`` (default 1);
``FORGE_BENCH_OVERHEAD_SPLIT=0`` / ``--split 0`` drops arm C.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.phases_bench import (
    REPO,
    busy_now,
    config_path,
    env_int,
    leftovers,
    loadavg,
    median,
    ratio,
    report,
    run_forge,
    trial_timings,
    trial_total,
)

NAME = "overhead"
SHELL = REPO / "benchmarks" / "shell_baseline.sh"
TARGET = 1.10


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


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping")
    return data


def image_env() -> dict[str, str]:
    """The FORGE_IMAGE_* overlay forge merges into every compose call (the same function forge uses)."""
    from forgelib.images import ImageFacts
    from forgelib.runner import SubprocessRunner

    env = ImageFacts().env(SubprocessRunner(default_timeout=60))
    return {k: v for k, v in env.items() if v is not None}


def baseline_for(config: Path) -> Baseline:
    """Derive the shell loop's arguments from the run config's pack, read by forge's own loader: its one
    reset sql_dump service, its first task's oracle and that task's first check (file or sql)."""
    from forgelib.seeds.sql_dump import postgres_credentials
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


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead_bench", description=__doc__)
    p.add_argument("--pairs", type=int, default=env_int("FORGE_BENCH_OVERHEAD_PAIRS", 5))
    p.add_argument("--warmup", type=int, default=env_int("FORGE_BENCH_OVERHEAD_WARMUP", 1))
    p.add_argument(
        "--split",
        type=int,
        default=env_int("FORGE_BENCH_OVERHEAD_SPLIT", 1),
        help="1: a third arm, the shell loop in forge's order (up the seeded service, seed, up the rest)",
    )
    p.add_argument("--config", type=Path, default=None, help="run config (default: the postgres pack's dev)")
    return p.parse_args(list(argv) if argv is not None else [])


@dataclass
class Arm:
    label: str
    walls: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    steps: dict[str, list[float]] = field(default_factory=dict)

    def add(self, wall: float, cpu: float, steps: Mapping[str, float]) -> None:
        self.walls.append(wall)
        self.cpu.append(cpu)
        for k, v in steps.items():
            self.steps.setdefault(k, []).append(v)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = (args.config or config_path()).resolve()
    meta: dict[str, Any] = {
        "loadavg_start": loadavg(),
        "busy_before": busy_now(),
        "config": str(config),
        "pairs": args.pairs,
    }
    baseline = baseline_for(config)
    meta["image_env"] = baseline.env
    meta["shell_argv"] = baseline.argv(1)
    notes: list[str] = []
    forge = Arm("forge run --repeats 1")
    forge_trials: list[float] = []
    forge_self: list[float] = []
    shells = [Arm("shell_baseline.sh")]
    if args.split:
        shells.append(Arm("shell_baseline.sh, forge's order"))
    with tempfile.TemporaryDirectory(prefix="forge-bench-overhead-") as tmp:
        for i in range(args.warmup + args.pairs):
            measured = i >= args.warmup
            work = Path(tmp) / f"forge-{i}"
            work.mkdir()
            run = run_forge(config, repeats=1, workdir=work, env=baseline.env)
            trials = run.trials()
            if run.rc != 0 or not trials:
                notes.append(f"round {i}: {run.describe_failure()}")
            elif measured:
                forge.add(run.wall, run.client_cpu_s, trial_timings(trials[0]))
                forge_trials.append(trial_total(trials[0]))
                forge_self.append(run.self_cpu_s)
            if left := leftovers(run.run_id):
                notes.append(f"LEFTOVERS after forge run {run.run_id}: {left}")
            line = f"  {'round' if measured else 'warm-up'} {i}: forge {run.wall:.2f}s (rc {run.rc})"
            for arm in shells:
                shell = run_shell(baseline, split=arm is not shells[0])
                if shell.rc != 0:
                    notes.append(f"round {i}: {arm.label} exited {shell.rc}: {shell.stderr.strip()[-800:]}")
                elif measured:
                    arm.add(shell.wall, shell.client_cpu_s, shell.steps)
                line += f", {arm.label} {shell.wall:.2f}s (rc {shell.rc})"
            print(line, file=sys.stderr)
    f_med = median(forge.walls)
    rows: list[dict[str, Any]] = [
        {"measure": f"per-trial wall, {arm.label}", "n": len(arm.walls), "median_s": median(arm.walls)}
        for arm in (forge, *shells)
    ]
    for arm in shells:
        rows.append(
            {
                "measure": f"ratio forge / {arm.label}",
                "n": min(len(forge.walls), len(arm.walls)),
                "median_s": ratio(f_med, median(arm.walls)),
                "target": f"<= {TARGET}" if arm is shells[0] else "",
            }
        )
    rows += [
        {
            "measure": "forge: the trial itself (trial.yaml)",
            "n": len(forge_trials),
            "median_s": median(forge_trials),
        },
        {
            "measure": "forge: process start + load + summary",
            "n": len(forge_trials),
            "median_s": median([w - t for w, t in zip(forge.walls, forge_trials, strict=False)]),
        },
    ]
    rows += [
        {"measure": f"client CPU per trial, {arm.label}", "n": len(arm.cpu), "median_s": median(arm.cpu)}
        for arm in (forge, *shells)
    ]
    rows.append(
        {
            "measure": "  of which the forge process itself",
            "n": len(forge_self),
            "median_s": median(forge_self),
        }
    )
    rows += [
        {"measure": f"forge phase {k}", "n": len(v), "median_s": median(v)} for k, v in forge.steps.items()
    ]
    for arm in shells:
        rows += [
            {"measure": f"{arm.label}: step {k}", "n": len(v), "median_s": median(v)}
            for k, v in arm.steps.items()
        ]
    r = ratio(f_med, median(shells[0].walls))
    meta.update(ratio=r, walls={arm.label: arm.walls for arm in (forge, *shells)})
    notes.insert(
        0, f"ratio forge / shell {r:.3f}  target <= {TARGET}  {'OK' if r <= TARGET else 'OVER TARGET'}"
    )
    return report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
