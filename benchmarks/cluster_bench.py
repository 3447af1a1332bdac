"""Cluster: the driver's overhead per trial on a Ray cluster against a local ``--workers`` run of the same
concurrency, same machine, same run (target ≤ 1.15).

Overhead per trial = (wall x concurrency - Σ trial wall_seconds) / trials: slot time not spent inside a
trial (start-up, scheduling, shipping the project and the files, relaying events, waiting for the last
trial). The cluster is the tests' own: a loopback Ray head and two worker nodes, one on this machine's
engine and one on a second dockerd (tests/support/cluster.py), 2 slots each; the local run uses
``--workers 4``. The first cluster run on a fresh cluster starts its slot actors ("cold"); the runs after
it reuse them ("warm", what a standing cluster serves). ``--rounds`` local/warm pairs alternate so load
drifts hit both; the ratio is warm over local, each summed over its rounds.

Where the overhead goes, per run: ``pre`` (spawn → ``run_started``: imports, joining the cluster or
healing leftovers locally, shipping the project), ``idle`` (slot time inside the run not spent in a trial:
waiting for the last trial of a wave, hand-offs), ``post`` (``run_finished`` → exit); and per cluster trial,
from the driver's debug log: sent → entered on the node, the project from the slot's cache, the files tar
and the way back. Needs Ray (``.[ray]``). Size: ``--trials`` (default 8), ``--rounds`` (default 2).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs

NAME = "cluster"
TARGET = 1.15
SLOTS = 2  # per node; two nodes
CONCURRENCY = 2 * SLOTS
_MARK = re.compile(r"cluster trial \S+ on \S+: sent (\S+), back (\S+), node marks (.*)$")


def overhead(run: bs.ForgeRun, concurrency: int = CONCURRENCY) -> float:
    trials = run.trials()
    return (run.wall * concurrency - sum(t.wall_seconds for t in trials)) / max(1, len(trials))


def phases(run: bs.ForgeRun, spawned: float) -> dict[str, float]:
    """Seconds of one run: pre (spawn → run_started), idle slot time per trial, post (run_finished → exit)."""
    assert run.run_dir is not None
    events = [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]
    started, finished = events[0]["ts"], events[-1]["ts"]
    trials = run.trials()
    busy = sum(t.wall_seconds for t in trials)
    return {
        "pre_s": round(started - spawned, 2),
        "idle_per_trial_s": round(((finished - started) * CONCURRENCY - busy) / max(1, len(trials)), 2),
        "post_s": round(spawned + run.wall - finished, 2),
    }


def node_marks(run: bs.ForgeRun) -> dict[str, float]:
    """Mean seconds per cluster trial of each hand-off step (from the driver's debug log)."""
    steps: dict[str, list[float]] = {}
    for line in run.log.read_text(errors="replace").splitlines():
        m = _MARK.search(line)
        if not m:
            continue
        sent, back, marks = float(m.group(1)), float(m.group(2)), ast.literal_eval(m.group(3))
        if "entered" not in marks or "cleaned" not in marks:
            continue
        keys = ("entered", "project", "trial_start", "trial_end", "tarred", "cleaned")
        seq = [("sent", sent), *((k, marks[k]) for k in keys), ("back", back)]
        for (a, x), (b, y) in itertools.pairwise(seq):
            if a != "trial_start":  # the trial itself is not overhead
                steps.setdefault(f"{a}->{b}", []).append(y - x)
    return {k: round(statistics.mean(v), 3) for k, v in steps.items()}


def timed(
    cfg: Path, trials: int, workdir: Path, extra: Sequence[str] = (), workers: int | None = None
) -> tuple[bs.ForgeRun, float]:
    workdir.mkdir(parents=True)
    spawned = time.time()
    run = bs.run_forge(cfg, repeats=trials, workers=workers, workdir=workdir, extra=extra)
    if run.rc != 0:
        raise SystemExit(run.describe_failure())
    return run, spawned


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks cluster")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.cluster import start_engine_and_cluster, stop_engine

    load_start = bs.start_meta()
    t = time.monotonic()
    (_, second), cluster = start_engine_and_cluster(["forgelib/postgres:15", "forgelib/python:3.11"], SLOTS)
    cluster_start = time.monotonic() - t
    try:
        try:
            with tempfile.TemporaryDirectory(prefix="forge-bench-cluster-") as tmp:
                cfg, on = bs.config_path(), ["--cluster", cluster.address]
                runs: list[tuple[str, bs.ForgeRun, float]] = []
                runs.append(("cluster cold", *timed(cfg, args.trials, Path(tmp) / "cold", on)))
                for i in range(args.rounds):
                    local = timed(cfg, args.trials, Path(tmp) / f"local{i}", workers=CONCURRENCY)
                    runs.append((f"local --workers {CONCURRENCY}", *local))
                    runs.append(("cluster warm", *timed(cfg, args.trials, Path(tmp) / f"warm{i}", on)))
                rows: list[dict[str, Any]] = []
                for label, run, spawned in runs:
                    row = {
                        "run": label,
                        "wall_s": round(run.wall, 2),
                        "overhead_per_trial_s": round(overhead(run), 3),
                    }
                    rows.append({**row, **phases(run, spawned)})
                lo = statistics.mean(r["overhead_per_trial_s"] for r in rows if r["run"].startswith("local"))
                warm = statistics.mean(r["overhead_per_trial_s"] for r in rows if r["run"] == "cluster warm")
                cold = rows[0]["overhead_per_trial_s"]
                marks = {label: node_marks(run) for label, run, _ in runs if label.startswith("cluster")}
                bs.report(
                    NAME,
                    rows,
                    meta={
                        "trials": args.trials,
                        "rounds": args.rounds,
                        "ratio": round(bs.ratio(warm, lo), 3),
                        "ratio_cold": round(bs.ratio(cold, lo), 3),
                        "target": TARGET,
                        **load_start,
                        "cluster_start_s": round(cluster_start, 1),
                        "node_marks": marks,
                    },
                    notes=[
                        f"overhead ratio cluster (warm slots) / local = {bs.ratio(warm, lo):.3f} "
                        f"(target <= {TARGET})",
                        f"first run on the fresh cluster (starts its slots): {bs.ratio(cold, lo):.3f}",
                        f"hand-off steps per cluster trial, mean s: {marks}",
                        f"second engine + cluster start (head, 2 nodes): {cluster_start:.1f} s",
                        f"load average: {bs.loadavg()}",
                    ],
                )
        finally:
            cluster.stop()
    finally:
        stop_engine(second)


if __name__ == "__main__":
    main(sys.argv[1:])
