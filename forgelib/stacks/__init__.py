"""Where every front end gets its stacks (the start of the stack layer, issue 29).

* ``backends`` — ``DockerBackend`` (fresh, optionally from goldens), ``WarmBackend`` (``--stacks warm``)
  and ``make_backend``, which picks one for a run: used by ``forge run`` (``run/cli.py``) and by a
  cluster node (``cluster/node.py``).

``forge provision`` (``commands.py``) and the pytest plugin (``pytest_stacks.py``) still call
``forgelib.provision`` / ``forgelib.warm`` themselves; moving them here is the rest of issue 29.
"""

from __future__ import annotations

from forgelib.stacks.backends import STACK_MODES, DockerBackend, WarmBackend, make_backend

__all__ = ["STACK_MODES", "DockerBackend", "WarmBackend", "make_backend"]
