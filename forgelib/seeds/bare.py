"""``bare``: the raw file (or directory) handed to its service verbatim, with no container action.

The convention: the generated compose override bind-mounts the seed **read-only** at
``/run/forge/seeds/<seed name>`` in the service it is bound to, and sets ``FORGE_SEED_<NAME>`` (the seed name
upper-cased, anything but letters and digits as ``_``) to that path in the service's environment and in the
oracle's exec when the oracle runs in that service. ``ProvisionedTrial.bare_seeds[service]`` is the
``BareMount``; trial.yaml records it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelib.seeds.base import ApplyContext, Fingerprint, SeedTarget, no_golden

OPTIONS: frozenset[str] = frozenset()
MOUNT_ROOT = "/run/forge/seeds"


@dataclass(frozen=True)
class BareMount:
    """Where a bare seed is in its service, and the variable that names it."""

    service: str
    seed: str
    host_path: Path  # absolute, verified against the seed's digest at load
    path: str  # inside the service
    env_var: str

    def volume(self) -> dict[str, Any]:
        """The override's long-syntax bind mount (read-only: the seed must stay what its digest says)."""
        return {"type": "bind", "source": str(self.host_path), "target": self.path, "read_only": True}

    def record(self) -> dict[str, str]:
        """As trial.yaml and ``forge provision --json`` show it."""
        return {"seed": self.seed, "host_path": str(self.host_path), "path": self.path, "env": self.env_var}


def mount(service: str, seed: str, host_path: Path) -> BareMount:
    name = re.sub(r"[^A-Za-z0-9]", "_", seed).upper()
    return BareMount(service, seed, host_path, f"{MOUNT_ROOT}/{seed}", f"FORGE_SEED_{name}")


def check(target: SeedTarget) -> None:
    if not target.seed.path.exists():
        raise target.fail("guard", f"seed {target.seed.name!r} does not exist: {target.seed.path}")


def apply(ctx: ApplyContext) -> None:
    """Nothing to do in the container: the override mounted the seed before the service started."""


def direct_port(service_config: Mapping[str, Any]) -> int | None:
    return None


def prepare(ctx: ApplyContext) -> None:
    """Nothing in a container to restore: a bare seed is a read-only mount of a host file."""


def reset(ctx: ApplyContext, prepared: object) -> None:
    """Nothing to do (see ``prepare``)."""


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    return {}


RECIPE_VERSION = 1
SUPPORTS_GOLDEN = False

golden_path = no_golden  # applying this kind is already the copy a golden restore would be
golden_fingerprint = fingerprint
