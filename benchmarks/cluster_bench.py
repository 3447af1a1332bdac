"""Cluster: the driver's overhead per trial on a Ray cluster against a local ``--workers`` run of the same
concurrency, same machine, same run (target ≤ 1.15).

Overhead per trial = (wall x concurrency - Σ trial wall_seconds) / trials: slot time not spent inside a
trial (scheduling, shipping the project and the files, relaying events). The cluster is the tests' own:
a loopback Ray head and two worker nodes, one on this machine's engine and one on a second dockerd
(tests/support/cluster.py), 2 slots each; the local run uses ``--workers 4``. Needs Ray (``.[ray]``).
Size: ``--trials`` (default 8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness as bs

NAME = "cluster"
TARGET = 1.15
SLOTS = 2  # per node; two nodes


def overhead(run: bs.ForgeRun, concurrency: int) -> float:
    trials = run.trials()
    return (run.wall * concurrency - sum(t.wall_seconds for t in trials)) / max(1, len(trials))


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks cluster")
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.cluster import main_engine, start_cluster, start_engine, stop_engine

    concurrency = 2 * SLOTS
    second = start_engine(["forgelib/postgres:15", "forgelib/python:3.11"])
    try:
        cluster = start_cluster([main_engine(), second], slots=SLOTS)
        try:
            with tempfile.TemporaryDirectory(prefix="forge-bench-cluster-") as tmp:
                cfg = bs.config_path()
                for sub in ("local", "cluster"):
                    (Path(tmp) / sub).mkdir()
                local = bs.run_forge(
                    cfg, repeats=args.trials, workers=concurrency, workdir=Path(tmp) / "local"
                )
                remote = bs.run_forge(
                    cfg,
                    repeats=args.trials,
                    workdir=Path(tmp) / "cluster",
                    extra=["--cluster", cluster.address],
                )
                for r in (local, remote):
                    if r.rc != 0:
                        raise SystemExit(r.describe_failure())
                lo, co = overhead(local, concurrency), overhead(remote, concurrency)
                rows = [
                    {"run": f"local --workers {concurrency}", "wall_s": round(local.wall, 2),
                     "overhead_per_trial_s": round(lo, 3)},
                    {"run": f"cluster 2 nodes x {SLOTS}", "wall_s": round(remote.wall, 2),
                     "overhead_per_trial_s": round(co, 3)},
                ]  # fmt: skip
                bs.report(
                    NAME,
                    rows,
                    meta={"trials": args.trials, "ratio": round(bs.ratio(co, lo), 3), "target": TARGET},
                    notes=[
                        f"overhead bs.ratio cluster/local = {bs.ratio(co, lo):.3f} (target <= {TARGET})",
                        f"load average: {bs.loadavg()}",
                    ],
                )
        finally:
            cluster.stop()
    finally:
        stop_engine(second)
