"""A reference pack with its task solved by the simulated agent (``benchmarks/sim_agent.py``): a copy of the
pack in a directory of the caller's, the task's oracle replaced by the agent (which ends by running the
task's own solver, so grading is unchanged), and a run config for it.

Used by ``agent_load_bench.py`` and tests/integration/test_agent_load.py. The one place that says how the
agent is attached to a trial is ``solver_stanza``: today the oracle streams the script into the task's
workstation service. With the agent seam (a command agent), that function returns the seam's stanza
instead (the same script, the same ``SIM_*`` environment) — one change, here.
"""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
AGENT = HERE / "sim_agent.py"


@dataclass(frozen=True)
class Variant:
    pack: str  # directory under examples/
    task: str
    dsn: str  # the row the agent reads
    sql: str
    http: str  # the service it calls


VARIANTS = {
    "postgres": Variant(
        "multi_service_postgres_reset", "read_widget", "postgresql://app:app@app-db:5432/app",
        "select name from widgets where id = 1", "http://widgets-api:8000/widgets/1",
    ),
    "cache": Variant(
        "multi_service_cache_debug", "diagnose_stale_order", "postgresql://app:app@app-db:5432/app",
        "select status from orders where id = 4021", "http://orders-api:8000/orders/4021",
    ),
}  # fmt: skip


def agent_seconds(latency: str, calls: int) -> float:
    """The model's share of one trial as the agent draws it (``SIM_SEED`` 0), for the run's ideal time."""
    import random

    from benchmarks.sim_agent import latency as draw

    rng = random.Random("0")
    return sum(draw(latency, rng) for _ in range(calls))


def solver_stanza(oracle: Mapping[str, Any], task_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """How the agent solves the trial: the task's oracle stanza with the agent's script and settings."""
    shutil.copy(AGENT, task_dir / "sim_agent.py")
    return {
        "oracle": {
            **oracle,
            "script": "./sim_agent.py",
            "interpreter": ["python3", "-"],
            "env": {**(oracle.get("env") or {}), **env},
        }
    }


def make(
    name: str,
    dest: Path,
    *,
    latency: str,
    calls: int,
    repeats: int,
    workers: int,
    stacks: str = "warm",
    snapshots: bool = False,
    memory_budget_mb: int | None = None,
    healthcheck_interval: str | None = None,
) -> Path:
    """Copy the ``name`` pack to ``dest``, attach the agent to its task, and return the run config.
    ``healthcheck_interval`` (e.g. ``30s``): every healthcheck of the copy's compose files runs at that
    interval instead of the pack's 1 s (an experiment: what Docker's own healthchecks of idle stacks cost)."""
    v = VARIANTS[name]
    pack = dest / v.pack
    shutil.copytree(EXAMPLES / v.pack, pack, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    if healthcheck_interval is not None:
        for f in pack.rglob("*compose*.y*ml"):
            f.write_text(re.sub(r"(?m)^(\s+interval:)\s*\S+", rf"\1 {healthcheck_interval}", f.read_text()))
    task_dir = pack / "tasks" / v.task
    task_file = task_dir / "task.yaml"
    task = yaml.safe_load(task_file.read_text())
    oracle = dict(task["oracle"])
    solve = (task_dir / oracle["script"]).read_text()
    env = {
        "SIM_LATENCY": latency, "SIM_CALLS": str(calls), "SIM_DSN": v.dsn, "SIM_SQL": v.sql,
        "SIM_HTTP": v.http, "SIM_WORKDIR": "/work/sim",
        "SIM_SOLVE": base64.b64encode(solve.encode()).decode(),
    }  # fmt: skip
    top = max(float(x) for x in latency.split("-"))
    task.pop("oracle")
    task.update(solver_stanza({**oracle, "timeout": int(top * calls + 120)}, task_dir, env))
    task_file.write_text(yaml.safe_dump(task, sort_keys=False))
    config: dict[str, Any] = {
        "project": "..",
        "tasks": [v.task],
        "repeats": repeats,
        "workers": workers,
        "stacks": stacks,
        "snapshots": snapshots,
        "output": "../runs",
        "timeouts": {
            "compose_up": 300,
            "recipe": 120,
            "oracle": top * calls + 120,
            "grading": 60,
            "teardown": 120,
        },
    }
    if memory_budget_mb is not None:
        config["memory_budget_mb"] = memory_budget_mb
    path = pack / "run_configs" / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
