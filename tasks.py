"""`invoke --list` in a checkout shows the same commands as the installed `forge` program."""

from forgelib.cli.tasks import ns

__all__ = ["ns"]
