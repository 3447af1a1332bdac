"""forge as a harbor environment against harbor's own docker environment (issue 40), in one run:
``python benchmarks/harbor_bench.py [TRIALS [ARMS [ROUNDS]]]`` from a Python >= 3.12 venv with ``pip install
-e '.[harbor]'`` (figures in README.md, section "harbor"). Not part of CI. ``ARMS``: a comma list of
``docker,fresh,goldens,warm,warmgoldens`` (default: all; docker is always run, first, as each round's
reference); ``ROUNDS``: the arms run in turn that many times (default 1).

The same task (``examples/harbor_postgres_reset/postgres_reset``), harbor's oracle agent, ``-k TRIALS -n 1``
(default 4), one ``harbor run`` per arm:

* **harbor docker** (the baseline): ``--env docker`` on a temporary copy of the task that harbor's docker
  environment can start offline and that does the same work: ``docker_image`` in ``task.toml`` (harbor
  builds ``main`` from a Dockerfile otherwise, and the task has none: its ``main`` is an image) and the
  seed mounted as a second init script of app-db (harbor does not read forge's ``project.yaml``, so
  without it the oracle would read the factory row and the arm would skip the seeding the others do);
* **forge fresh**, **forge goldens** (``--ek goldens=true``), **forge warm** (``--ek stacks=warm``):
  ``--env forgelib.harbor:ForgeEnvironment`` on the task as it is;
* **forge warm+goldens** (``--ek stacks=warm --ek goldens=true``): the warm stack's first provisioning
  starts from the task's goldens, as a user re-running a task has them: when the engine has none, a
  one-trial goldens job (``prime``, not measured) takes them before the first round.

Per trial, from harbor's ``result.json``: **start** = ``environment_setup`` (the environment's ``start``),
**stop** = the trial's ``finished_at`` minus its verifier's ``finished_at`` (harbor records no teardown
phase; in between it only calls the environment's ``stop`` and closes a bridge this agent does not open).
A warm trial's stop hands the stack back to its pool; the pool's stacks are torn down as the job ends,
outside every trial, so the job's wall time (its ``result.json``) is reported too. Where a forge trial's
start and stop go, from its ``forge_stack.json``: ``acquire`` (the stack: provisioned, or a warm one's
reset waited for) and ``dirs`` (harbor's log directories made in ``main``; 0 when a reused ``main`` came
with them), ``grade_and_logs`` (``grade`` and ``logs`` side by side) and ``release``; harbor's own share is
the rest of each window; and the reset ahead that readied a reused trial's stack (off its path).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forgelib.runner import SubprocessRunner
from forgelib.stacks.snapshots import store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TASK = ROOT / "examples" / "harbor_postgres_reset" / "postgres_reset"
FORGE_ENV = "forgelib.harbor:ForgeEnvironment"
PROJECT = "harbor_postgres_reset"  # the task's project.yaml name: its goldens carry it
MAIN_IMAGE = "forgelib/python:3.11"
IMAGES = {"FORGE_IMAGE_POSTGRES": "forgelib/postgres:15", "FORGE_IMAGE_PYTHON": MAIN_IMAGE}
INIT_MOUNT = "      - ./init.sql:/docker-entrypoint-initdb.d/init.sql:ro\n"
SEED_MOUNT = "      - ./assets/postgres_baseline.sql:/docker-entrypoint-initdb.d/zz_baseline.sql:ro\n"


@dataclass(frozen=True)
class Arm:
    name: str
    args: tuple[str, ...]
    key: str
    task: str = "as is"  # "baseline": the docker arm's copy


ARMS = (
    Arm("harbor docker", ("--env", "docker"), "docker", task="baseline"),
    Arm("forge fresh", ("--env", FORGE_ENV), "fresh"),
    Arm("forge goldens", ("--env", FORGE_ENV, "--ek", "goldens=true"), "goldens"),
    Arm("forge warm", ("--env", FORGE_ENV, "--ek", "stacks=warm"), "warm"),  # the goal's arm
    # the warm stack's first provisioning from the task's goldens, taken by an earlier job (``prime``)
    Arm(
        "forge warm+goldens",
        ("--env", FORGE_ENV, "--ek", "stacks=warm", "--ek", "goldens=true"),
        "warmgoldens",
    ),
)
WARM = ("warm", "warmgoldens")


@dataclass(frozen=True)
class Trial:
    started: datetime
    start: float
    stop: float | None
    reward: float | None
    error: str | None
    forge: dict[str, float]  # forge_stack.json's timings (forge arms)
    phases: dict[str, float]  # forge_stack.json's start and stop steps, and harbor's share of each window
    reset: dict[str, float]  # a reused warm trial's reset ahead, step by step (off its path)


@dataclass(frozen=True)
class Job:
    arm: Arm
    trials: list[Trial]
    wall: float


def _ts(text: str) -> datetime:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _seconds(phase: dict[str, str] | None) -> float | None:
    if not phase or not phase.get("finished_at"):
        return None
    return (_ts(phase["finished_at"]) - _ts(phase["started_at"])).total_seconds()


def baseline_task(into: Path) -> Path:
    """The task as harbor's docker environment can run it offline, doing the forge arms' work."""
    task = into / TASK.name
    shutil.copytree(TASK, task, symlinks=False)
    toml = task / "task.toml"
    text = toml.read_text()
    assert "[environment]\n" in text, f"{toml}: no [environment] table"
    toml.write_text(text.replace("[environment]\n", f'[environment]\ndocker_image = "{MAIN_IMAGE}"\n', 1))
    compose = task / "environment" / "docker-compose.yaml"
    text = compose.read_text()
    assert INIT_MOUNT in text, f"{compose}: app-db's init.sql mount changed; update INIT_MOUNT"
    compose.write_text(text.replace(INIT_MOUNT, INIT_MOUNT + SEED_MOUNT, 1))
    return task


def _phases(record: dict[str, Any], start: float, stop: float | None) -> dict[str, float]:
    """The record's start and stop steps, and harbor's share of each window (the rest of it)."""
    steps = {**record.get("start", {}), **record.get("stop", {})}
    out = {k: float(v) for k, v in steps.items()}
    out.update({k: float(v) for k, v in record.get("stop_parts", {}).items()})
    if "start" in record:
        out["harbor (start)"] = start - sum(float(v) for v in record["start"].values())
    if "stop" in record and stop is not None:
        out["harbor (stop)"] = stop - sum(float(v) for v in record["stop"].values())
    return out


def _reset(record: dict[str, Any]) -> dict[str, float]:
    ahead = record.get("reset_ahead") or {}
    return {k: float(v) for k, v in ahead.items() if k != "ended_at"}


def run_arm(
    harbor: Path, arm: Arm, task: Path, jobs: Path, trials: int, env: dict[str, str], round_: int = 1
) -> Job:
    name = re.sub(r"[^a-z0-9]+", "-", arm.name).strip("-") + f"-{round_}"
    argv = [str(harbor), "run", "-p", str(task), *arm.args, "-a", "oracle", "-k", str(trials), "-n", "1"]
    argv += ["-o", str(jobs), "--job-name", name, "-q"]
    began = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - began
    job_dir = jobs / name
    if done.returncode != 0 or not (job_dir / "result.json").is_file():
        tails = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        sys.exit(f"{arm.name}: harbor run exited {done.returncode}\n{tails}")
    job = json.loads((job_dir / "result.json").read_text())
    if job.get("finished_at"):
        wall = (_ts(job["finished_at"]) - _ts(job["started_at"])).total_seconds()
    found: list[Trial] = []
    for path in sorted(job_dir.glob("*/result.json")):
        r = json.loads(path.read_text())
        start = _seconds(r.get("environment_setup"))
        verifier = r.get("verifier") or {}
        stop = None
        if verifier.get("finished_at") and r.get("finished_at"):
            stop = (_ts(r["finished_at"]) - _ts(verifier["finished_at"])).total_seconds()
        rewards = (r.get("verifier_result") or {}).get("rewards") or {}
        error = (r.get("exception_info") or {}).get("exception_message")
        where = path.parent / "forge_stack.json"
        record = json.loads(where.read_text()) if where.is_file() else {}
        phases = _phases(record, start or 0.0, stop)
        trial = Trial(
            _ts(r["started_at"]), start or 0.0, stop, rewards.get("reward"), error, record.get("timings", {}),
            phases, _reset(record),
        )  # fmt: skip
        found.append(trial)
    found.sort(key=lambda t: t.started)
    return Job(arm, found, wall)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _where(trials: list[Trial], field: str = "forge") -> str:
    """The mean of each forge timing (or start and stop step) over these trials, largest first."""
    got = [getattr(t, field) for t in trials]
    keys = sorted({k for g in got for k in g})
    means = {k: _mean([g.get(k, 0.0) for g in got]) for k in keys}
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(means.items(), key=lambda kv: -kv[1]) if v >= 0.005)


def remove_new_goldens(before: set[str]) -> None:
    """The goldens arm captures this task's golden when none is on the engine; a golden is a cache that
    outlives its run, so the ones this run made are removed (as ``forge snapshots prune`` does)."""
    runner = SubprocessRunner()
    for g in store.list_goldens(runner, project=PROJECT):
        if g.id not in before:
            err = store.remove(runner, g)
            if err is None:
                store.forget(g.key)
            else:
                print(f"golden {g.key} kept: {err}")


def main(argv: list[str] | None = None) -> int:
    """``argv``: ``[TRIALS [ARMS [ROUNDS]]]``; None when run as a script, a list from ``python -m
    benchmarks``."""
    args = sys.argv[1:] if argv is None else argv
    trials = int(args[0]) if args else 4
    keys = set(args[1].split(",")) if len(args) > 1 else {a.key for a in ARMS}
    unknown = keys - {a.key for a in ARMS}
    if unknown:
        sys.exit(f"unknown arm(s) {', '.join(sorted(unknown))}; the arms: {', '.join(a.key for a in ARMS)}")
    arms = [a for a in ARMS if a.key in keys or a.key == "docker"]
    rounds = int(args[2]) if len(args) > 2 else 1
    harbor = Path(sys.executable).parent / "harbor"
    if not harbor.is_file():  # harbor needs Python >= 3.12; forgelib's own venv is 3.11
        why = f"harbor is not installed beside {sys.executable}: run from a Python >= 3.12 venv with "
        why += f"pip install -e '{ROOT}[harbor]'"
        if argv is not None:  # all of `python -m benchmarks` on forgelib's venv: skipped, said why
            print(f"harbor: skipped ({why})")
            return 0
        sys.exit(why)
    env = {**os.environ, **IMAGES, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cpus, load {load_before}, -k {trials}")
    jobs: list[tuple[int, Job]] = []
    goldens = {g.id for g in store.list_goldens(SubprocessRunner(), project=PROJECT)}
    if goldens:
        print(
            f"{len(goldens)} golden(s) of {PROJECT} already on the engine: "
            "the goldens arm restores from its first trial"
        )
    with tempfile.TemporaryDirectory(prefix="forge-harbor-bench-") as tmp:
        try:
            tasks = {"baseline": baseline_task(Path(tmp)), "as is": TASK}
            if not goldens and any(a.key == "warmgoldens" for a in arms):
                prime = next(a for a in ARMS if a.key == "goldens")
                job = run_arm(harbor, prime, TASK, Path(tmp) / "jobs", 1, env, 0)
                print(f"prime: the task's goldens taken by a one-trial goldens job ({job.wall:.1f} s)")
            for r in range(1, rounds + 1):
                for arm in arms:
                    job = run_arm(harbor, arm, tasks[arm.task], Path(tmp) / "jobs", trials, env, r)
                    jobs.append((r, job))
                    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
                    print(f"round {r}, {arm.name}: {len(job.trials)} trials, {job.wall:.1f} s, load {load}")
        finally:
            remove_new_goldens(goldens)
    load_after = os.getloadavg()

    def cycle(t: Trial) -> float:
        return t.start + (t.stop or 0.0)

    print()
    print(
        "| round | arm | rewards | start s (each) | stop s (each) | start+stop mean | ÷ harbor docker | "
        "later trials ÷ docker | job s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r, job in jobs:
        ref_job = next(j for rr, j in jobs if rr == r and j.arm.key == "docker")
        ref = _mean([cycle(t) for t in ref_job.trials])
        ts = job.trials
        later = _mean([cycle(t) for t in ts[1:]])
        each_start = " ".join(f"{t.start:.2f}" for t in ts)
        each_stop = " ".join("-" if t.stop is None else f"{t.stop:.2f}" for t in ts)
        rewards = " ".join("x" if t.reward is None else f"{t.reward:g}" for t in ts)
        mean = _mean([cycle(t) for t in ts])
        print(
            f"| {r} | {job.arm.name} | {rewards} | {each_start} | {each_stop} | {mean:.2f} | "
            f"{mean / ref:.3f} | {later / ref:.3f} | {job.wall:.1f} |"
        )
        for t in ts:
            if t.error:
                print(f"  {job.arm.name} trial error: {t.error[:300]}")
    print()
    for r, job in jobs:
        if job.arm.key == "docker":
            continue
        print(
            f"round {r}, {job.arm.name}, forge's timings: trial 1: {_where(job.trials[:1])}; "
            f"later: {_where(job.trials[1:])}"
        )
        print(
            f"round {r}, {job.arm.name}, start and stop steps: trial 1: {_where(job.trials[:1], 'phases')}; "
            f"later: {_where(job.trials[1:], 'phases')}"
        )
        if job.arm.key in WARM:
            print(f"round {r}, {job.arm.name}, reset ahead (off the path): {_where(job.trials[1:], 'reset')}")
    print(f"\nload before {load_before}, after {load_after}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = {
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%MZ}",
        "cpus": os.cpu_count(),
        "load": [load_before, load_after],
        "trials_per_job": trials,
        "jobs": [
            {
                "round": r,
                "arm": j.arm.name,
                "job_seconds": j.wall,
                "trials": [
                    {
                        "start": t.start,
                        "stop": t.stop,
                        "reward": t.reward,
                        "error": t.error,
                        "forge": t.forge,
                        "phases": t.phases,
                        "reset": t.reset,
                    }
                    for t in j.trials
                ],
            }
            for r, j in jobs
        ],
    }
    (RESULTS / f"harbor-k{trials}.json").write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
