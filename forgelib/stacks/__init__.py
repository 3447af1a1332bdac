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
* ``stack`` — ``Stack``: the one handle on a provisioned stack, which every consumer takes.

Only this package builds backends, warm pools, shared stacks and budgets
(tests/unit/test_backend_construction.py). The stacks themselves come up through ``forgelib.stacks.provision``
(the fresh pipeline and its steps) and ``forgelib.stacks.warm`` (the warm pool).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from forgelib.stacks.stack import Stack

# The package's face is loaded on first use, not at import: the layer's own modules (provision, the warm
# pool, goldens) import their siblings through this package, and an eager face would import the backends,
# and everything above them, before those siblings exist.
_FACE = {
    **dict.fromkeys(
        ("STACK_MODES", "DockerBackend", "FreshSource", "SharedSource", "StackSource", "WarmSource"),
        "backends",
    ),
    "heal_leftovers": "backends",
    **dict.fromkeys(("SCOPES", "Mode", "Scope", "Stacks", "open"), "session"),
    "SharedStacks": "shared",
    "Stack": "stack",
}


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'forgelib.stacks' has no attribute {name!r}")
    return getattr(importlib.import_module(f"forgelib.stacks.{module}"), name)


__all__ = [
    "SCOPES",
    "STACK_MODES",
    "DockerBackend",
    "FreshSource",
    "Mode",
    "Scope",
    "SharedSource",
    "SharedStacks",
    "Stack",
    "StackSource",
    "Stacks",
    "WarmSource",
    "heal_leftovers",
    "open",
]
