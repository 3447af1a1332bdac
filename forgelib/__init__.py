"""forgelib: declarative, reproducible per-trial docker compose stacks with verified seeds."""

__version__ = "0.1.0"
