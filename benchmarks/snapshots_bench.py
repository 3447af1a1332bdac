"""Golden snapshots against the normal fresh path: the same trials of the postgres and cache packs on fresh
stacks with ``--snapshots`` and with ``--no-snapshots``, alternating in one run (after one ``--snapshots``
warm-up trial that takes the golden, timed separately as the one-off capture). Reports per-trial wall
(median of each trial's own wall, ``trial.yaml`` wall_seconds) with ÷ without — targets: postgres pack
≤ 0.6, cache pack ≤ 0.8 — the same less each trial's ``stack_wait`` (on a shared engine, the wait for a
start place other processes' stacks hold), and where each mode's time goes (median of every phase).

A third arm, ``--no-snapshots`` with ``FORGE_READINESS=compose`` (fresh stacks brought up by compose's own
``up --wait``, as before ``forgelib.docker.readiness``), measures what the readiness change alone saves:
fresh per trial with forge's readiness ÷ with compose's, in the same run (``--no-compose-arm`` skips it).

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

from benchmarks import harness as bs
from forgelib.docker.labels import RUN
from forgelib.docker.readiness import READINESS_ENV
from forgelib.run.results import RecordedTrial
from forgelib.runner import SubprocessRunner
from forgelib.stacks.snapshots import store

NAME = "snapshots"
PACKS = {
    "postgres": (bs.REPO / "examples/multi_service_postgres_reset/run_configs/dev.yaml", 0.6),
    "cache": (bs.REPO / "examples/multi_service_cache_debug/run_configs/dev.yaml", 0.8),
}
PHASES = (
    "compose_config", "golden_plan", "up_seeded", "recipe", "golden_capture", "up_rest", "golden_verify",
    "provision", "solve", "grading", "teardown",
)  # fmt: skip
SNAPSHOTS_ON = ("--stacks", "fresh", "--snapshots")
SNAPSHOTS_OFF = ("--stacks", "fresh", "--no-snapshots")


def _all_restored(trial: RecordedTrial) -> bool:
    records = trial.snapshots.values()
    return bool(records) and all(r.get("outcome") == "restored" for r in records)


def _unqueued(trial: RecordedTrial) -> float:
    """The trial's wall less its wait for a stack (``stack_wait``: memory and start places)."""
    return trial.wall_seconds - trial.timings.get("stack_wait", 0.0)


def main(argv: Sequence[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.snapshots_bench", description=__doc__)
    ap.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_SNAPSHOTS_TRIALS", 3))
    ap.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_SNAPSHOTS_ROUNDS", 2))
    ap.add_argument("--packs", default=os.environ.get("FORGE_BENCH_SNAPSHOTS_PACKS", ",".join(PACKS)))
    ap.add_argument("--no-compose-arm", action="store_true", help="skip the compose `up --wait` arm")
    args = ap.parse_args(list(argv))
    packs = [p for p in args.packs.split(",") if p]
    runner = SubprocessRunner()
    runs: set[str] = set()  # the snapshot runs' ids: the goldens removed at the end are theirs alone
    busy = bs.busy_now()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-snapshots-"))
    rows: list[dict[str, Any]] = []
    try:
        for pack in packs:
            config, target = PACKS[pack]  # the warm-up takes the golden (or finds it)
            warmup = bs.checked_run(config, repeats=1, workers=1, root=root, extra=SNAPSHOTS_ON)
            runs.add(warmup.run_id)
            capture = [
                secs
                for t in warmup.trials()
                for k, secs in t.timings.items()
                if k.startswith("golden_capture")
            ]
            with_s: list[RecordedTrial] = []
            without: list[RecordedTrial] = []
            compose_wait: list[RecordedTrial] = []
            for _ in range(args.rounds):  # alternate, so every mode sees the same machine minutes apart
                if not args.no_compose_arm:
                    compose_wait += bs.checked_run(
                        config, repeats=args.trials, workers=1, root=root, extra=SNAPSHOTS_OFF,
                        env={READINESS_ENV: "compose"},
                    ).trials()  # fmt: skip
                without += bs.checked_run(
                    config, repeats=args.trials, workers=1, root=root, extra=SNAPSHOTS_OFF
                ).trials()
                on = bs.checked_run(config, repeats=args.trials, workers=1, root=root, extra=SNAPSHOTS_ON)
                runs.add(on.run_id)  # a discarded golden is captured again by one of these
                with_s += on.trials()
            restored = [t for t in with_s if _all_restored(t)]
            per_with = bs.median([t.wall_seconds for t in with_s])
            per_without = bs.median([t.wall_seconds for t in without])
            r = bs.ratio(per_with, per_without)
            # Without the wait for a start place: on a shared engine other processes' stacks hold them.
            unqueued_with = bs.median([_unqueued(t) for t in with_s])
            unqueued_without = bs.median([_unqueued(t) for t in without])
            per_compose = bs.median([t.wall_seconds for t in compose_wait]) if compose_wait else None
            gain = round(bs.ratio(per_without, per_compose), 3) if per_compose else None
            rows.append(
                {
                    "pack": pack,
                    "trials_per_mode": len(with_s),
                    "restored": f"{len(restored)}/{len(with_s)}",
                    "without_s_per_trial": round(per_without, 2),
                    "with_s_per_trial": round(per_with, 2),
                    "with/without": round(r, 3),
                    "target": f"<= {target} {'OK' if r <= target else 'MISSED'}",
                    "without_start_wait_s_per_trial": f"{unqueued_with:.2f} vs {unqueued_without:.2f}",
                    "with/without_less_start_wait": round(bs.ratio(unqueued_with, unqueued_without), 3),
                    "capture_once_s": round(sum(capture), 2),
                    "without_compose_wait_s_per_trial": round(per_compose, 2) if per_compose else None,
                    "readiness/compose_wait": gain,
                    "phase_medians_compose_wait_s": bs.phase_medians(compose_wait, PHASES)
                    if compose_wait
                    else None,
                    "phase_medians_without_s": bs.phase_medians(without, PHASES),
                    "phase_medians_with_s": bs.phase_medians(with_s, PHASES),
                }
            )
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for g in store.list_goldens(runner):
            if g.labels.get(RUN) in runs:
                store.remove(runner, g, force_untag=True)
    notes = [f"cores busy in the 2 s before: {busy:.2f}; load average {bs.loadavg()}"]
    meta = {"trials": args.trials, "rounds": args.rounds, "packs": packs}
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
