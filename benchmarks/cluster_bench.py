"""Cluster: the driver's overhead per trial on a Ray cluster against a local ``--workers`` run of the same
concurrency, same machine, same run (target ≤ 1.15).

Overhead per trial = (wall x concurrency - Σ trial wall_seconds) / trials: slot time not spent inside a
trial (start-up, scheduling, shipping the project and the files, relaying events, each trial's teardown,
which follows its ``wall_seconds``, waiting for the last trial). Part of it is fixed per run (start-up, exit,
the last wave's tail) and part grows with each trial (teardowns, hand-offs), so the ratio depends on the
run's size: it is measured at each size of ``--trials`` (default 8 and 32), with each mode's start-up + exit
(seconds once per run) and idle slot time per trial beside it.

The cluster is the tests' own: a loopback Ray head and two worker nodes, one on this machine's engine and
one on a second dockerd (tests/support/cluster.py), 2 slots each; the local run uses ``--workers 4``. The
first cluster run on a fresh cluster starts its slot actors ("cold"); the runs after it reuse them ("warm",
what a standing cluster serves). ``--rounds`` (default 2) local/warm pairs per size run in ABBA order (every
other pair runs the cluster first) so a drift of the box's speed hits both; the ratio is warm over local,
each averaged over its rounds.

Where the overhead goes, per run: ``pre`` (spawn → ``run_started``: imports, joining the cluster or
healing leftovers locally, shipping the project), ``idle`` (slot time inside the run not spent in a trial:
teardowns, waiting for the last trial of a wave, hand-offs), ``post`` (``run_finished`` → exit); and per
cluster trial, from the driver's debug log: sent → entered on the node, the project from the slot's cache,
the files tar and the way back. Needs Ray (``.[ray]``).

``--stacks warm``: both modes run ``--stacks warm`` (a warm stack per slot / worker, reset in place between
trials), so the ratio is cluster warm over local warm at the same concurrency; a third arm, the cluster with
fresh stacks, runs beside them at the sizes of ``--fresh-trials`` (default the smallest size: a fresh
150-trial run takes ~10 min here), each round in ABC/CBA order, for cluster warm ÷ cluster fresh: the
run's slot time per trial (wall x concurrency / trials: everything, the warm stacks' first provisioning
and final teardown included), and the mean trial seconds. ``--strategy template`` runs every arm on a copy
of the pack whose postgres service resets with ``strategy: template`` (the opt-in fast reset; the default,
``exact``, runs the pack as it is).
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
    # rc 1 with every trial on record: some trials failed (on a loaded box, a healthcheck answering late);
    # the run still measures its overhead, and its row says how many passed.
    if run.rc != 0 and not (run.rc == 1 and len(run.trials()) == trials and run.summary):
        raise SystemExit(run.describe_failure())
    return run, spawned


ARMS = {"cold": "cluster cold", "local": f"local --workers {CONCURRENCY}", "cluster": "cluster warm",
        "fresh": "cluster, fresh stacks"}  # fmt: skip
FRESH_TARGET = 0.3  # cluster warm stacks / cluster fresh stacks, slot time per trial


def summarize(rows: list[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """The ratio cluster (warm slots) / local at each run size, and where each mode's overhead goes: start-up
    + exit (``pre`` + ``post``, seconds once per run, on every slot) and slot time idle per trial; with a
    ``fresh`` arm (``--stacks warm`` runs), cluster warm stacks / cluster fresh stacks at its sizes."""
    # Each run's mean trial seconds, from the overhead's own terms: Σ wall_seconds / trials.
    rows = [
        {**r, "trial_s": r["wall_s"] * CONCURRENCY / r["trials"] - r["overhead_per_trial_s"]} for r in rows
    ]

    def mean(arm: str, keys: Sequence[str], n: int | None = None) -> float:
        """Mean over ``arm``'s runs (of ``n`` trials, or all) of each run's ``keys`` summed."""
        return float(
            statistics.mean(
                sum(r[k] for k in keys) for r in rows if r["arm"] == arm and n in (None, r["trials"])
            )
        )

    def ratios(keys: Sequence[str], over: str = "local", at: Sequence[int] = sizes) -> dict[int, float]:
        """Cluster (warm slots) over ``over``, of ``keys`` summed, at each run size of ``at``."""
        return {n: round(bs.ratio(mean("cluster", keys, n), mean(over, keys, n)), 3) for n in at}

    def by_mode_and_size(key: str) -> dict[int, dict[str, float]]:
        """Each mode's mean ``key`` at each run size: {n: {"local": ..., "cluster": ...}}."""
        return {n: {m: round(mean(m, (key,), n), 2) for m in ("local", "cluster")} for n in sizes}

    per_trial = ("overhead_per_trial_s",)
    by_size = ratios(per_trial)
    # The part of the overhead that grows with the run (idle slot time per trial: teardowns, hand-offs)
    # apart from the part paid once per run (start-up + exit), which the all-in ratio spreads over its
    # trials: at 1,500 trials only the first matters.
    idle_by_size = ratios(("idle_per_trial_s",))
    # The trials themselves are outside the overhead: a node whose trial runs slower than a local one shows
    # here and in the wall, not in the ratios above.
    trial_s = by_mode_and_size("trial_s")
    wall_by_size = ratios(("wall_s",))
    cold = next(r for r in rows if r["arm"] == "cold")
    out: dict[str, Any] = {
        "trial_s": trial_s,
        "wall_ratio_by_trials": wall_by_size,
        "ratio_by_trials": by_size,
        "ratio": by_size[max(sizes)],
        "idle_ratio_by_trials": idle_by_size,
        # None when no local run has the cold run's size (``--cold-trials``)
        "ratio_cold": round(bs.ratio(cold[per_trial[0]], mean("local", per_trial, cold["trials"])), 3)
        if any(r["arm"] == "local" and r["trials"] == cold["trials"] for r in rows)
        else None,
        "start_exit_s": {mode: round(mean(mode, ("pre_s", "post_s")), 2) for mode in ("local", "cluster")},
        "idle_per_trial_s": by_mode_and_size("idle_per_trial_s"),
    }
    fresh_sizes = sorted({r["trials"] for r in rows if r["arm"] == "fresh"})
    if fresh_sizes:
        # Slot time per trial (wall x concurrency / trials) is the run's wall per trial: what a user waits.
        out["fresh_ratio_by_trials"] = ratios(("wall_s",), over="fresh", at=fresh_sizes)
        out["fresh_trial_ratio_by_trials"] = ratios(("trial_s",), over="fresh", at=fresh_sizes)
        out["fresh_slot_s_per_trial"] = {
            n: {m: round(mean(m, ("wall_s",), n) * CONCURRENCY / n, 2) for m in ("cluster", "fresh")}
            for n in fresh_sizes
        }
    return out


def order(arms: Sequence[str], round_: int) -> list[str]:
    """ABBA (ABC CBA ...): every other round runs the arms backwards, so a drift of the box's speed over the
    run (150-trial runs here slowed 493 -> 580 -> 576 -> 653 s in L C L C order) does not always fall on the
    arm that runs last."""
    return list(arms) if round_ % 2 == 0 else list(arms)[::-1]


def measure(
    tmp: Path,
    address: str,
    sizes: Sequence[int],
    rounds: int,
    stacks: str = "fresh",
    fresh_sizes: Sequence[int] = (),
    cold_trials: int | None = None,
    strategy: str = "exact",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A cold cluster run, then ``rounds`` alternating local/cluster rounds per run size (with the cluster
    fresh-stack arm at ``fresh_sizes``): their rows, and the cluster runs' hand-off steps. ``strategy``: the
    pack's postgres reset strategy (every arm runs the same copy; only warm stacks reset)."""
    cfg, on = bs.with_strategy(bs.config_path(), strategy, tmp), ["--cluster", address]
    mode = ["--stacks", stacks]
    cold = cold_trials or sizes[0]
    runs = [("cold", cold, *timed(cfg, cold, tmp / "cold", [*on, *mode]), bs.loadavg())]
    for n in sizes:
        arms = ["local", "cluster"] + (["fresh"] if stacks == "warm" and n in fresh_sizes else [])
        for i in range(rounds):
            for arm in order(arms, i):
                extra = {"local": mode, "cluster": [*on, *mode], "fresh": [*on, "--stacks", "fresh"]}[arm]
                workers = CONCURRENCY if arm == "local" else None
                runs.append((arm, n, *timed(cfg, n, tmp / f"{arm}{n}-{i}", extra, workers), bs.loadavg()))
                print(f"  {ARMS[arm]} {n} trials: {runs[-1][2].wall:.1f} s (load {runs[-1][4]})", flush=True)
    rows: list[dict[str, Any]] = [
        {
            "run": ARMS[arm],
            "arm": arm,
            "stacks": "fresh" if arm == "fresh" else stacks,
            "trials": n,
            "passed": run.passed(),
            "wall_s": round(run.wall, 2),
            "overhead_per_trial_s": round(overhead(run), 3),
            **phases(run, spawned),
            "busy_cores": round(run.cpu_busy, 2),  # the machine's, averaged over the run
            "load1_end": float(load.split()[0]) if load != "?" else None,
        }
        for arm, n, run, spawned, load in runs
    ]
    marks = {f"{ARMS[arm]} {n}": node_marks(run) for arm, n, run, _, _ in runs if arm != "local"}
    return rows, marks


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks cluster")
    ap.add_argument("--trials", default="8,32", help="run sizes, comma-separated (default 8,32)")
    ap.add_argument("--rounds", type=int, default=2, help="local/cluster pairs per run size (default 2)")
    ap.add_argument("--stacks", choices=("fresh", "warm"), default="fresh", help="both modes' --stacks")
    ap.add_argument(
        "--fresh-trials",
        default="",
        help="with --stacks warm: sizes that also get a cluster --stacks fresh arm (default the smallest)",
    )
    ap.add_argument(
        "--cold-trials",
        type=int,
        default=None,
        help="trials of the first (cold) cluster run (default the smallest size)",
    )
    ap.add_argument(
        "--strategy",
        choices=("exact", "template"),
        default="exact",
        help="the pack's postgres reset strategy on warm stacks (default exact, the pack as it is)",
    )
    args = ap.parse_args(argv)
    sizes = sorted({int(n) for n in args.trials.split(",")})
    fresh_sizes = sorted({int(n) for n in args.fresh_trials.split(",") if n} or {sizes[0]})
    if args.stacks != "warm":
        fresh_sizes = []
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.cluster import start_engine_and_cluster, stop_engine

    load_start = bs.start_meta()
    t = time.monotonic()
    (_, second), cluster = start_engine_and_cluster(["forgelib/postgres:15", "forgelib/python:3.11"], SLOTS)
    cluster_start = time.monotonic() - t
    try:
        try:
            with tempfile.TemporaryDirectory(prefix="forge-bench-cluster-") as tmp:
                rows, marks = measure(
                    Path(tmp), cluster.address, sizes, args.rounds, args.stacks, fresh_sizes,
                    args.cold_trials, args.strategy,
                )  # fmt: skip
        finally:
            cluster.stop()
    finally:
        stop_engine(second)
    result = summarize(rows, sizes)
    start, idle = result["start_exit_s"], result["idle_per_trial_s"]
    slot_s = result.get("fresh_slot_s_per_trial", {})
    fresh_notes = [
        f"cluster warm stacks / cluster fresh stacks, {n}-trial runs: slot time per trial {r:.3f} "
        f"({slot_s[n]['cluster']:.2f} / {slot_s[n]['fresh']:.2f} s; target <= {FRESH_TARGET}), "
        f"mean trial seconds {result['fresh_trial_ratio_by_trials'][n]:.3f}"
        for n, r in result.get("fresh_ratio_by_trials", {}).items()
    ]
    bs.report(
        NAME if args.stacks == "fresh" else f"{NAME}_{args.stacks}",
        rows,
        meta={
            "trials": sizes,
            "rounds": args.rounds,
            "stacks": args.stacks,
            "fresh_trials": fresh_sizes,
            "strategy": args.strategy,
            **result,
            "target": TARGET,
            **load_start,
            "cluster_start_s": round(cluster_start, 1),
            "node_marks": marks,
        },
        notes=[
            *(
                f"overhead ratio cluster (warm slots) / local, --stacks {args.stacks}, {n}-trial runs: "
                f"{r:.3f} (target <= {TARGET})"
                for n, r in result["ratio_by_trials"].items()
            ),
            *(
                f"per-trial part only (idle slot time per trial), cluster / local, {n}-trial runs: {r:.3f}"
                for n, r in result["idle_ratio_by_trials"].items()
            ),
            *(
                f"mean trial seconds, {n}-trial runs: local {t['local']:.2f}, cluster {t['cluster']:.2f}; "
                f"wall cluster / local {result['wall_ratio_by_trials'][n]:.3f}"
                for n, t in result["trial_s"].items()
            ),
            f"start-up + exit per run (on each of the {CONCURRENCY} slots): local {start['local']:.2f} s, "
            f"cluster {start['cluster']:.2f} s; slot time idle per trial (teardowns, the last wave): "
            + ", ".join(
                f"{n} trials local {i['local']:.2f} s, cluster {i['cluster']:.2f} s" for n, i in idle.items()
            ),
            *fresh_notes,
            f"first run on the fresh cluster (starts its slots, {rows[0]['trials']} trials): "
            f"{result['ratio_cold'] if result['ratio_cold'] is not None else '-'} "
            f"(overhead per trial {rows[0]['overhead_per_trial_s']:.2f} s)",
            f"hand-off steps per cluster trial, mean s: {marks}",
            f"second engine + cluster start (head, 2 nodes): {cluster_start:.1f} s",
            f"load average: {bs.loadavg()}",
        ],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
