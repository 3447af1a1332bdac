"""An inspect_ai task over the MySQL shop pack (examples/multi_service_mysql_shop) on forge stacks.

Each sample gets the pack's stack with shop-db (MariaDB offline) seeded from the orders sql_dump; the agent
is inspect's own ``react()`` with two shells: ``bash`` in the ``runner`` service (curl reaches the api) and
``shop_db``, a bash in the shop-db service itself, where the ``mariadb`` client is. Scored twice: inspect's
``match()`` on the submitted status, and ``forge_scorer()`` running the forge task's grading.yaml (the
submission, an ``sql`` check on shop-db, an ``http`` check on the api) on the sample's stack.

    inspect eval examples/inspect_mysql_shop/task.py --model openai/gpt-4o-mini -T stacks=warm
    python examples/inspect_mysql_shop/run_offline.py      # the scripted agent, no model, no network
"""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.scorer import match
from inspect_ai.tool import bash, tool_with
from inspect_ai.util import SandboxEnvironmentSpec

from forgelib.inspect import ForgeConfig, forge_scorer

PACK = str(Path(__file__).resolve().parents[1] / "multi_service_mysql_shop")

INSTRUCTION = """\
You are in the `runner` container of a small shop. shop-db is MariaDB (root password root; database
shop, user shop, password shop): the `shop_db` tool runs a shell inside it, where
`mariadb -ushop -pshop shop` works. The api (http://api:8000/orders/ID) serves its orders table through a
redis cache. Read the status of order 1, write it (and nothing else) to /work/submission.txt with the
`bash` tool, then submit the status as your answer. You may do anything else you like to shop-db
afterwards, except to order 1."""


@task
def mysql_shop(stacks: str = "warm", samples: int = 1) -> Task:
    """``stacks``: fresh | warm; ``samples``: copies of the one sample (each its own stack, or the same warm
    stack reset in between)."""
    shop_db = tool_with(
        bash(timeout=60, sandbox="shop-db"),
        name="shop_db",
        description="Run a bash command in the shop-db container (MariaDB and its mariadb client).",
    )
    return Task(
        dataset=[Sample(id=f"read_order_{i}", input=INSTRUCTION, target="shipped") for i in range(samples)],
        solver=react(tools=[bash(timeout=60), shop_db]),
        scorer=[match(), forge_scorer()],
        sandbox=SandboxEnvironmentSpec(
            "forge", ForgeConfig(project=PACK, task="read_order", stacks=stacks, default="runner")
        ),
    )
