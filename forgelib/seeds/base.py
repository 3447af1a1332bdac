"""The types every seed recipe shares: what a recipe sees (``SeedTarget``, ``ApplyContext``) and what it
provides (``Recipe``). Kept apart from the registry in ``__init__`` so recipe modules import them plainly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from forgelib.compose import ComposeProject
from forgelib.errors import RecipeError
from forgelib.spec.models import Seed, Timeouts

T = TypeVar("T")


class Memo:
    """Values derived from a seed version, computed once per owner (a run's backend) and shared by its trials.

    Key by what the value is derived from (e.g. the seed's path *and* digest): provisioning re-verifies a
    seed's digest right before every apply, so a value made for that digest still describes the seed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # trials of a run apply the same seed concurrently under --workers
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._values:
                self._values[key] = make()
            value: T = self._values[key]
            return value


@dataclass(frozen=True)
class SeedTarget:
    """What a recipe's host-side ``check`` sees: the seed and how the service binds it."""

    service: str
    seed: Seed
    options: Mapping[str, Any] = field(default_factory=dict)

    def fail(self, step: str, detail: str) -> RecipeError:
        """The error a recipe raises: which step on which service, and the diagnostics."""
        return RecipeError(f"{step} step on service '{self.service}': {detail}")


@dataclass(frozen=True, kw_only=True)
class ApplyContext(SeedTarget):
    """``SeedTarget`` plus the live stack: every container call goes through ``compose``."""

    compose: ComposeProject
    # The service's resolved compose config (`docker compose config`): environment is a dict, etc.
    service_config: Mapping[str, Any] = field(default_factory=dict)
    timeouts: Timeouts = field(default_factory=Timeouts)
    memo: Memo = field(default_factory=Memo)  # shared by the trials of one backend (see ``Memo``)

    def environment(self) -> Mapping[str, Any]:
        env = self.service_config.get("environment") or {}
        return env if isinstance(env, Mapping) else {}


class Recipe(Protocol):
    """What every module in this package provides (modules satisfy it structurally)."""

    @property
    def OPTIONS(self) -> frozenset[str]:
        """The ``reset:`` binding options the recipe understands (anything else is a spec error)."""
        ...

    def check(self, target: SeedTarget) -> None:
        """Host-side guards (the seed has the right shape); never touches a container."""
        ...

    def apply(self, ctx: ApplyContext) -> None:
        """Apply the seed to the running service; raise ``RecipeError`` on any failure."""
        ...

    def direct_port(self, service_config: Mapping[str, Any]) -> int | None:
        """The container port forge talks to directly (published on 127.0.0.1 by the override), or None
        when the recipe works through ``compose exec``/``cp`` only."""
        ...
