"""A task's ``setup:`` run once against the same work run in every trial, in one benchmark run, the arms
alternated (tests/fixtures/setup_project).

- **setup arm**: ``slow_setup`` (its setup sleeps ``SETUP_SLEEP`` = 10 s, then writes a row and a file),
  N trials on fresh stacks: one setup stack, a checkpoint, then every trial a fork of it;
- **inline arm**: ``inline_setup``, the same steps in each trial's oracle, N trials on fresh stacks;
- **warm arm**: ``slow_setup`` on warm stacks (``--stacks warm``): the setup once, then each worker's
  stack starts from its checkpoint and is reset to it in place between trials.

Every arm grades the same checks (the setup's row and file, the seed's, the trial's own). Reported per
arm: the run's wall (forge's whole run: what a user waits for), the median trial wall (``trial.yaml``),
the setup's one-off seconds by step; setup ÷ inline and warm ÷ setup for both. Every arm must pass and
leave nothing on the engine (``harness.checked_run``), and no checkpoint of its runs may remain.

Size: ``FORGE_BENCH_SETUP_TRIALS`` (8) / ``--trials`` per run, ``--workers`` (2),
``FORGE_BENCH_SETUP_ROUNDS`` (1) / ``--rounds`` (each round one run per arm, setup arm first).

``--cluster``: ``slow_setup`` on the tests' loopback Ray cluster (two nodes, each its own engine, 2 slots
each: tests/support/cluster.py) against the same run locally with ``--workers 4``, alternated (ABBA). Per
run: the setup's one-off steps (provision, the step, checkpoint), and on the cluster the copy of its
checkpoint to the other node (``docker save`` less the base layers, through Ray's object store, ``docker
load``, manifest written and verified there): its bytes, the node's load+verify seconds and the whole
copy's seconds as the driver waits for it. Both engines must be left with nothing of the runs.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks import harness as bs
from forgelib.docker import argv as dk
from forgelib.run.results import RecordedTrial
from forgelib.runner import SubprocessRunner
from forgelib.stacks.snapshots import checkpoints as ckstore

NAME = "setup"
PROJECT = bs.REPO / "tests/fixtures/setup_project"
SETUP = PROJECT / "run_configs/setup.yaml"
INLINE = PROJECT / "run_configs/inline.yaml"
PHASES = (
    "setup_wait", "memory_wait", "start_wait", "compose_config", "checkpoint_plan", "up_seeded", "recipe",
    "up_rest", "checkpoint_verify", "warm_prepare", "reset_wait", "stack_wait",
    "provision", "solve", "grading", "teardown",
)  # fmt: skip


# (arm, run config, stack mode), in the order each round runs them
ARMS = (("setup", SETUP, "fresh"), ("inline", INLINE, "fresh"), ("warm", SETUP, "warm"))


def main(argv: Sequence[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.setup_bench", description=__doc__)
    ap.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_SETUP_TRIALS", 8))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_SETUP_ROUNDS", 1))
    ap.add_argument("--cluster", action="store_true", help="the setup on a loopback Ray cluster vs locally")
    args = ap.parse_args(list(argv))
    if args.cluster:
        return cluster_main(args.trials, args.rounds)
    runner = SubprocessRunner()
    meta = bs.start_meta(trials=args.trials, workers=args.workers, rounds=args.rounds)
    root = Path(tempfile.mkdtemp(prefix="forge-bench-setup-"))
    marker = root / "marker"
    marker.mkdir()
    marker.chmod(0o777)
    env = {"FORGE_TEST_MARKER_DIR": str(marker)}
    arms: dict[str, list[bs.ForgeRun]] = {"setup": [], "inline": [], "warm": []}
    trials: dict[str, list[RecordedTrial]] = {arm: [] for arm in arms}  # read before the runs' files go
    checkpoints: list[str] = []
    try:
        for _ in range(args.rounds):
            for arm, config, mode in ARMS:
                run = bs.checked_run(
                    config, repeats=args.trials, workers=args.workers, root=root, env=env,
                    extra=("--stacks", mode, "--no-snapshots"),
                )  # fmt: skip
                arms[arm].append(run)
                trials[arm] += run.trials()
                checkpoints += [str(s.get("checkpoint")) for s in (run.summary.get("setups") or {}).values()]
                print(f"{arm}: run {run.wall:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    tags = runner.run(
        dk.ls("image", format="{{.Tag}}", filters=[ckstore.REPOSITORY]), timeout=60
    ).stdout.split()
    left = [t for t in tags if any(t.startswith(c) for c in checkpoints)]
    if left:
        raise SystemExit(f"checkpoints of the setup runs were left: {left}")
    rows: list[dict[str, Any]] = []
    for arm, runs in arms.items():
        done = trials[arm]
        setups = [s for r in runs for s in (r.summary.get("setups") or {}).values()]
        rows.append(
            {
                "arm": arm,
                "runs": len(runs),
                "trials": len(done),
                "run_wall_s": round(bs.median([r.wall for r in runs]), 2),
                "trial_wall_median_s": round(bs.median([t.wall_seconds for t in done]), 2),
                "setup_once_s": round(bs.median([float(s["seconds"]) for s in setups]), 2)
                if setups
                else None,
                "setup_steps_s": setups[0]["timings"] if setups else None,
                "phase_medians_s": bs.phase_medians(done, PHASES),
            }
        )
    setup_row, inline_row, warm_row = rows
    ratios = {
        "run_wall warm/setup": round(bs.ratio(warm_row["run_wall_s"], setup_row["run_wall_s"]), 3),
        "trial_wall warm/setup": round(
            bs.ratio(warm_row["trial_wall_median_s"], setup_row["trial_wall_median_s"]), 3
        ),
        "run_wall setup/inline": round(bs.ratio(setup_row["run_wall_s"], inline_row["run_wall_s"]), 3),
        "trial_wall setup/inline": round(
            bs.ratio(setup_row["trial_wall_median_s"], inline_row["trial_wall_median_s"]), 3
        ),
    }
    rows.append({"arm": "ratio", **ratios})
    notes = [f"load average at the end {bs.loadavg()} (2 cores shared with other engineers' work)"]
    return bs.report(NAME, rows, meta={**meta, **ratios}, notes=notes)


def _own_project(root: Path, marker: Path) -> Path:
    """A copy of the fixture whose runner mounts ``marker`` as written (a cluster node's compose does not
    see this process's environment); the copy's run config for ``slow_setup``."""
    pack = root / "setup_project"
    shutil.copytree(PROJECT, pack, ignore=shutil.ignore_patterns("runs"))
    compose = pack / "shared" / "compose.yaml"
    compose.write_text(re.sub(r"\$\{FORGE_TEST_MARKER_DIR:\?[^}]*\}", str(marker), compose.read_text()))
    return pack / "run_configs" / "setup.yaml"


def _cluster_row(arm: str, run: bs.ForgeRun, engines: Sequence[Any]) -> dict[str, Any]:
    """One run's row; a run that left anything on either engine stops the benchmark."""
    for eng in engines:
        f = ["--filter", f"label=io.forgelib.run={run.run_id}"]
        left = eng.docker("ps", "-a", *f, "-q").split() + eng.docker("image", "ls", *f, "-q").split()
        if left:
            raise SystemExit(f"{run.run_id} left {left} on {eng.host}")
    assert run.run_dir is not None
    setup = yaml.safe_load((run.run_dir / "setups" / "slow_setup" / "setup.yaml").read_text())
    docs = [yaml.safe_load(p.read_text()) for p in run.run_dir.glob("trials/*/*/trial.yaml")]
    return {
        "arm": arm,
        "run_wall_s": round(run.wall, 2),
        "trial_wall_median_s": round(bs.median([t.wall_seconds for t in run.trials()]), 2),
        "setup_s": round(float(setup["seconds"]), 2),
        "setup_steps_s": setup["timings"],
        "copy": setup.get("copies"),
        "engines": sorted({str((d.get("node") or {}).get("engine", "local")) for d in docs}),
    }


def _count(marker: Path) -> int:
    log = marker / "setup.log"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def cluster_main(trials: int, rounds: int) -> dict[str, Any]:
    sys.path.insert(0, str(bs.REPO / "tests"))
    from support.cluster import start_engine_and_cluster, stop_engine

    meta = bs.start_meta(trials=trials, workers=4, rounds=rounds)
    root = Path(tempfile.mkdtemp(prefix="forge-bench-setup-cluster-"))
    marker = root / "marker"
    marker.mkdir()
    marker.chmod(0o777)
    config = _own_project(root, marker)
    engines, cluster = start_engine_and_cluster(["forgelib/postgres:15", "forgelib/python:3.11"], 2)
    rows: list[dict[str, Any]] = []
    try:
        try:
            for r in range(rounds):
                for arm in ("local", "cluster") if r % 2 == 0 else ("cluster", "local"):
                    extra = ("--cluster", cluster.address) if arm == "cluster" else ()
                    runs = _count(marker)
                    run = bs.checked_run(config, repeats=trials, workers=4, root=root, extra=extra)
                    ran = _count(marker) - runs
                    if ran != 1:
                        raise SystemExit(f"{arm}: the setup ran {ran} times, not once")
                    row = _cluster_row(arm, run, engines)
                    rows.append(row)
                    print(f"{arm}: run {run.wall:.1f} s, copy {row['copy']}", file=sys.stderr, flush=True)
        finally:
            cluster.stop()
            stop_engine(engines[1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    notes = [f"load average at the end {bs.loadavg()} (2 cores shared with other engineers' work)"]
    return bs.report(f"{NAME}_cluster", rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
