"""``bare``: the raw file (or directory) handed to its service verbatim, with no container action.

The convention: the generated compose override bind-mounts the seed **read-only** at
``/run/forge/seeds/<seed name>`` in the service it is bound to, and sets ``FORGE_SEED_<NAME>`` (the seed name
upper-cased, anything but letters and digits as ``_``) to that path in the service's environment and in the
oracle's exec when the oracle runs in that service: this kind's ``seed_mount`` (the Recipe hook).
``Stack.bare_seeds[service]`` is the ``SeedMount``; trial.yaml records it.
"""

from __future__ import annotations

import re
from pathlib import Path

from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds.base import (
    ApplyContext,
    Fingerprint,
    SeedMount,
    SeedTarget,
    no_checkpoint,
    no_checkpoint_restore,
    no_golden,
    no_settle,
    no_warm_process,
    reset_after,
)

OPTIONS: frozenset[str] = frozenset()
MOUNT_ROOT = "/run/forge/seeds"


BareMount = SeedMount  # the name it had before every kind could have one


def mount(service: str, seed: str, host_path: Path) -> SeedMount:
    name = re.sub(r"[^A-Za-z0-9]", "_", seed).upper()
    return SeedMount(service, seed, host_path, f"{MOUNT_ROOT}/{seed}", f"FORGE_SEED_{name}")


def seed_mount(target: SeedTarget) -> SeedMount | None:
    """The seed file (or directory), read-only at ``/run/forge/seeds/<seed>``, named by its variable."""
    return mount(target.service, target.seed.name, target.seed.path)


def check(target: SeedTarget) -> None:
    if not target.seed.path.exists():
        raise target.fail("guard", f"seed {target.seed.name!r} does not exist: {target.seed.path}")


def apply(ctx: ApplyContext) -> None:
    """Nothing to do in the container: the override mounted the seed before the service started."""


def direct_port(service_config: ServiceConfig) -> int | None:
    return None


def prepare(ctx: ApplyContext) -> None:
    """Nothing in a container to restore: a bare seed is a read-only mount of a host file."""


def reset(ctx: ApplyContext, prepared: object) -> None:
    """Nothing to do (see ``prepare``)."""


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    return {}


RECIPE_VERSION = 1
SUPPORTS_GOLDEN = False

checkpoint_path = no_checkpoint  # the seed is a read-only mount: nothing of the service's to capture
checkpoint_settle = no_settle
checkpoint_restore = no_checkpoint_restore  # restored through the checkpoint's image
checkpoint_prepare = prepare  # nothing to prepare: a read-only mount
reset_staged = reset_after(reset)
golden_path = no_golden  # applying this kind is already the copy a golden restore would be
golden_fingerprint = fingerprint


warm_process = no_warm_process  # a bare seed has no reset
