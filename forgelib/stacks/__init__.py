"""Where every front end gets its stacks: ``forgelib.stacks.open``, the stack layer.

* ``session`` — ``open(project, mode=..., scope=...)``: a context manager that owns signals (the live-stack
  registry), the healing of leftovers, the memory budget, the start bound and teardown, and hands out
  backends (``Stacks.backend``, ``Stacks.backend_of``). ``forge run`` (``run/cli.py``), ``forge
  provision`` (``commands.py``), the pytest plugin (``pytest_stacks.py``), the inspect sandbox
  (``inspect/stacks.py``) and a cluster node (``cluster/node.py``) all open their stacks through it.
* ``slots`` — what the forge processes on one engine share: start places and a memory ledger (flock).
* ``backends`` — ``DockerBackend``: the one decision which stack a trial gets (``_source``: the run's
  shared stack, a warm one, a fresh one) over ``FreshSource`` / ``SharedSource`` / ``WarmSource``.
* ``shared`` — ``SharedStacks``: a run's shared stacks (all-``shared`` environments), one per compose file.

Only this package builds backends, warm pools, shared stacks and budgets
(tests/unit/test_backend_construction.py). The stacks themselves come up through ``forgelib.provision``
(the fresh pipeline and its steps) and ``forgelib.warm`` (the warm pool).
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
)
from forgelib.stacks.session import SCOPES, Mode, Scope, Stacks, open
from forgelib.stacks.shared import SharedStacks

__all__ = [
    "SCOPES",
    "STACK_MODES",
    "DockerBackend",
    "FreshSource",
    "Mode",
    "Scope",
    "SharedSource",
    "SharedStacks",
    "StackSource",
    "Stacks",
    "WarmSource",
    "heal_leftovers",
    "open",
]
