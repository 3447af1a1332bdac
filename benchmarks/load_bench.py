"""Load check (issue 7): many trials of the postgres reference pack, sequential and parallel.

Not a timed test: it reports what held. For each run — a short sequential one (the memory baseline), a long
sequential one, and a parallel one — every trial must have observed the seed's ``baseline`` (so the recipe
fired on every fresh stack), every trial must have had its own compose project (no trial saw another's
stack), nothing labelled with the run may be left afterwards, and the forge process's peak RSS must not
grow with the number of trials (long run's peak minus the short run's).

Size: ``FORGE_BENCH_LOAD_SHORT`` (default 5), ``FORGE_BENCH_LOAD_SEQUENTIAL`` (default 50),
``FORGE_BENCH_LOAD_PARALLEL`` (default 80 trials) at ``FORGE_BENCH_LOAD_WORKERS`` (default 4) — the
issue's "4 workers x 20 trials". Defaults take about 12 minutes on a 2-core machine.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from forgelib.run.results import RecordedTrial

NAME = "load"
GROWTH_LIMIT_MB = 5.0  # "flat": the long run's peak may exceed the short run's by allocator noise only


def _observed(trial: RecordedTrial) -> list[str]:
    return [str(c.observed) for c in trial.checks]


def _row(label: str, workers: int, run: bs.ForgeRun) -> dict[str, Any]:
    trials = run.trials()
    projects = {t.compose_project for t in trials}
    baseline = sum(1 for t in trials if _observed(t) == ["baseline"])
    left = bs.leftovers(run.run_id)
    return {
        "run": label,
        "trials": len(trials),
        "workers": workers,
        "passed": run.passed(),
        "observed_baseline": baseline,
        "distinct_stacks": len(projects - {None}),
        "leftovers": len(left),
        "peak_rss_mb": round(run.peak_rss_kb / 1024, 1),
        "wall_s": round(run.wall, 1),
        "s_per_trial": round(run.wall / max(len(trials), 1), 2),
        "rc": run.rc,
    }


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    short = bs.env_int("FORGE_BENCH_LOAD_SHORT", 5)
    sequential = bs.env_int("FORGE_BENCH_LOAD_SEQUENTIAL", 50)
    parallel = bs.env_int("FORGE_BENCH_LOAD_PARALLEL", 80)
    workers = bs.env_int("FORGE_BENCH_LOAD_WORKERS", 4)
    config = bs.config_path()
    start_load = bs.loadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-load-") as tmp:
        for label, n, w in (
            ("short", short, 1),
            ("sequential", sequential, 1),
            ("parallel", parallel, workers),
        ):
            workdir = Path(tmp) / label
            workdir.mkdir()
            rows.append(_row(label, w, bs.run_forge(config, repeats=n, workers=w, workdir=workdir)))
    growth = rows[1]["peak_rss_mb"] - rows[0]["peak_rss_mb"]
    held = {
        "every trial observed the baseline": all(r["observed_baseline"] == r["trials"] for r in rows),
        "every trial had its own stack": all(r["distinct_stacks"] == r["trials"] for r in rows),
        "zero bs.leftovers": all(r["leftovers"] == 0 for r in rows),
        f"forge's peak RSS flat (growth {growth:+.1f} MB <= {GROWTH_LIMIT_MB} MB)": growth <= GROWTH_LIMIT_MB,
    }
    notes = [f"{'held' if ok else 'FAILED'}: {what}" for what, ok in held.items()]
    doc = bs.report(
        NAME,
        rows,
        meta={"loadavg_start": start_load, "config": str(config), "cpus": os.cpu_count(), "held": held},
        notes=notes,
    )
    if not all(held.values()):
        raise SystemExit(f"{NAME}: " + "; ".join(n for n in notes if n.startswith("FAILED")))
    return doc


if __name__ == "__main__":
    main()
