"""Checkpoints on the cache pack (postgres, redis, two HTTP services, a workspace), one run, one process:

- **checkpoint**: the capture of a changed stack (``checkpoints.checkpoint``): its wall, and how long the
  stack was paused (the manifest's ``paused_seconds``);
- **fork of N ÷ N fresh provisions** (target ≤ 0.3): ``checkpoints.fork(ck, N)`` against N stacks provisioned
  from the seeds one after another (``backend.provision``), the two arms alternated round by round; the
  teardowns are outside both;
- **restore in place** per kind (targets: postgres ≤ 0.5 s, redis and tree ≤ 0.2 s), alternated with the
  change it undoes: on the source (postgres and redis on volumes: refilled; the workspace in its layer:
  recreated) and on a fork (every service in its layer: recreated); each ``restore:<service>`` timing
  (the service back and its fingerprint checked). Its baseline, in the same run, is a fresh provision.

The pack is made checkpointable by ``checkpoint_pack.py`` (its workspace reset from a tree seed, the
orders cache's TTL a day), as in tests/integration/test_checkpoints.py. Size: ``--rounds``
(``FORGE_BENCH_CHECKPOINT_ROUNDS``, 2), ``--forks`` (4), ``--restores`` per stack and round (3). Nothing
is left: the stacks go with ``stacks.open``, the checkpoints are removed at the end.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from benchmarks.checkpoint_pack import checkpointable_cache_pack
from forgelib import stacks
from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Task
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.stack import Stack

NAME = "checkpoint"
KINDS = {"app-db": ("postgres", 0.5), "redis": ("redis", 0.2), "runner": ("tree", 0.2)}
FORK_TARGET = 0.3
SQL = ["psql", "-U", "app", "-d", "app", "-c"]


def change(t: Stack, mark: str) -> None:
    """Rows, a key and a file: what a trial step does to the three captured services."""
    t.compose.exec("app-db", [*SQL, f"insert into order_status_updates (order_id, old_status, new_status) "
                                    f"values (4021, 'shipped', '{mark}')"], timeout=60)  # fmt: skip
    t.compose.exec("redis", ["redis-cli", "SET", f"bench:{mark}", mark], timeout=60)
    t.compose.exec("runner", ["sh", "-c", f"echo {mark} > /work/notes/{mark}.md"], timeout=60)


def where_it_goes(timings: Sequence[dict[str, float]]) -> str:
    """Each phase's median over ``timings`` (one stack's each), the longest first."""
    names = {k for t in timings for k in t}
    med = {k: bs.median([t[k] for t in timings if k in t]) for k in names}
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1]))


def main(argv: Sequence[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks checkpoint", description=__doc__)
    ap.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_CHECKPOINT_ROUNDS", 2))
    ap.add_argument("--forks", type=int, default=4)
    ap.add_argument("--restores", type=int, default=3)
    args = ap.parse_args(list(argv))
    meta = bs.start_meta(rounds=args.rounds, forks=args.forks, restores=args.restores)
    runner = SubprocessRunner()
    ids: list[str] = []
    fork_s: list[float] = []
    fresh_s: list[float] = []
    restores: dict[str, dict[str, list[float]]] = {"source": {}, "fork": {}}
    phases: dict[str, list[dict[str, float]]] = {"fork": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="forge-ckbench-") as tmp:
        work = Path(tmp)
        project = checkpointable_cache_pack(work / "pack", f"ckbench{secrets.token_hex(2)}")
        task = Task(DEFAULT_TASK, project.path, "", project.environment)
        run_id = f"ckbench-{secrets.token_hex(3)}"
        try:
            with stacks.open(project, scope="stack", signals=False) as opened:

                def fresh(i: int) -> Stack:
                    t = opened.backend.provision(task, run_id=run_id, trial_index=i, trial_dir=work / f"t{i}")
                    opened.live.add(t.name, lambda graceful: opened.backend.teardown(t, graceful=graceful))
                    return t

                source = fresh(0)
                change(source, "prefix")
                t0 = time.monotonic()
                ck = checkpoints.checkpoint(opened, source)
                capture_s = time.monotonic() - t0
                ids.append(ck.id)
                n = 1
                for r in range(args.rounds):
                    # arms alternated, the first one swapped every round
                    for arm in ("fork", "fresh") if r % 2 == 0 else ("fresh", "fork"):
                        t0 = time.monotonic()
                        if arm == "fork":
                            made = checkpoints.fork(opened, ck.id, args.forks, trial_dir=work / f"f{r}")
                            fork_s.append(time.monotonic() - t0)
                        else:
                            made = [fresh(n + i) for i in range(args.forks)]
                            n += args.forks
                            fresh_s.append(time.monotonic() - t0)
                        phases[arm] += [t.timings for t in made]
                        if arm == "fork" and r == 0:
                            fork = made.pop(0)  # the fork whose restores are timed
                        for t in made:
                            opened.live.teardown(t.name)
                    for where in ("source", "fork"):
                        for i in range(args.restores):
                            stack = source if where == "source" else fork
                            change(stack, f"r{r}{i}")
                            stack = checkpoints.restore(opened, stack, ck.id)
                            for svc in KINDS:
                                restores[where].setdefault(svc, []).append(stack.timings[f"restore:{svc}"])
                            if where == "source":
                                source = stack
                            else:
                                fork = stack
        finally:
            for cid in ids:
                ckstore.remove(runner, cid)
    left = lab.resources_with_labels(runner, {lab.RUN: run_id})
    per_fresh = bs.median(fresh_s) / args.forks
    fork_ratio = bs.ratio(bs.median(fork_s), bs.median(fresh_s))

    def row(measure: str, seconds: float, detail: str, target: float | None = None) -> dict[str, Any]:
        verdict = bs.verdict(seconds, target) if target is not None else ""
        return {
            "measure": measure,
            "value": seconds,
            "target": target or "",
            "verdict": verdict,
            "detail": detail,
        }

    k = args.forks
    rows = [
        row(
            "checkpoint (s)",
            capture_s,
            f"paused {ck.manifest['paused_seconds']} s; {len(ck.services)} services",
        ),
        row(f"fork of {k} (s)", bs.median(fork_s), " ".join(f"{s:.2f}" for s in fork_s)),
        row(f"{k} fresh provisions (s)", bs.median(fresh_s), " ".join(f"{s:.2f}" for s in fresh_s)),
        row(f"fork of {k} ÷ {k} fresh", fork_ratio, "ratio of the medians", FORK_TARGET),
    ]
    for where, by_svc in restores.items():
        for svc, (kind, target) in KINDS.items():
            med = bs.median(by_svc.get(svc, []))
            p95 = bs.percentile(by_svc.get(svc, []), 95)
            detail = f"p95 {p95:.3f}; ÷ a fresh provision {bs.ratio(med, per_fresh):.3f}"
            rows.append(row(f"restore {kind}, {where} (s)", med, detail, target))
    notes = [
        f"a fresh provision (the baseline) {per_fresh:.2f} s; restore samples per kind and stack: "
        f"{args.rounds * args.restores}",
        *(f"{arm} stack phases (median s): {where_it_goes(ts)}" for arm, ts in phases.items()),
        "left on the engine: " + (", ".join(n for names in left.values() for n in names) or "nothing"),
    ]
    samples = {"fork": fork_s, "fresh": fresh_s, "restore": restores, "phases": phases}
    return bs.report(NAME, rows, meta={**meta, "samples": samples}, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
