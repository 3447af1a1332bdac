"""How the e2e tests name the ways a pack's run gets its stacks."""

from __future__ import annotations


def stack_args(mode: str) -> list[str]:
    """``forge run`` options for a mode: ``fresh``, ``warm``, or ``snapshots`` (fresh stacks started from
    golden snapshots)."""
    return ["--stacks", "fresh", "--snapshots"] if mode == "snapshots" else ["--stacks", mode]
