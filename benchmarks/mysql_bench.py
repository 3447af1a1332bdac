"""The MySQL shop pack: forge's fresh trial against a hand-written compose + ``mariadb < dump`` loop, and
warm ÷ fresh per trial, in one run (``python -m benchmarks mysql [TRIALS]``; figures in README.md).

Warm ÷ fresh twice: per run (each run's wall over its trials: the warm run's first provisioning included)
and per trial (issue 39's goal ≤ 0.3): the median wall of the trials that reused a warm stack against the
median of the fresh run's trials, each with its teardown (a fresh trial's ``down`` against a warm trial's
release), and the in-place reset's median (``reset_median_s``: the reset services' steps; with the
fingerprints, the ephemeral services recreated and ready: ``reset_ahead_median_s``).

The loop, per trial: ``docker compose up --wait`` on the pack's own compose file, the dump into the
server's client, the oracle, the same state check, ``docker compose down --volumes``. forge's trial is
read from each run's summary (its wall time over the trials).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forgelib.run.results import read_trials

PACK = Path(__file__).resolve().parents[1] / "examples" / "multi_service_mysql_shop"
COMPOSE = PACK / "shared" / "environment.compose.yaml"
IMAGES = {
    "MARIADB": "forgelib/mariadb:10.11",
    "REDIS": "forgelib/redis:7.0",
    "PYTHON": "forgelib/python:3.11",
}
ENV = {**os.environ, **{f"FORGE_IMAGE_{k}": v for k, v in IMAGES.items()}}
# One project name for the loop's trials (they run one after another): the api image is built once.
LOOP = ["docker", "compose", "-f", str(COMPOSE), "-p", f"benchmy-{os.getpid()}"]


def _run(argv: list[str], stdin: Path | None = None) -> str:
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as f:
        return subprocess.run(argv, stdin=f, env=ENV, check=True, capture_output=True, text=True).stdout


def loop_trial() -> float:
    dc = LOOP
    start = time.monotonic()
    try:
        _run([*dc, "up", "-d", "--wait"])
        seed = PACK / "assets/orders.sql"
        _run([*dc, "exec", "-T", "shop-db", "mariadb", "-uroot", "-proot", "shop"], seed)
        _run([*dc, "exec", "-T", "runner", "python3", "-"], PACK / "tasks/read_order/solve.py")
        assert _run([*dc, "exec", "-T", "runner", "cat", "/work/submission.txt"]) == "shipped"
    finally:
        _run([*dc, "down", "--volumes", "--remove-orphans"])
    return time.monotonic() - start


def forge_trials(
    config: str, repeats: int, *extra: str, walls: list[dict[str, float]] | None = None
) -> float:
    """Seconds per trial of ``forge run`` (the run's wall time over its trials); ``walls``: each trial's
    wall with its teardown, whether it reused a stack, and its reset step, appended."""
    with tempfile.TemporaryDirectory() as out:
        cfg = Path(out) / "c.yaml"
        text = (PACK / "run_configs" / config).read_text().replace("project: ..", f"project: {PACK}")
        for was in ("repeats: 1", "repeats: 2"):
            text = text.replace(was, f"repeats: {repeats}")
        cfg.write_text(text)
        start = time.monotonic()
        argv = [sys.executable, "-m", "forgelib", "run", "--config", str(cfg), "--json", "--output", out]
        proc = subprocess.run([*argv, *extra], capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - start
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["totals"]["passed"] == repeats
        if walls is not None:
            for t in read_trials(next(p for p in Path(out).iterdir() if p.is_dir() and p.name != "c.yaml")):
                wall = t.wall_seconds + t.timings.get("teardown", 0.0)
                reused = float(bool(t.stack.get("reuse")))
                walls.append({"wall": wall, "reused": reused, **reset_steps(t.stack)})
        return elapsed / repeats


def reset_steps(stack: Mapping[str, Any]) -> dict[str, float]:
    """A reused trial's reset, from its stack's record: the reset runs ahead, as the trial before gives
    the stack back, so its steps are in ``reset_ahead`` (never in the trial's own timings). ``reset``: the
    reset services' steps; ``ahead``: all of it (fingerprints, the ephemeral services recreated, ready)."""
    ahead = stack.get("reset_ahead") or {}
    reset = sum(float(v) for k, v in ahead.items() if k.startswith("reset:"))
    return {"reset": reset, "ahead": float(ahead.get("seconds", 0.0))}


def main(argv: Sequence[str] = ()) -> None:
    """``python -m benchmarks mysql [TRIALS]`` (or ``python benchmarks/mysql_bench.py [TRIALS]``)."""
    n = int(argv[0]) if argv else 3
    try:
        loop_trial()  # builds the api image once, as forge's run does before its first trial
        loop = sum(loop_trial() for _ in range(n)) / n
    finally:
        _run([*LOOP, "down", "--volumes", "--remove-orphans", "--rmi", "local"])
    fresh = forge_trials("dev.yaml", n)
    fresh_walls: list[dict[str, float]] = []
    warm_walls: list[dict[str, float]] = []
    hostile_fresh = forge_trials("hostile.yaml", n, "--stacks", "fresh", walls=fresh_walls)
    hostile_warm = forge_trials("hostile.yaml", n, "--stacks", "warm", walls=warm_walls)
    fresh_trial = statistics.median(w["wall"] for w in fresh_walls)
    reused = [w for w in warm_walls if w["reused"]]
    reused_trial = statistics.median(w["wall"] for w in reused) if reused else float("nan")
    reset = statistics.median(w["reset"] for w in reused) if reused else float("nan")
    ahead = statistics.median(w["ahead"] for w in reused) if reused else float("nan")
    print(json.dumps({
        "trials": n, "loop_s": round(loop, 2), "forge_fresh_s": round(fresh, 2),
        "forge_over_loop": round(fresh / loop, 3), "hostile_fresh_s": round(hostile_fresh, 2),
        "hostile_warm_s": round(hostile_warm, 2), "warm_over_fresh": round(hostile_warm / hostile_fresh, 3),
        "fresh_trial_s": round(fresh_trial, 3), "reused_trial_s": round(reused_trial, 3),
        "reused_trials": len(reused), "reset_median_s": round(reset, 3),
        "reset_ahead_median_s": round(ahead, 3),
        "trial_warm_over_fresh": round(reused_trial / fresh_trial, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
