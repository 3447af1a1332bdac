"""Warm stacks against fresh ones: the same 8 trials of each reference pack with ``--stacks fresh`` and then
``--stacks warm``, at ``--workers 1`` and ``--workers 4``, in one run. Reports, warm ÷ fresh (target ≤ 0.2):

* **run**: the run's wall ÷ its trials — everything included: forge's start, the first (fresh) provisioning of
  each warm stack, the final teardown;
* **trial**: the median trial wall (``wall_seconds`` + its ``teardown``, like for like: a fresh trial's
  ``down`` against a warm trial's release) of the trials that reused a stack, against all fresh trials';
* **held**: the same without the time a reused trial queued for a busy stack (``stack_wait``: at workers > 1
  the pool may hold fewer stacks than workers, when waiting ends the run sooner than provisioning).

Also the in-place reset step's median per reset service (target ≤ 0.1 s for postgres and redis, ≤ 0.2 s for
the endpoint pack's tree), and where a reused warm trial's time goes (median of each phase).

Readiness of a recreated ephemeral service (``--readiness`` rounds, default 5; 0 skips): on a kept stack of
the postgres pack, ``up --no-deps --force-recreate --wait runner`` (compose polls health at the healthcheck
interval) against the same ``up`` without ``--wait`` followed by forge's probe (the container's healthcheck
command through ``docker exec`` every 50 ms), interleaved.

Postgres reset strategies (``--strategies``, default "exact,template"): each warm run once per strategy,
against the same fresh run; a pack's sql_dump services get ``reset: {strategy: S}`` in a copy of the pack
(``exact`` is the default and runs the pack as it is). Every row names its strategy.

Restore in place (issue 41), from the same runs: each reset service's ``reset:<svc>`` on the reused trials,
by its seed's kind, against the goals (postgres ≤ 0.5 s, redis and a tree ≤ 0.2 s), and the trial ratio of
the default strategy (``exact``) against ≤ 0.25; one row per pack and worker count, with n (reused trials).

Warm stacks from goldens (``--goldens ROUNDS``, default 0: skipped): per pack and worker count, one
``--stacks warm --snapshots`` trial takes the goldens (as a user re-running a task has them; not measured),
then ``--stacks warm --no-snapshots`` and ``--stacks warm --snapshots`` runs alternate ROUNDS times: the run's
wall ÷ trials and the median wall of the trials that provisioned their warm stack, goldens ÷ without, and
how many of those started from a golden. The goldens these runs take are removed at the end. With
``--strategies ""`` only this (no fresh run).

Size: ``FORGE_BENCH_WARM_TRIALS`` (8) / ``--trials``, ``FORGE_BENCH_WARM_WORKERS`` ("1,4") / ``--workers``,
``FORGE_BENCH_WARM_PACKS`` (all three) / ``--packs``, ``FORGE_BENCH_WARM_STRATEGIES`` / ``--strategies``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from forgelib.docker.images import ImageFacts
from forgelib.docker.labels import RUN
from forgelib.docker.readiness import PROBE_INTERVAL
from forgelib.runner import SubprocessRunner
from forgelib.spec.loader import load_project_config
from forgelib.stacks.snapshots import store

NAME = "warm"
TARGET = 0.2
PACKS = {
    "postgres": bs.REPO / "examples/multi_service_postgres_reset/run_configs/dev.yaml",
    "cache": bs.REPO / "examples/multi_service_cache_debug/run_configs/dev.yaml",
    "endpoint": bs.REPO / "examples/multi_service_endpoint_add/run_configs/dev.yaml",
}
RESET_TARGET = {"postgres": 0.1, "cache": 0.1, "endpoint": 0.2}
# Issue 41: a kind's restore of a live service, and a reused trial in the default (exact) mode.
RESTORE_GOAL = {"sql_dump": 0.5, "redis_dump": 0.2, "filesystem_dir": 0.2}
RESTORE_TRIAL_GOAL = 0.25
# Phases of a reused warm trial, in the order they happen (teardown = the release: ephemerals killed).
# A warm stack's first provisioning (with goldens: plan, verify, no recipe for what is restored).
FIRST_PHASES = (
    *("stack_wait", "compose_config", "golden_plan", "up_seeded", "recipe", "golden_capture"),
    *("golden_verify", "warm_prepare", "up_rest", "provision", "solve", "grading"),
)
WARM_PHASES = (
    "stack_wait",
    *("reset", "fingerprint", "successors", "recreate", "ready", "solve", "grading", "capture_logs"),
    *("record", "teardown"),
)


def _trial_walls(run: bs.ForgeRun, *, reused: bool | None = None, queued: bool = True) -> list[float]:
    """Each trial's wall with its teardown (``reused``: only trials that did / did not reuse a stack;
    ``queued=False``: without the time it queued for a busy stack, ``stack_wait``, i.e. what the trial
    cost while it held one)."""
    out = []
    for t in run.trials():
        if reused is not None and bool(t.stack.get("reuse")) != reused:
            continue
        wait = 0.0 if queued else t.timings.get("stack_wait", 0.0)
        out.append(t.wall_seconds + t.timings.get("teardown", 0.0) - wait)
    return out


def _kinds(config: Path) -> dict[str, str]:
    """service -> the kind of the seed its reset binds, in ``config``'s pack."""
    project = load_project_config(config.parents[1] / "project.yaml")
    return {
        name: str(project.seeds[svc.reset.seed].kind)
        for name, svc in project.environment.services.items()
        if svc.reset is not None and svc.reset.seed in project.seeds
    }


def _restore_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default strategy's rows as issue 41 reads them: each reset's median by kind, the trial ratio."""
    out = []
    for r in rows:
        if r.get("strategy") != "exact" or "reset_median_s" not in r:
            continue
        kinds = _kinds(PACKS[r["pack"]])
        restores = {f"{kinds.get(k.split(':', 1)[1], '?')} ({k})": v for k, v in r["reset_median_s"].items()}
        met = all(
            v <= RESTORE_GOAL.get(kinds.get(k.split(":", 1)[1], ""), 0.0)
            for k, v in r["reset_median_s"].items()
        )
        ratio = r["trial warm/fresh"]
        out.append(
            {
                "pack": f"restore in place: {r['pack']}",
                "workers": r["workers"],
                "n (reused trials)": r["reused_trials"],
                "restore_median_s": restores,
                "restore_goal": f"{'OK' if met else 'MISSED'} (postgres <= 0.5, redis/tree <= 0.2)",
                "trial warm/fresh": ratio,
                "trial_goal": f"<= {RESTORE_TRIAL_GOAL} {'OK' if ratio <= RESTORE_TRIAL_GOAL else 'MISSED'}",
            }
        )
    return out


def _readiness(rounds: int) -> dict[str, Any]:
    """compose ``--wait`` against forge's probe, recreating the postgres pack's runner on a kept stack."""
    pack = PACKS["postgres"].parent.parent
    out = subprocess.run(
        [*bs.FORGE_ARGV, "provision", "--project", str(pack), "--keep", "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    name = json.loads(out.stdout)["name"]
    override = Path(json.loads(out.stdout)["trial_dir"]) / "compose.forge.yaml"
    compose = [
        "docker",
        "compose",
        "--project-name",
        name,
        "--file",
        str(pack / "shared/environment.compose.yaml"),
    ]
    compose += ["--file", str(override)]
    env = {**os.environ, **ImageFacts().env(SubprocessRunner())}
    up = [*compose, "up", "--detach", "--no-deps", "--force-recreate", "runner"]
    waited, probed = [], []
    try:
        for _ in range(rounds):
            t0 = time.monotonic()
            subprocess.run([*up, "--wait"], env=env, cwd=pack, capture_output=True, check=True, timeout=300)
            waited.append(time.monotonic() - t0)
            t0 = time.monotonic()
            subprocess.run(up, env=env, cwd=pack, capture_output=True, check=True, timeout=300)
            probe = ["docker", "exec", f"{name}-runner-1", "test", "-d", "/work"]  # the runner's healthcheck
            while subprocess.run(probe, capture_output=True, check=False, timeout=60).returncode != 0:
                time.sleep(PROBE_INTERVAL)
            probed.append(time.monotonic() - t0)
    finally:
        subprocess.run(
            [*bs.FORGE_ARGV, "teardown", "--name", name], capture_output=True, check=False, timeout=300
        )
    return {
        "pack": "readiness (postgres runner)",
        "compose_wait_median_s": round(bs.median(waited), 3),
        "up_then_probe_median_s": round(bs.median(probed), 3),
        "probe/wait": round(bs.ratio(bs.median(probed), bs.median(waited)), 3),
        "rounds": rounds,
    }


def _with_goldens(
    pack: str, workers: int, rounds: int, trials: int, root: Path, runs: set[str]
) -> dict[str, Any]:
    """``--stacks warm`` with and without goldens, alternated (see the module's docstring)."""
    config = PACKS[pack]
    on_args, off_args = ["--stacks", "warm", "--snapshots"], ["--stacks", "warm", "--no-snapshots"]
    prime = bs.checked_run(config, repeats=1, workers=1, root=root, extra=on_args)
    runs.add(prime.run_id)
    arms: dict[str, list[bs.ForgeRun]] = {"without": [], "goldens": []}
    for _ in range(rounds):
        arms["without"].append(
            bs.checked_run(config, repeats=trials, workers=workers, root=root, extra=off_args)
        )
        on = bs.checked_run(config, repeats=trials, workers=workers, root=root, extra=on_args)
        runs.add(on.run_id)
        arms["goldens"].append(on)

    def firsts(runs_: list[bs.ForgeRun]) -> list[Any]:
        return [t for r in runs_ for t in r.trials() if not t.stack.get("reuse")]

    per = {k: bs.median([r.wall / max(1, len(r.trials())) for r in v]) for k, v in arms.items()}
    first = {k: bs.median([t.wall_seconds for t in firsts(v)]) for k, v in arms.items()}
    restored = [
        t for t in firsts(arms["goldens"]) if t.snapshots and all(
            rec.get("outcome") == "restored" for rec in t.snapshots.values()
        )
    ]  # fmt: skip
    return {
        "pack": pack,
        "goldens": "warm --snapshots vs warm",
        "workers": workers,
        "runs_per_arm": rounds,
        "warm_s_per_trial": round(per["without"], 2),
        "warm_goldens_s_per_trial": round(per["goldens"], 2),
        "run goldens/without": round(bs.ratio(per["goldens"], per["without"]), 3),
        "first_trial_median_s": f"{first['goldens']:.2f} vs {first['without']:.2f}",
        "first trial goldens/without": round(bs.ratio(first["goldens"], first["without"]), 3),
        "restored": f"{len(restored)}/{len(firsts(arms['goldens']))}",
        "first_trial_phase_medians_goldens_s": bs.phase_medians(firsts(arms["goldens"]), FIRST_PHASES),
        "first_trial_phase_medians_without_s": bs.phase_medians(firsts(arms["without"]), FIRST_PHASES),
    }


def main(argv: Sequence[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.warm_bench", description=__doc__)
    ap.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_WARM_TRIALS", 8))
    ap.add_argument("--workers", default=os.environ.get("FORGE_BENCH_WARM_WORKERS", "1,4"))
    ap.add_argument("--packs", default=os.environ.get("FORGE_BENCH_WARM_PACKS", ",".join(PACKS)))
    ap.add_argument("--readiness", type=int, default=bs.env_int("FORGE_BENCH_WARM_READINESS", 5))
    ap.add_argument("--strategies", default=os.environ.get("FORGE_BENCH_WARM_STRATEGIES", "exact,template"))
    ap.add_argument(
        "--goldens", type=int, default=0, help="rounds of warm with and without goldens (0: none)"
    )
    args = ap.parse_args(list(argv))
    strategies = [s for s in args.strategies.split(",") if s]
    workers = [int(w) for w in args.workers.split(",") if w]
    packs = [p for p in args.packs.split(",") if p]
    busy = bs.busy_now()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-warm-"))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    golden_runs: set[str] = set()  # the goldens removed at the end are these runs' alone
    try:
        if args.readiness:
            rows.append(_readiness(args.readiness))
            print(rows[-1], file=sys.stderr, flush=True)
        for pack in packs:
            for w in workers:
                if args.goldens:
                    rows.append(_with_goldens(pack, w, args.goldens, args.trials, root, golden_runs))
                    print(rows[-1], file=sys.stderr, flush=True)
                if not strategies:
                    continue
                # Fresh first, then warm: the same images, the same machine minutes apart.
                fresh = bs.checked_run(
                    PACKS[pack], repeats=args.trials, workers=w, root=root, extra=["--stacks", "fresh"]
                )
                for strategy in strategies:
                    warm = bs.checked_run(
                        bs.with_strategy(PACKS[pack], strategy, root),
                        repeats=args.trials,
                        workers=w,
                        root=root,
                        extra=["--stacks", "warm"],
                    )
                    # Per trial of the run: a pack with several tasks runs --repeats of each (cache: 2 tasks).
                    per_fresh = fresh.wall / max(1, len(fresh.trials()))
                    per_warm = warm.wall / max(1, len(warm.trials()))
                    trial_fresh = bs.median(_trial_walls(fresh))
                    reused = _trial_walls(warm, reused=True)
                    trial_warm = bs.median(reused) if reused else float("nan")
                    held = _trial_walls(warm, reused=True, queued=False)
                    trial_held = bs.median(held) if held else float("nan")
                    phases = bs.phase_medians(
                        [t for t in warm.trials() if t.stack.get("reuse")],
                        WARM_PHASES,
                        each=("reset", "fingerprint"),
                    )
                    resets = {k: v for k, v in phases.items() if k.startswith("reset:")}
                    ok = bs.ratio(per_warm, per_fresh) <= TARGET
                    trial_ok = bs.ratio(trial_warm, trial_fresh) <= TARGET
                    reset_ok = all(v <= RESET_TARGET[pack] for v in resets.values())
                    rows.append(
                        {
                            "pack": pack,
                            "strategy": strategy,
                            "workers": w,
                            "fresh_s_per_trial": round(per_fresh, 2),
                            "warm_s_per_trial": round(per_warm, 2),
                            "warm/fresh": round(bs.ratio(per_warm, per_fresh), 3),
                            "target": f"<= {TARGET} {'OK' if ok else 'MISSED'}",
                            "fresh_trial_median_s": round(trial_fresh, 2),
                            "warm_reused_trial_median_s": round(trial_warm, 2),
                            "reused_trials": len(reused),
                            "trial warm/fresh": round(bs.ratio(trial_warm, trial_fresh), 3),
                            "trial_target": f"<= {TARGET} {'OK' if trial_ok else 'MISSED'}",
                            # workers > stacks: a reused trial may queue for a stack; without that queueing
                            "held warm/fresh": round(bs.ratio(trial_held, trial_fresh), 3),
                            "reset_median_s": resets,
                            "reset_target": f"<= {RESET_TARGET[pack]} {'OK' if reset_ok else 'MISSED'}",
                            "replaced": warm.state.stacks_replaced if warm.state else None,
                            "reused_trial_phase_medians_s": phases,
                        }
                    )
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        runner = SubprocessRunner()
        for g in store.list_goldens(runner) if golden_runs else []:
            if g.labels.get(RUN) in golden_runs:
                store.remove(runner, g, force_untag=True)
    for row in _restore_rows(rows):
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    notes.append(f"cores busy in the 2 s before: {busy:.2f}; load average {bs.loadavg()}")
    meta = {"trials": args.trials, "workers": workers, "packs": packs, "strategies": strategies}
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
