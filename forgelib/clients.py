"""The client libraries forge talks to services with (psycopg, redis), loaded at their first use.

Importing them costs ≈ 0.85 s of CPU on the 2-core test box (redis ≈ 0.55 s, psycopg ≈ 0.3 s), and the
spec loader reaches the recipe modules that use them (each recipe owns its options). A process that loads
a project but never talks to a service — the ``forge run --cluster`` driver, whose trials run on the
nodes, or ``forge validate`` — should not pay for them. So ``connect`` and the recipes name them through
``deferred``. Nor does a run whose trials never use them: a fresh stack is seeded with the services' own
tools (psql, redis-cli, docker cp), so only warm stacks' resets and fingerprints and golden checks connect.
A local ``forge run`` that will use them loads them up front with ``load``, so no trial's step pays for the
import; cluster slots run fresh stacks without goldens only and never load them.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

# Every module named through ``deferred`` so far: the kinds' client libraries, whose modules name them.
_DEFERRED: dict[str, None] = {}
_LOCK = threading.Lock()


class Deferred:
    """A module imported at the first attribute looked up on it (``importlib.import_module``: thread-safe,
    and a dict lookup once loaded). ``importlib.util.LazyLoader`` is not used: on Python 3.11 two threads
    touching a lazy module at once can see it half-loaded."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


def deferred(name: str) -> Any:
    with _LOCK:
        _DEFERRED[name] = None
    return Deferred(name)


def load() -> None:
    """Import the client libraries now (a process about to run trials): every one a loaded module named
    through ``deferred``."""
    with _LOCK:
        names = list(_DEFERRED)
    for name in names:
        importlib.import_module(name)


__all__ = ["Deferred", "deferred", "load"]
