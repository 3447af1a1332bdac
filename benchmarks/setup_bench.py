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
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    args = ap.parse_args(list(argv))
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


if __name__ == "__main__":
    main(sys.argv[1:])
