"""forge as an inspect_ai sandbox type (``pip install 'forgelib[inspect]'``).

``sandbox=("forge", "path/to/project.yaml")`` or ``SandboxEnvironmentSpec("forge", ForgeConfig(...))``;
``forge_scorer()`` grades a sample's stack with its forge task's grading.yaml. inspect_ai is imported
only inside this package, and only when one of these names is used (``ForgeConfig`` needs pydantic alone).

Modules: ``stacks`` (a task's stacks through forge run's backends; no inspect), ``config`` (ForgeConfig),
``environment`` (the SandboxEnvironment), ``grade`` (grading.yaml on a stack; no inspect), ``scorer``,
``registry`` (the entry point). Absolute imports only: this package's name must never shadow the stdlib's
``inspect`` (``from forgelib import inspect`` would; nothing in forgelib does that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forgelib.inspect.config import ForgeConfig
    from forgelib.inspect.environment import ForgeSandboxEnvironment
    from forgelib.inspect.scorer import forge_scorer

__all__ = ["ForgeConfig", "ForgeSandboxEnvironment", "forge_scorer"]


def __getattr__(name: str) -> Any:
    if name == "forge_scorer":
        from forgelib.inspect.scorer import forge_scorer

        return forge_scorer
    if name == "ForgeConfig":
        from forgelib.inspect.config import ForgeConfig

        return ForgeConfig
    if name == "ForgeSandboxEnvironment":
        from forgelib.inspect.environment import ForgeSandboxEnvironment

        return ForgeSandboxEnvironment
    raise AttributeError(f"module 'forgelib.inspect' has no attribute {name!r}")
