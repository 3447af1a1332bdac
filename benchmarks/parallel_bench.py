"""Parallelism: the same N trials with ``--workers W`` against ``--workers 1``; wall-time ratio (target ≤ 0.5
for 8 trials, 4 workers, on a 2-core machine), and a profile of what stops it.

The profile comes from what the runs leave behind: each trial's phase timings (``trial.yaml``: how much each
phase stretches under concurrency), and the run's own forge debug log (every external command with its
duration): commands per trial by kind, how many ran at once, how much of the wall time had no command running
at all (Python-side waits: sleeps, locks, polling), and the machine's CPU use (a CPU-bound run cannot go
faster than ``cores / busy-cores-at-W1``).

Size: ``FORGE_BENCH_PARALLEL_TRIALS`` (default 8), ``FORGE_BENCH_PARALLEL_WORKERS`` (default 4), or
``--trials`` / ``--workers``; ``--rounds`` repeats the pair (alternating which goes first).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.phases_bench import (
    Command,
    ForgeRun,
    config_path,
    env_int,
    leftovers,
    loadavg,
    median,
    ratio,
    read_commands,
    report,
    run_forge,
    trial_timings,
)

NAME = "parallel"
TARGET = 0.5


def tasks_in(run: ForgeRun) -> int:
    return len({t["_task"] for t in run.trials()}) or 1


def concurrency(commands: Sequence[Command], t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1] with 0, 1, 2, ... external commands running, and the time-weighted mean."""
    events = sorted([(c.start, 1) for c in commands] + [(c.end, -1) for c in commands])
    hist: Counter[int] = Counter()
    level, last = 0, t0
    for t, delta in events:
        t = min(max(t, t0), t1)
        hist[level] += t - last
        level, last = level + delta, t
    hist[level] += max(t1 - last, 0.0)
    total = sum(hist.values()) or 1.0
    out = {f"{k}_running_s": round(v, 2) for k, v in sorted(hist.items())}
    out["mean_running"] = round(sum(k * v for k, v in hist.items()) / total, 2)
    return out


def max_overlap(commands: Sequence[Command]) -> int:
    events = sorted([(c.start, 1) for c in commands] + [(c.end, -1) for c in commands])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def profile(run: ForgeRun, trials: int) -> dict[str, Any]:
    """What the run spent its time on, from its trial.yaml files and its forge log."""
    commands = read_commands(run.log, run.pid)
    out: dict[str, Any] = {"commands": len(commands), "commands_per_trial": round(len(commands) / trials, 1)}
    if commands:
        t0 = min(c.start for c in commands)
        t1 = max(c.end for c in commands)
        out["span_with_commands_s"] = round(t1 - t0, 2)
        out["concurrency"] = concurrency(commands, t0, t1)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({c.kind for c in commands}):
        cs = [c for c in commands if c.kind == kind]
        by_kind[kind] = {
            "count": len(cs),
            "per_trial": round(len(cs) / trials, 2),
            "total_s": round(sum(c.seconds for c in cs), 2),
            "median_s": round(median([c.seconds for c in cs]), 3),
            "max_at_once": max_overlap(cs),
        }
    out["by_kind"] = by_kind
    phases: dict[str, list[float]] = {}
    for t in run.trials():
        for phase, secs in trial_timings(t).items():
            phases.setdefault(phase, []).append(secs)
    out["phase_median_s"] = {k: round(median(v), 3) for k, v in phases.items()}
    out["phase_sum_s"] = {k: round(sum(v), 2) for k, v in phases.items()}
    return out


def findings(p1: dict[str, Any], pw: dict[str, Any], w1: ForgeRun, ww: ForgeRun, workers: int) -> list[str]:
    """Plain-language observations for the report (the numbers are in the JSON too)."""
    notes = []
    ncpu = os.cpu_count() or 1
    if w1.cpu_busy > 0:
        bound = w1.cpu_busy / ncpu
        notes.append(
            f"CPU: workers=1 kept {w1.cpu_busy:.2f} of {ncpu} cores busy, workers={workers} "
            f"{ww.cpu_busy:.2f}; a CPU-bound run cannot beat a ratio of about {bound:.2f} here"
        )
    for phase, m1 in p1.get("phase_median_s", {}).items():
        mw = pw.get("phase_median_s", {}).get(phase)
        if mw and m1 and mw / m1 > 1.5:
            notes.append(f"phase {phase}: median {m1:.2f}s at workers=1 -> {mw:.2f}s at workers={workers}")
    for kind, st in pw.get("by_kind", {}).items():
        if st["count"] >= workers and st["max_at_once"] == 1:
            notes.append(f"{kind}: {st['count']} calls never overlapped at workers={workers} (serialised?)")
    for kind, st in p1.get("by_kind", {}).items():
        if kind.startswith("docker image") or kind in {"docker images", "docker info", "docker version"}:
            notes.append(f"{kind}: {st['per_trial']} calls per trial ({st['total_s']}s in the run)")
    idle = pw.get("concurrency", {}).get("0_running_s")
    if idle:
        notes.append(
            f"workers={workers}: {idle}s of {pw.get('span_with_commands_s')}s with no external command "
            "running (Python-side sleeps, locks or polling)"
        )
    idle1 = p1.get("concurrency", {}).get("0_running_s")
    if idle1:
        notes.append(f"workers=1: {idle1}s of {p1.get('span_with_commands_s')}s with no command running")
    return notes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parallel_bench", description=__doc__)
    p.add_argument("--trials", type=int, default=env_int("FORGE_BENCH_PARALLEL_TRIALS", 8))
    p.add_argument("--workers", type=int, default=env_int("FORGE_BENCH_PARALLEL_WORKERS", 4))
    p.add_argument("--rounds", type=int, default=env_int("FORGE_BENCH_PARALLEL_ROUNDS", 1))
    p.add_argument("--config", type=Path, default=None, help="run config (default: the postgres pack's dev)")
    p.add_argument("--keep", type=Path, default=None, help="copy the runs and their logs here")
    return p.parse_args(list(argv) if argv is not None else [])


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    config = (args.config or config_path()).resolve()
    meta: dict[str, Any] = {"loadavg_start": loadavg(), "config": str(config), "trials": args.trials}
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    walls: dict[int, list[float]] = {1: [], args.workers: []}
    profiles: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="forge-bench-parallel-") as tmp:
        runs: dict[int, ForgeRun] = {}
        for rnd in range(args.rounds):
            order = [args.workers, 1] if rnd % 2 == 0 else [1, args.workers]
            for workers in order:
                work = Path(tmp) / f"r{rnd}-w{workers}"
                work.mkdir()
                # repeats per task so that the run holds `trials` trials (the pack may have several tasks)
                ntasks = tasks_in(runs[workers]) if workers in runs else 1
                run = run_forge(
                    config, repeats=math.ceil(args.trials / ntasks), workers=workers, workdir=work
                )
                runs[workers] = run
                n = len(run.trials())
                ok = run.passed()
                print(
                    f"  round {rnd} workers={workers}: {run.wall:.2f}s, {ok}/{n} passed, rc {run.rc}",
                    file=sys.stderr,
                )
                if run.rc != 0:
                    notes.append(f"workers={workers}: {run.describe_failure()}")
                if left := leftovers(run.run_id):
                    notes.append(f"LEFTOVERS after {run.run_id}: {left}")
                walls[workers].append(run.wall)
                rows.append(
                    {
                        "round": rnd,
                        "workers": workers,
                        "trials": n,
                        "passed": ok,
                        "wall_s": round(run.wall, 2),
                        "per_trial_s": round(run.wall / max(n, 1), 2),
                        "busy_cores": round(run.cpu_busy, 2),
                    }
                )
                profiles[f"r{rnd}-w{workers}"] = profile(run, max(n, 1))
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
        w1, ww = runs[1], runs[args.workers]
        p1, pw = profiles[f"r{args.rounds - 1}-w1"], profiles[f"r{args.rounds - 1}-w{args.workers}"]
        notes += findings(p1, pw, w1, ww, args.workers)
    r = ratio(median(walls[args.workers]), median(walls[1]))
    rows.append({"round": f"ratio wall(workers={args.workers}) / wall(workers=1)", "wall_s": round(r, 3)})
    notes.insert(0, f"ratio {r:.3f} (target <= {TARGET})")
    meta.update(ratio=r, walls=walls, profiles=profiles)
    report(NAME, rows, meta=meta, notes=notes)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
