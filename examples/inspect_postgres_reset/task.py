"""An inspect_ai task over the postgres pack (examples/multi_service_postgres_reset) on forge stacks.

Each sample gets the pack's stack, seeded (widget 1 reads 'baseline'); the agent is inspect's own
``react()`` with the ``bash`` tool in the ``runner`` service (psql and curl reach app-db and widgets-api
over the compose network). Scored twice: inspect's ``match()`` on the submitted answer, and
``forge_scorer()`` running the forge task's grading.yaml (/work/submission.txt must read 'baseline') on
the sample's stack before it is handed back.

    inspect eval examples/inspect_postgres_reset/task.py --model openai/gpt-4o-mini -T stacks=warm
    python examples/inspect_postgres_reset/run_offline.py      # the scripted agent, no model, no network
"""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.scorer import match
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironmentSpec

from forgelib.inspect import ForgeConfig, forge_scorer

PACK = str(Path(__file__).resolve().parents[1] / "multi_service_postgres_reset")

INSTRUCTION = """\
You are in the `runner` container of a small stack. app-db is postgres (user app, password app,
database app; `psql -h app-db -U app -d app` with PGPASSWORD=app); widgets-api (http://widgets-api:8000)
serves its widgets table. Read widget 1's name, write it (and nothing else) to /work/submission.txt, then
submit the name as your answer. You may do anything else you like to the database and /work afterwards."""


@task
def postgres_reset(stacks: str = "warm", goldens: bool = False, samples: int = 1) -> Task:
    """``stacks``: fresh | warm; ``goldens``: start app-db from a golden snapshot; ``samples``: copies of
    the one sample (each its own stack, or the same warm stack reset in between)."""
    return Task(
        dataset=[Sample(id=f"read_widget_{i}", input=INSTRUCTION, target="baseline") for i in range(samples)],
        solver=react(tools=[bash(timeout=60)]),
        scorer=[match(), forge_scorer()],
        sandbox=SandboxEnvironmentSpec(
            "forge",
            ForgeConfig(project=PACK, task="read_widget", stacks=stacks, goldens=goldens, default="runner"),
        ),
    )
