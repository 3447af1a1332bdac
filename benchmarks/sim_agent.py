"""A simulated agent: what a trial looks like when a model does the thinking (issue 30).

Runs in the trial's workstation service (stdlib + psycopg, as forge's python image has them). It sleeps a
"model latency" before each of a few real tool calls against the stack, in turn: read a row (psycopg,
``SIM_DSN`` / ``SIM_SQL``), write a file (under ``SIM_WORKDIR``), call an HTTP service (``SIM_HTTP``); then
it runs the task's own solver (``SIM_SOLVE``: its source, base64), which writes the answer the trial is
graded on. So the trial grades like the pack's oracle, after the time a model would have taken.

Settings (environment): ``SIM_LATENCY`` seconds per model call, or ``LOW-HIGH`` for a uniform draw
(seeded by ``SIM_SEED``, so a run's trials differ but a rerun repeats them); ``SIM_CALLS`` tool calls
(default 4). It prints one line per call on stderr, and at the end ``sim-agent: model S s, tools T s``.

Today forge's oracle streams this file into the service (``benchmarks/agent_load_bench.py`` writes the
task variant). Under the agent seam it is the same script as a command agent: see that benchmark's
``solver_stanza``.
"""

from __future__ import annotations

import base64
import json
import os
import random
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def latency(spec: str, rng: random.Random) -> float:
    low, _, high = spec.partition("-")
    return rng.uniform(float(low), float(high)) if high else float(low)


def read_row(dsn: str, sql: str) -> str:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    return repr(row)


def write_file(workdir: Path, n: int) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"scratch-{n}.txt"
    path.write_text(f"tool call {n}\n", encoding="utf-8")
    return str(path)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return f"{resp.status} {json.dumps(json.load(resp))[:80]}"


def main() -> int:
    env = os.environ
    rng = random.Random(env.get("SIM_SEED", "0"))
    calls = int(env.get("SIM_CALLS", "4"))
    spec = env.get("SIM_LATENCY", "20")
    tools: list[tuple[str, Callable[[int], str]]] = [
        ("read_row", lambda n: read_row(env["SIM_DSN"], env.get("SIM_SQL", "select 1"))),
        ("write_file", lambda n: write_file(Path(env.get("SIM_WORKDIR", "/tmp/sim-agent")), n)),
        ("http_get", lambda n: http_get(env["SIM_HTTP"])),
    ]
    model = tool_s = 0.0
    for n in range(calls):
        wait = latency(spec, rng)
        time.sleep(wait)  # the model thinking: no CPU, the stack held
        model += wait
        name, call = tools[n % len(tools)]
        t0 = time.monotonic()
        out = call(n)
        tool_s += time.monotonic() - t0
        print(f"sim-agent: call {n} {name} after {wait:.1f} s -> {out}", file=sys.stderr)
    solve = env.get("SIM_SOLVE")
    if solve:
        source = base64.b64decode(solve).decode()
        exec(compile(source, "solve.py", "exec"), {"__name__": "__main__"})  # the task's own solver
    print(f"sim-agent: model {model:.1f} s, tools {tool_s:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
