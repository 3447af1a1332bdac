"""``bare``: no container action. Provisioning exposes the seed's absolute path to the trial body
(``ProvisionedTrial.bare_seeds[service]``); the trial reads or mounts it itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.seeds.base import ApplyContext, Fingerprint, SeedTarget

OPTIONS: frozenset[str] = frozenset()


def check(target: SeedTarget) -> None:
    if not target.seed.path.exists():
        raise target.fail("guard", f"seed {target.seed.name!r} does not exist: {target.seed.path}")


def apply(ctx: ApplyContext) -> None:
    """Nothing to do in the container: the path is the seed."""


def direct_port(service_config: Mapping[str, Any]) -> int | None:
    return None


def prepare(ctx: ApplyContext) -> None:
    """Nothing in a container to restore: a bare seed is a host path the trial reads."""


def reset(ctx: ApplyContext, prepared: object) -> None:
    """Nothing to do (see ``prepare``)."""


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    return {}


RECIPE_VERSION = 1
SUPPORTS_GOLDEN = False


def golden_path(ctx: ApplyContext) -> str | None:
    return None  # no golden: applying this kind is already the copy a golden restore would be


def golden_fingerprint(ctx: ApplyContext) -> Fingerprint:
    return fingerprint(ctx)
