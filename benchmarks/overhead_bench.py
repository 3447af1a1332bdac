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
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from benchmarks.baseline import baseline_for, run_shell

NAME = "overhead"
SHELL = bs.REPO / "benchmarks" / "shell_baseline.sh"
TARGET = 1.10


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead_bench", description=__doc__)
    p.add_argument("--pairs", type=int, default=bs.env_int("FORGE_BENCH_OVERHEAD_PAIRS", 5))
    p.add_argument("--warmup", type=int, default=bs.env_int("FORGE_BENCH_OVERHEAD_WARMUP", 1))
    p.add_argument(
        "--split",
        type=int,
        default=bs.env_int("FORGE_BENCH_OVERHEAD_SPLIT", 1),
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
    config = (args.config or bs.config_path()).resolve()
    meta = bs.start_meta(config=str(config), pairs=args.pairs)
    baseline = baseline_for(config)
    meta["image_env"] = baseline.env
    meta["shell_argv"] = baseline.argv(1)
    notes: list[str] = []
    forge = Arm("forge run --repeats 1")
    forge_trials: list[float] = []
    forge_teardowns: list[float] = []
    forge_self: list[float] = []
    shells = [Arm("shell_baseline.sh")]
    if args.split:
        shells.append(Arm("shell_baseline.sh, forge's order"))
    with tempfile.TemporaryDirectory(prefix="forge-bench-overhead-") as tmp:
        for i in range(args.warmup + args.pairs):
            measured = i >= args.warmup
            work = Path(tmp) / f"forge-{i}"
            work.mkdir()
            run = bs.run_forge(config, repeats=1, workdir=work, env=baseline.env)
            trials = run.trials()
            if run.rc != 0 or not trials:
                notes.append(f"round {i}: {run.describe_failure()}")
            elif measured:
                forge.add(run.wall, run.client_cpu_s, trials[0].timings)
                forge_trials.append(trials[0].wall_seconds)
                forge_teardowns.append(trials[0].timings.get("teardown", 0.0))
                forge_self.append(run.self_cpu_s)
            if left := bs.leftovers(run.run_id):
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
    f_med = bs.median(forge.walls)
    rows: list[dict[str, Any]] = [
        {"measure": f"per-trial wall, {arm.label}", "n": len(arm.walls), "median_s": bs.median(arm.walls)}
        for arm in (forge, *shells)
    ]
    for arm in shells:
        rows.append(
            {
                "measure": f"ratio forge / {arm.label}",
                "n": min(len(forge.walls), len(arm.walls)),
                "median_s": bs.ratio(f_med, bs.median(arm.walls)),
                "target": f"<= {TARGET}" if arm is shells[0] else "",
            }
        )
    rows += [
        {
            "measure": "forge: the trial itself (trial.yaml)",
            "n": len(forge_trials),
            "median_s": bs.median(forge_trials),
        },
        {
            # trial.yaml's wall ends at its RECORD phase, before teardown (evidence first): its own row
            "measure": "forge: teardown (after the trial's record)",
            "n": len(forge_teardowns),
            "median_s": bs.median(forge_teardowns),
        },
        {
            "measure": "forge: process start + load + summary",
            "n": len(forge_trials),
            "median_s": bs.median(
                [w - t - d for w, t, d in zip(forge.walls, forge_trials, forge_teardowns, strict=False)]
            ),
        },
    ]
    rows += [
        {"measure": f"client CPU per trial, {arm.label}", "n": len(arm.cpu), "median_s": bs.median(arm.cpu)}
        for arm in (forge, *shells)
    ]
    rows.append(
        {
            "measure": "  of which the forge process itself",
            "n": len(forge_self),
            "median_s": bs.median(forge_self),
        }
    )
    rows += [
        {"measure": f"forge phase {k}", "n": len(v), "median_s": bs.median(v)} for k, v in forge.steps.items()
    ]
    for arm in shells:
        rows += [
            {"measure": f"{arm.label}: step {k}", "n": len(v), "median_s": bs.median(v)}
            for k, v in arm.steps.items()
        ]
    r = bs.ratio(f_med, bs.median(shells[0].walls))
    meta.update(ratio=r, walls={arm.label: arm.walls for arm in (forge, *shells)})
    notes.insert(0, f"ratio forge / shell {r:.3f}  target <= {TARGET}  {bs.verdict(r, TARGET)}")
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
