"""forge as a harbor environment (``pip install 'forgelib[harbor]'``; harbor needs Python >= 3.12).

``harbor run -p TASK --env forgelib.harbor:ForgeEnvironment [--ek stacks=warm] [--ek goldens=true]``: a
harbor task whose ``environment/`` holds a compose file (agent service ``main``) and a forge
``project.yaml`` runs on a forge stack: seeded, labelled, ready, reset in place between trials in warm
mode, reaped by ``forge reap`` if its process is killed. See docs/harbor.md.

Modules: ``stacks`` (a task's stacks through forge run's backends; no harbor), ``environment`` (the
``BaseEnvironment``). harbor is imported only inside this package, and only when ``ForgeEnvironment`` is
used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forgelib.harbor.environment import ForgeEnvironment

__all__ = ["ForgeEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "ForgeEnvironment":
        from forgelib.harbor.environment import ForgeEnvironment

        return ForgeEnvironment
    raise AttributeError(f"module 'forgelib.harbor' has no attribute {name!r}")
