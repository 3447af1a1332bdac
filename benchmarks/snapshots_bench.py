"""Golden snapshots against the normal fresh path: the same trials of the postgres and cache packs on fresh
stacks with ``--snapshots`` and with ``--no-snapshots``, alternating in one run (after one ``--snapshots``
warm-up trial that takes the golden, timed separately as the one-off capture). Reports per-trial wall
(median of each trial's own wall, ``trial.yaml`` wall_seconds) with ÷ without — targets: postgres pack
≤ 0.6, cache pack ≤ 0.8 — and where each mode's time goes (median of every phase).

Size: ``FORGE_BENCH_SNAPSHOTS_TRIALS`` (3) / ``--trials`` per run, ``FORGE_BENCH_SNAPSHOTS_ROUNDS`` (2) /
``--rounds`` (each round one run per mode), ``FORGE_BENCH_SNAPSHOTS_PACKS`` (postgres,cache) / ``--packs``.
The goldens it takes are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.phases_bench import (
    REPO,
    ForgeRun,
    busy_now,
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
from forgelib.runner import SubprocessRunner
from forgelib.snapshots import store

NAME = "snapshots"
PACKS = {
    "postgres": (REPO / "examples/multi_service_postgres_reset/run_configs/dev.yaml", 0.6),
    "cache": (REPO / "examples/multi_service_cache_debug/run_configs/dev.yaml", 0.8),
}
PHASES = (
    "compose_config", "golden_plan", "up_seeded", "recipe", "golden_capture", "up_rest", "golden_verify",
    "provision", "oracle", "grading", "teardown",
)  # fmt: skip


def _run(config: Path, flag: str, trials: int, root: Path) -> ForgeRun:
    work = Path(tempfile.mkdtemp(prefix=f"{flag.strip('-')}-", dir=root))
    run = run_forge(config, repeats=trials, workers=1, workdir=work, extra=["--stacks", "fresh", flag])
    if run.rc != 0 or run.passed() != trials:
        raise SystemExit(f"{config} {flag}: {run.describe_failure()}")
    left = leftovers(run.run_id)
    if left:
        raise SystemExit(f"{run.run_id} left {left}")
    return run


def _phases(trials: list[dict[str, Any]]) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for t in trials:
        sums: dict[str, float] = {}
        for name, secs in trial_timings(t).items():
            kind = name.split(":", 1)[0]
            if kind in PHASES:
                sums[kind] = sums.get(kind, 0.0) + secs
        for k, v in sums.items():
            per.setdefault(k, []).append(v)
    return {k: round(median(per[k]), 3) for k in PHASES if k in per}


def _all_restored(trial: dict[str, Any]) -> bool:
    records = (trial.get("snapshots") or {}).values()
    return bool(records) and all(r.get("outcome") == "restored" for r in records)


def main(argv: Sequence[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.snapshots_bench", description=__doc__)
    ap.add_argument("--trials", type=int, default=env_int("FORGE_BENCH_SNAPSHOTS_TRIALS", 3))
    ap.add_argument("--rounds", type=int, default=env_int("FORGE_BENCH_SNAPSHOTS_ROUNDS", 2))
    ap.add_argument("--packs", default=os.environ.get("FORGE_BENCH_SNAPSHOTS_PACKS", ",".join(PACKS)))
    args = ap.parse_args(list(argv))
    packs = [p for p in args.packs.split(",") if p]
    runner = SubprocessRunner()
    before = {g.id for g in store.list_goldens(runner)}
    busy = busy_now()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-snapshots-"))
    rows: list[dict[str, Any]] = []
    try:
        for pack in packs:
            config, target = PACKS[pack]
            warmup = _run(config, "--snapshots", 1, root)  # takes the golden (or finds it)
            capture = [
                secs
                for t in warmup.trials()
                for k, secs in trial_timings(t).items()
                if k.startswith("golden_capture")
            ]
            with_s: list[dict[str, Any]] = []
            without: list[dict[str, Any]] = []
            for _ in range(args.rounds):  # alternate, so both modes see the same machine minutes apart
                without += _run(config, "--no-snapshots", args.trials, root).trials()
                with_s += _run(config, "--snapshots", args.trials, root).trials()
            restored = [t for t in with_s if _all_restored(t)]
            per_with = median([trial_total(t) for t in with_s])
            per_without = median([trial_total(t) for t in without])
            r = ratio(per_with, per_without)
            rows.append(
                {
                    "pack": pack,
                    "trials_per_mode": len(with_s),
                    "restored": f"{len(restored)}/{len(with_s)}",
                    "without_s_per_trial": round(per_without, 2),
                    "with_s_per_trial": round(per_with, 2),
                    "with/without": round(r, 3),
                    "target": f"<= {target} {'OK' if r <= target else 'MISSED'}",
                    "capture_once_s": round(sum(capture), 2),
                    "phase_medians_without_s": _phases(without),
                    "phase_medians_with_s": _phases(with_s),
                }
            )
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for g in store.list_goldens(runner):
            if g.id not in before:
                store.remove(runner, g, force_untag=True)
    notes = [f"cores busy in the 2 s before: {busy:.2f}; load average {loadavg()}"]
    meta = {"trials": args.trials, "rounds": args.rounds, "packs": packs}
    return report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
