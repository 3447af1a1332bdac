"""inspect_ai's entry point (``[project.entry-points.inspect_ai]`` in pyproject.toml): importing this
registers the ``forge`` sandbox type. inspect loads it only when it looks for providers, so ``import
forgelib`` and the ``forge`` CLI never load inspect."""

from forgelib.inspect.environment import ForgeSandboxEnvironment

__all__ = ["ForgeSandboxEnvironment"]
