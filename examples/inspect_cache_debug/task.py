"""An inspect_ai task over the cache pack (examples/multi_service_cache_debug), scored by forge.

The sample's stack: orders-api serving a stale order from redis (seeded from the cache_poisoned RDB),
postgres with the truth. The agent is inspect's own ``react()`` with ``bash`` in ``runner``; the score is
``forge_scorer()``: the forge task's grading.yaml (a gate that no order was changed, a judge, the note's
checks, two alternative routes of evidence) run on the sample's stack before it is handed back, with every
check's reason in the explanation.

    inspect eval examples/inspect_cache_debug/task.py --model anthropic/claude-sonnet-4-0
    python examples/inspect_cache_debug/run_offline.py     # the scripted agent, no model, no network
"""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironmentSpec

from forgelib.inspect import ForgeConfig, forge_scorer
from forgelib.spec.loader import load_project_config

PACK = Path(__file__).resolve().parents[1] / "multi_service_cache_debug"
FORGE_TASK = "diagnose_stale_order"


@task
def diagnose_stale_order(stacks: str = "fresh") -> Task:
    """The forge task's own instruction is the sample's input; its grading.yaml is the score."""
    instruction = load_project_config(PACK).task(FORGE_TASK).instruction
    return Task(
        dataset=[Sample(id=FORGE_TASK, input=instruction)],
        solver=react(tools=[bash(timeout=60)]),
        scorer=forge_scorer(),
        sandbox=SandboxEnvironmentSpec(
            "forge", ForgeConfig(project=str(PACK), task=FORGE_TASK, stacks=stacks, default="runner")
        ),
    )
