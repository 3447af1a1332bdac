"""Agent-shaped load (issue 30): many trials at once, each mostly waiting on a model.

The simulated agent (``sim_agent.py``, attached by ``agent_pack.py``) sleeps a model latency before each
of its tool calls, then runs the task's own solver. For each pack (postgres, cache), each mode (``warm``:
``--stacks warm``; ``golden``: fresh stacks started from golden snapshots) and each size (workers W,
trials 2 x W) one ``forge run``, and per run:

* **wall / ideal**, ideal = (trials / workers) x the agent's own time (its drawn latencies; the tool calls
  and the solver are not in it); **ramp-up**: until the last trial of the first wave could start (its time
  to ready), as a share of the excess over ideal;
* **time to ready** p50 / p95 (all trials, and the reused warm stacks apart) and what it waited on;
* the pool's decisions, memory waits, the most stacks at once;
* **peak memory**: the machine's MemTotal - MemAvailable sampled every 0.5 s, minus its value before the
  run (everything the run added: containers, forge, the CLIs; on a shared machine also everyone else's),
  the peak of the run's own containers (their cgroups' memory less page cache, docker stats' figure,
  summed every 2 s) and **memory per stack** as forge measured it (``docker stats`` of the first stack,
  idle);
* where the excess over ideal goes: ``start`` (process start to the first trial), ``ramp`` (first trial
  to the first wave's last ready), ``tail`` (the last trial's end to the process's exit: the stacks'
  teardown), the agent's own solve time against its model time, and time to ready;
* **left after the run**: containers, networks, volumes labelled with the run (must be none).

The golden mode's first run captures the goldens (its provisioning is slower); the goldens it takes are
removed at the end (``forge snapshots prune --all``).

Size: ``--workers 4,8`` (``FORGE_BENCH_AGENT_WORKERS``), ``--latency 5-10`` seconds per model call
(``FORGE_BENCH_AGENT_LATENCY``; the issue's reference is 20), ``--calls 4``, ``--packs postgres,cache``,
``--modes warm,golden``, ``--memory-budget-mb N`` (every run under that budget).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks import agent_pack
from benchmarks import harness as bs
from forgelib.docker.labels import RUN
from forgelib.runner import SubprocessRunner
from forgelib.stacks.budget import MIB, mem_available
from forgelib.stacks.snapshots import store

NAME = "agent_load"


def _used() -> int:
    """Bytes in use on the machine (MemTotal - MemAvailable)."""
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    return total - (mem_available() or total)


def _container_memory(cid: str) -> int:
    """A container's memory in use less its page cache (docker stats' figure on cgroup v1), 0 if gone."""
    base = Path("/sys/fs/cgroup/memory/docker") / cid
    try:
        usage = int((base / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return 0
    return max(0, usage - int(stat.get("total_inactive_file", stat.get("cache", 0))))


class MemoryPeak:
    """The machine's memory in use, sampled on a thread while a run lasts: the peak above the start; and
    the peak of the run's own containers (found by their run label once the run's directory exists under
    ``output``), with how many there were then."""

    def __init__(self, output: Path | None = None, every: float = 0.5) -> None:
        self.every, self.start, self.peak = every, _used(), 0
        self.output = output
        self.containers_peak, self.containers_at_peak = 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _run_id(self) -> str | None:
        if self.output is None or not self.output.is_dir():
            return None
        dirs = [p.name for p in self.output.iterdir() if p.is_dir()]
        return dirs[0] if len(dirs) == 1 else None

    def _sample(self) -> None:
        import subprocess

        n = 0
        while not self._done.wait(self.every):
            self.peak = max(self.peak, _used() - self.start)
            n += 1
            run_id = self._run_id() if n % 4 == 0 else None
            if run_id is None:
                continue
            ps = subprocess.run(
                ["docker", "ps", "-q", "--no-trunc", "--filter", f"label={RUN}={run_id}"],
                capture_output=True, text=True, check=False, timeout=30,
            )  # fmt: skip
            ids = ps.stdout.split()
            total = sum(_container_memory(c) for c in ids)
            if total > self.containers_peak:
                self.containers_peak, self.containers_at_peak = total, len(ids)

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def row(
    pack: str, mode: str, workers: int, agent_s: float, run: bs.ForgeRun, peak: MemoryPeak, began: float
) -> dict[str, Any]:
    summary = run.summary
    trials = run.trials()
    ideal = len(trials) / workers * agent_s
    docs = (
        [yaml.safe_load(p.read_text()) for p in run.run_dir.glob("trials/*/*/trial.yaml")]
        if run.run_dir
        else []
    )
    readies = [float((d.get("ready") or {}).get("seconds", 0.0)) for d in docs]
    reused_r = [float(d["ready"]["seconds"]) for d in docs if (d.get("ready") or {}).get("reused")]
    spare_r = [float(d["ready"]["seconds"]) for d in docs if (d.get("stack") or {}).get("spare")]
    solve = [
        float((d.get("timings") or {}).get("solve", (d.get("timings") or {}).get("oracle", 0.0)))
        for d in docs
    ]
    ends = [_epoch(d["finished_at"]) for d in docs if d.get("finished_at")]
    # When each trial's solver could start, in seconds since the run's first trial started.
    starts = sorted(_epoch(d["started_at"]) + float((d.get("ready") or {}).get("seconds", 0.0)) for d in docs)
    first = min((_epoch(d["started_at"]) for d in docs), default=0.0)
    ramp = (starts[:workers][-1] - first) if starts else 0.0
    start_s = first - began if docs else 0.0
    tail = began + run.wall - max(ends) if ends else 0.0
    excess = run.wall - ideal
    pool, ready = summary.get("pool") or {}, summary.get("ready") or {}
    reused = ready.get("reused") or {}
    return {
        "pack": pack,
        "mode": mode,
        "workers": workers,
        "trials": len(trials),
        "passed": run.passed(),
        "wall_s": round(run.wall, 1),
        "ideal_s": round(ideal, 1),
        "wall/ideal": round(bs.ratio(run.wall, ideal), 2),
        "start_s": round(start_s, 1),
        "ramp_s": round(ramp, 1),
        "ramp/excess": round(bs.ratio(ramp, excess), 2) if excess > 0 else 0.0,
        "tail_s": round(tail, 1),
        "solve_p50": round(bs.percentile(solve, 50), 1) if solve else "-",
        "ready_p50": round(bs.percentile(readies, 50), 2),
        "ready_p95": round(bs.percentile(readies, 95), 2),
        "reused_n": len(reused_r),
        "reused_p50": round(bs.percentile(reused_r, 50), 3) if reused_r else reused.get("median", "-"),
        "reused_p95": round(bs.percentile(reused_r, 95), 3) if reused_r else reused.get("p95", "-"),
        "spare_n": len(spare_r),
        "spare_p50": round(bs.percentile(spare_r, 50), 3) if spare_r else "-",
        "reset_waits": pool.get("reset_waits"),
        "queue_s": (ready.get("waited_on") or {}).get("queue"),
        "memory_waits": pool.get("memory_waits"),
        "memory_wait_s": pool.get("memory_wait_seconds"),
        "start_waits": pool.get("start_waits"),
        "start_wait_s": pool.get("start_wait_seconds"),
        "decisions": " ".join(f"{k}={v}" for k, v in (pool.get("decisions") or {}).items()),
        "peak_stacks": pool.get("peak_stacks"),
        "peak_mem_mb": round(peak.peak / MIB),
        "containers_peak_mb": round(peak.containers_peak / MIB),
        "containers_at_peak": peak.containers_at_peak,
        "per_stack_mb": pool.get("per_stack_mb"),
        "budget_mb": pool.get("budget_mb"),
        "loadavg_end": bs.loadavg(),
        "left": len(bs.leftovers(run.run_id)),
        # Why the trials that did not pass ended (the run's directory goes with the benchmark's).
        "failures": sorted(
            {
                f"{d.get('termination_reason')}: {str((d.get('error') or {}).get('reason') or '')[:160]}"
                for d in docs
                if d.get("status") != "passed"
            }
        ),
        "rc": run.rc,
    }


def _epoch(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(str(iso)).timestamp()


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}")
    ap.add_argument("--workers", default=os.environ.get("FORGE_BENCH_AGENT_WORKERS", "4,8"))
    ap.add_argument("--latency", default=os.environ.get("FORGE_BENCH_AGENT_LATENCY", "5-10"))
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--packs", default="postgres,cache")
    ap.add_argument("--modes", default="warm,golden")
    ap.add_argument("--memory-budget-mb", type=int, default=None)
    ap.add_argument(
        "--healthcheck-interval", default=None, help="e.g. 30s: the packs' healthchecks at that interval"
    )
    args = ap.parse_args(list(argv))
    sizes = [int(w) for w in args.workers.split(",")]
    agent_s = agent_pack.agent_seconds(args.latency, args.calls)
    meta = bs.start_meta(
        latency=args.latency, calls=args.calls, agent_seconds=round(agent_s, 2), sizes=sizes,
        memory_budget_mb=args.memory_budget_mb, mem_available_mb=(mem_available() or 0) // MIB,
        healthcheck_interval=args.healthcheck_interval,
    )  # fmt: skip
    rows = []
    runs: set[str] = set()  # the golden runs' ids: the goldens removed at the end are theirs alone
    with tempfile.TemporaryDirectory(prefix="forge-bench-agent-") as tmp:
        for pack in args.packs.split(","):
            for mode in args.modes.split(","):
                for workers in sizes:
                    work = Path(tmp) / f"{pack}-{mode}-{workers}"
                    work.mkdir()
                    config = agent_pack.make(
                        pack, work / "pack", latency=args.latency, calls=args.calls, repeats=2 * workers,
                        workers=workers, stacks="warm" if mode == "warm" else "fresh",
                        snapshots=mode == "golden", memory_budget_mb=args.memory_budget_mb,
                        healthcheck_interval=args.healthcheck_interval,
                    )  # fmt: skip
                    load0 = bs.loadavg()
                    began = time.time()
                    with MemoryPeak(work / "out") as peak:
                        run = bs.run_forge(config, repeats=2 * workers, workers=workers, workdir=work)
                    rows.append(
                        {**row(pack, mode, workers, agent_s, run, peak, began), "loadavg_start": load0}
                    )
                    if mode == "golden":
                        runs.add(run.run_id)
                    print(f"  {pack} {mode} w={workers}: wall/ideal {rows[-1]['wall/ideal']}", flush=True)
    runner = SubprocessRunner()
    for g in store.list_goldens(runner) if runs else []:
        if g.labels.get(RUN) in runs:
            store.remove(runner, g, force_untag=True)
    notes = [
        f"agent time per trial {agent_s:.1f} s ({args.calls} calls at {args.latency} s)",
        "ideal = trials / workers x the agent time",
        "left must be 0 on every row; passed must equal trials",
    ]
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main()
