"""Parallelism: the same N trials with ``--workers W`` against ``--workers 1``; wall-time ratio (target ≤ 0.5
for 8 trials, 4 workers, on a 2-core machine), and a profile of what stops it.

The profile comes from what the runs leave behind: each trial's phase timings (``trial.yaml``: how much each
phase stretches under concurrency), and the run's own forge debug log (every external command with its
duration): commands per trial by kind, how many ran at once, how much of the wall time had no command running
at all (Python-side waits: sleeps, locks, polling), and the machine's CPU use (a CPU-bound run cannot go
faster than ``cores / busy-cores-at-W1``).

Size: ``FORGE_BENCH_PARALLEL_TRIALS`` (default 8), ``FORGE_BENCH_PARALLEL_WORKERS`` (default 4), or
``--trials`` / ``--workers``; ``--rounds`` repeats the pair (alternating which goes first). The same trials
as ``shell_baseline.sh`` processes (W at once vs one at a time) give the machine's own ceiling in the same run
(``FORGE_BENCH_PARALLEL_SHELL=0`` or ``--shell 0`` skips it).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import harness as bs

NAME = "parallel"
TARGET = 0.5


def tasks_in(run: bs.ForgeRun) -> int:
    return len({t.task for t in run.trials()}) or 1


def concurrency(commands: Sequence[bs.Command], t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1] with 0, 1, 2, ... external commands running, and the time-weighted mean."""
    events = sorted([(c.start, 1) for c in commands] + [(c.end, -1) for c in commands])
    hist: dict[int, float] = defaultdict(float)
    level, last = 0, t0
    for t, delta in events:
        t = min(max(t, t0), t1)
        hist[level] += t - last
        level, last = level + delta, t
    hist[level] += max(t1 - last, 0.0)
    total = sum(hist.values()) or 1.0
    out: dict[str, float] = {f"{k}_running_s": round(v, 2) for k, v in sorted(hist.items())}
    out["mean_running"] = round(sum(k * v for k, v in hist.items()) / total, 2)
    return out


def max_overlap(commands: Sequence[bs.Command]) -> int:
    events = sorted([(c.start, 1) for c in commands] + [(c.end, -1) for c in commands])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def profile(run: bs.ForgeRun, trials: int) -> dict[str, Any]:
    """What the run spent its time on, from its trial.yaml files and its forge log."""
    commands = bs.read_commands(run.log, run.pid)
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
            "median_s": round(bs.median([c.seconds for c in cs]), 3),
            "max_at_once": max_overlap(cs),
        }
    out["by_kind"] = by_kind
    phases: dict[str, list[float]] = {}
    for t in run.trials():
        for phase, secs in t.timings.items():
            phases.setdefault(phase, []).append(secs)
    out["phase_median_s"] = {k: round(bs.median(v), 3) for k, v in phases.items()}
    out["phase_sum_s"] = {k: round(sum(v), 2) for k, v in phases.items()}
    return out


def findings(
    p1: dict[str, Any], pw: dict[str, Any], w1: bs.ForgeRun, ww: bs.ForgeRun, workers: int, busy_before: float
) -> list[str]:
    """Plain-language observations for the bs.report (the numbers are in the JSON too)."""
    notes = []
    ncpu = os.cpu_count() or 1
    if busy_before > 0.3:
        notes.append(
            f"NOISY: {busy_before:.2f} of {ncpu} cores were busy before the benchmark started (other work on "
            "the machine); the CPU figures below include it"
        )
    trials = max(len(w1.trials()), 1)
    waves = math.ceil(trials / workers)
    notes.append(
        f"floor: {trials} trials on {workers} workers is {waves} wave(s), so even with free CPU the bs.ratio "
        f"cannot go below about {waves / trials:.2f}"
    )
    if w1.cpu_busy > 0:
        bound = w1.cpu_busy / ncpu
        notes.append(
            f"CPU: the machine was {w1.cpu_busy:.2f} of {ncpu} cores busy during workers=1 and "
            f"{ww.cpu_busy:.2f} during workers={workers}; if the trials' work is CPU-bound the bs.ratio "
            f"cannot go below about {bound:.2f}"
        )
        notes.append(
            f"client CPU (forge + docker/compose CLIs): {w1.client_cpu_s / trials:.2f}s per trial at "
            f"workers=1 (forge itself {w1.self_cpu_s / trials:.2f}s), {ww.client_cpu_s / trials:.2f}s at "
            f"workers={workers}; machine busy per trial at workers=1: {w1.cpu_busy * w1.wall / trials:.2f} "
            "CPU-s (the rest is the engine and the containers)"
        )
    for phase, m1 in p1.get("phase_median_s", {}).items():
        mw = pw.get("phase_median_s", {}).get(phase)
        if mw and m1 and mw / m1 > 1.5 and mw > 0.5:
            notes.append(f"phase {phase}: bs.median {m1:.2f}s at workers=1 -> {mw:.2f}s at workers={workers}")
    for kind, st in pw.get("by_kind", {}).items():
        if st["count"] >= 2 * workers and st["median_s"] >= 1.0 and st["max_at_once"] == 1:
            notes.append(f"{kind}: {st['count']} calls never overlapped at workers={workers} (serialised)")
    per_trial = p1.get("commands_per_trial")
    kinds = ", ".join(f"{k} {v['per_trial']:g}" for k, v in p1.get("by_kind", {}).items())
    notes.append(f"external commands per trial: {per_trial} ({kinds})")
    for label, prof in ((f"workers={workers}", pw), ("workers=1", p1)):
        idle = prof.get("concurrency", {}).get("0_running_s")
        if idle is not None:
            notes.append(
                f"{label}: {idle}s of {prof.get('span_with_commands_s')}s with no external command "
                f"running (Python-side sleeps, locks, polling); mean commands in flight "
                f"{prof.get('concurrency', {}).get('mean_running')}"
            )
    return notes


def shell_parallel(trials: int, workers: int, config: Path) -> tuple[float, float, int]:
    """``trials`` shell_baseline.sh runs (a trial each), ``workers`` at once: (wall, busy cores, failed)."""
    from benchmarks.baseline import baseline_for, run_shell

    baseline = baseline_for(config)
    busy0, total0 = bs.cpu_times()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda _: run_shell(baseline), range(trials)))
    wall = time.monotonic() - start
    busy1, total1 = bs.cpu_times()
    busy = (os.cpu_count() or 1) * bs.ratio(busy1 - busy0, total1 - total0)
    return wall, busy, sum(1 for r in results if r.rc != 0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parallel_bench", description=__doc__)
    p.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_PARALLEL_TRIALS", 8))
    p.add_argument("--workers", type=int, default=bs.env_int("FORGE_BENCH_PARALLEL_WORKERS", 4))
    p.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_PARALLEL_ROUNDS", 1))
    p.add_argument("--config", type=Path, default=None, help="run config (default: the postgres pack's dev)")
    p.add_argument(
        "--shell",
        type=int,
        default=bs.env_int("FORGE_BENCH_PARALLEL_SHELL", 1),
        help="1: also run the same trials as shell_baseline.sh processes, W at once vs 1 (the machine's own "
        "parallel ceiling, measured in the same run); 0: skip",
    )
    p.add_argument("--keep", type=Path, default=None, help="copy the runs and their logs here")
    return p.parse_args(list(argv) if argv is not None else [])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = (args.config or bs.config_path()).resolve()
    meta = bs.start_meta(config=str(config), trials=args.trials)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    walls: dict[int, list[float]] = {1: [], args.workers: []}
    profiles: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="forge-bench-parallel-") as tmp:
        runs: dict[int, bs.ForgeRun] = {}
        for rnd in range(args.rounds):
            order = [args.workers, 1] if rnd % 2 == 0 else [1, args.workers]
            for workers in order:
                work = Path(tmp) / f"r{rnd}-w{workers}"
                work.mkdir()
                # repeats per task so that the run holds `trials` trials (the pack may have several tasks)
                ntasks = tasks_in(runs[workers]) if workers in runs else 1
                run = bs.run_forge(
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
                if left := bs.leftovers(run.run_id):
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
        notes += findings(p1, pw, w1, ww, args.workers, meta["busy_before"])
        if args.shell:
            shell_walls: dict[int, float] = {}
            for workers in (args.workers, 1):
                wall, busy, failed = shell_parallel(args.trials, workers, config)
                shell_walls[workers] = wall
                print(f"  shell baseline workers={workers}: {wall:.2f}s, {failed} failed", file=sys.stderr)
                if failed:
                    notes.append(f"shell baseline workers={workers}: {failed} of {args.trials} trials failed")
                rows.append(
                    {
                        "round": "shell_baseline.sh",
                        "workers": workers,
                        "trials": args.trials,
                        "passed": args.trials - failed,
                        "wall_s": round(wall, 2),
                        "per_trial_s": round(wall / max(args.trials, 1), 2),
                        "busy_cores": round(busy, 2),
                    }
                )
            sr = bs.ratio(shell_walls[args.workers], shell_walls[1])
            meta["shell_ratio"] = sr
            notes.append(
                f"shell_baseline.sh, {args.workers} at once vs 1: bs.ratio {sr:.3f} (what this machine "
                "and engine allow without forge)"
            )
    r = bs.ratio(bs.median(walls[args.workers]), bs.median(walls[1]))
    rows.append({"round": f"ratio wall(workers={args.workers}) / wall(workers=1)", "wall_s": round(r, 3)})
    what = f"ratio wall(workers={args.workers}) / wall(workers=1)"
    notes.insert(0, f"{what} {r:.3f}  target <= {TARGET}  {bs.verdict(r, TARGET)}")
    meta.update(ratio=r, walls=walls, profiles=profiles)
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
