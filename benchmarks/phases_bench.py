"""Phases: median and p95 of each trial phase (compose up, each recipe, oracle, grading, teardown).

Runs the postgres reference pack through ``forge run`` and reads every trial's timings (``trial.yaml``, read
by forge's own reader), so a regression points at its phase. The helpers it shares with the other
benchmarks are in ``benchmarks/harness.py``.

Size: ``FORGE_BENCH_PHASES_TRIALS`` (default 8) or ``--trials``; ``--workers`` (default 1);
``FORGE_BENCH_CONFIG`` selects another run config. ``--run-dir DIR`` only analyses an existing run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from forgelib.run.results import RecordedTrial, read_trials

NAME = "phases"


# The phases the trial itself times (run/execute.py); every other timing is a part of provision.
TOP_PHASES = {"provision", "tools_start", "solve", "grading", "capture_logs", "teardown"}


def _row(phase: str, xs: Sequence[float]) -> dict[str, Any]:
    return {
        "phase": phase,
        "n": len(xs),
        "median_s": round(bs.median(xs), 3),
        "p95_s": round(bs.percentile(xs, 95), 3),
        "max_s": round(max(xs), 3),
        "mean_s": round(statistics.fmean(xs), 3),
    }


def phase_rows(trials: Iterable[RecordedTrial]) -> list[dict[str, Any]]:
    """One row per phase, in the order the phases first appear, then the trial total: n, median, p95, max,
    mean seconds.

    ``provision (other)`` is provision minus its timed sub-phases (compose_config, up_*, recipe:*): time
    spent between them (image env, binding checks, the override file) that no sub-phase owns.
    """
    samples: dict[str, list[float]] = {}
    totals = []
    for t in trials:
        for phase, secs in t.timings.items():
            samples.setdefault(phase, []).append(secs)
        if "provision" in t.timings:
            sub = sum(v for k, v in t.timings.items() if k not in TOP_PHASES)
            samples.setdefault("provision (other)", []).append(max(t.timings["provision"] - sub, 0.0))
        totals.append(t.wall_seconds)
    rows = [_row(phase, xs) for phase, xs in samples.items()]
    return [*rows, _row("(trial total)", totals)] if totals else rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.phases_bench", description=__doc__)
    p.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_PHASES_TRIALS", 8))
    p.add_argument("--workers", type=int, default=bs.env_int("FORGE_BENCH_PHASES_WORKERS", 1))
    p.add_argument("--config", type=Path, default=None, help="run config (default: the postgres pack's dev)")
    p.add_argument("--run-dir", type=Path, default=None, help="analyse this existing run instead")
    return p.parse_args(list(argv) if argv is not None else [])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    meta = bs.start_meta()
    notes: list[str] = []
    if args.run_dir:
        trials = read_trials(args.run_dir)
        meta["run_dir"] = str(args.run_dir)
    else:
        config = (args.config or bs.config_path()).resolve()
        with tempfile.TemporaryDirectory(prefix="forge-bench-phases-") as tmp:
            run = bs.run_forge(config, repeats=args.trials, workers=args.workers, workdir=Path(tmp))
            trials = run.trials()
            meta.update(
                config=str(config),
                trials=args.trials,
                workers=args.workers,
                wall_s=round(run.wall, 3),
                rc=run.rc,
                passed=run.passed(),
                summary_phase_stats=run.summary.get("timings"),
            )
            if run.rc != 0:
                notes.append(run.describe_failure())
            if left := bs.leftovers(run.run_id):
                notes.append(f"LEFTOVERS after run {run.run_id}: {left}")
    return bs.report(NAME, phase_rows(trials), meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
