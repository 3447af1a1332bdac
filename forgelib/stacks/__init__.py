"""Where every front end gets its stacks: the stack layer.

* ``backends`` — ``DockerBackend``: the one decision which stack a trial gets (``_source``: the run's
  shared stack, a warm one, a fresh one) over ``FreshSource`` / ``SharedSource`` / ``WarmSource``;
  ``make_backend`` builds a run's from its plan. Used by ``forge run`` (``run/cli.py``), a cluster node
  (``cluster/node.py``), ``forge provision`` (``commands.py``), the pytest plugin (``pytest_stacks.py``)
  and the inspect sandbox (``inspect/stacks.py``).
* ``shared`` — ``SharedStacks``: a run's shared stacks (all-``shared`` environments), one per compose file.

The stacks themselves come up through ``forgelib.stacks.provision`` (the fresh pipeline and its steps) and
``forgelib.stacks.warm`` (the warm pool).
"""

from __future__ import annotations

from forgelib.stacks.backends import (
    STACK_MODES,
    DockerBackend,
    FreshSource,
    SharedSource,
    StackSource,
    WarmSource,
    heal_leftovers,
    make_backend,
)
from forgelib.stacks.shared import SharedStacks

__all__ = [
    "STACK_MODES",
    "DockerBackend",
    "FreshSource",
    "SharedSource",
    "SharedStacks",
    "StackSource",
    "WarmSource",
    "heal_leftovers",
    "make_backend",
]
