"""Lookups over the kinds (``forgelib.kinds.KINDS``, the one list) and their implementations.

The model (seed kind, kind, check type, tool) is described once, in ``forgelib.kinds``. Here: which
kind a compose service is (``detect``), which kind applies a seed bound to a service (``recipe_for``),
answers a check (``observer_for``) or a tool call (``kinds_for_tool``), and the names the spec uses
(``SEED_KINDS``, ``CHECK_TYPES``, ``TOOL_SPECS``), all derived from ``KINDS``.

Each seed kind's recipe satisfies ``Recipe`` (``forgelib.kinds.base``): ``check`` (host-side guards only,
no container call — run before the stack exists, so a broken seed costs nothing) and ``apply`` (runs after
the service and what it depends on are up and healthy, before any dependent service starts). Both raise
``RecipeError`` naming the service; provisioning wraps it as ``ProvisionError(stage="reset_recipe")``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

from forgelib.docker import hostprobe
from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import CHECK_TYPES, KINDS, SEED_KINDS, Kind
from forgelib.kinds.base import Client, Recipe
from forgelib.kinds.kind import ToolSpec
from forgelib.spec.models import SeedKind

BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
# The compose label by which a service says which server kind it runs, for an image forge cannot
# recognise (``io.forgelib.kind: mysql``): it wins over detection; ``forge validate`` checks its value.
DECLARED = "io.forgelib.kind"
SERVER_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS if k.server)

# seed kind -> the kinds that accept it, in ``KINDS`` order (the first is the one for an unrecognised service)
_SEED_KINDS: dict[str, list[Kind]] = {}
for _k in KINDS:
    for _s in _k.seeds:
        _SEED_KINDS.setdefault(_s, []).append(_k)

# check type -> the kinds that observe it; the check types of kinds (file, http, trace are grading's own)
_CHECKS: dict[str, list[Kind]] = {}
for _k in KINDS:
    for _c in _k.checks:
        _CHECKS.setdefault(_c, []).append(_k)

# tool -> the kinds that back it; the tools' specs (one per name: kinds sharing a tool share its spec)
_TOOLS: dict[str, list[Kind]] = {}
TOOL_SPECS: dict[str, ToolSpec] = {}
for _k in KINDS:
    for _t in _k.tools:
        _TOOLS.setdefault(_t.name, []).append(_k)
        TOOL_SPECS.setdefault(_t.name, _t)


# Each kind's healthcheck forms that readiness may answer from the host (``Kind.host_checks``).
for _k in KINDS:
    if _k.host_checks:
        _forms = _k.module(_k.host_checks)
        hostprobe.register(_forms.FORMS, _forms.SHELL_FORMS)


def by_name(name: str) -> Kind:
    return BY_NAME[name]


def detect(svc: ServiceConfig) -> Kind | None:
    """The server kind ``svc`` runs, or None: the kind its ``DECLARED`` label names, else by its image's
    repository name (any registry, tag or digest, or an offline stand-in), then by each kind's own test of
    its environment or command."""
    declared = svc.labels.get(DECLARED)
    if declared:
        found = BY_NAME.get(declared)
        return found if found is not None and found.server else None
    return detected(svc)


def detected(svc: ServiceConfig) -> Kind | None:
    """What ``detect`` finds without the ``DECLARED`` label: the image, else each kind's own test."""
    for kind in KINDS:
        if kind.by_image(svc):
            return kind
    for kind in KINDS:
        if kind.detect is not None and kind.detect(svc):
            return kind
    return None


def server_kind(svc: ServiceConfig) -> str | None:
    """The name of the kind ``detect`` finds (what the agent's manifest and the MCP tools say a service
    is), or None."""
    kind = detect(svc)
    return kind.name if kind is not None else None


def kinds_for_seed(seed_kind: str) -> list[Kind]:
    return list(_SEED_KINDS.get(seed_kind, ()))


def kinds_for_check(check_type: str) -> list[Kind]:
    return list(_CHECKS.get(check_type, ()))


def kinds_for_tool(tool: str) -> list[Kind]:
    return list(_TOOLS.get(tool, ()))


def _choose(candidates: list[Kind], svc: ServiceConfig | None) -> Kind | None:
    """Of the kinds that could serve, the one for ``svc``: the kind recognised for it when that is one of
    them; for an unrecognised service (or none given), the first; for a service recognised as another
    kind, the first that fits any service (tree, bare); else None: nothing fits."""
    found = detect(svc) if svc is not None else None
    if found is not None and found in candidates:
        return found
    if found is None and candidates:
        return candidates[0]
    return next((k for k in candidates if not k.server), None)


def kind_for_seed(seed_kind: str, svc: ServiceConfig | None = None) -> Kind | None:
    """The kind that applies a ``seed_kind`` seed bound to ``svc`` (see ``_choose``); None: none fits."""
    return _choose(kinds_for_seed(seed_kind), svc)


def kind_for_check(check_type: str, svc: ServiceConfig | None = None) -> Kind | None:
    return _choose(kinds_for_check(check_type), svc)


def kind_for_tool(tool: str, svc: ServiceConfig | None = None) -> Kind | None:
    return _choose(kinds_for_tool(tool), svc)


def recipe(kind: Kind, seed_kind: str) -> Recipe:
    """``kind``'s recipe for ``seed_kind`` (a module satisfying ``Recipe``)."""
    return cast(Recipe, kind.module(kind.seeds[seed_kind]))


def recipe_for(seed_kind: str, svc: ServiceConfig | None = None) -> Recipe | None:
    kind = kind_for_seed(seed_kind, svc)
    return recipe(kind, seed_kind) if kind is not None else None


Observer = Callable[..., str]


def observer(kind: Kind, check_type: str) -> Observer:
    """``kind``'s ``observe(stack, spec, service_config, timeout) -> str`` for ``check_type``."""
    fn: Observer = kind.module(kind.checks[check_type]).observe
    return fn


def client(kind: Kind) -> Client | None:
    """``kind``'s client module (a ``Client``: ``forgelib.kinds.base``), or None when forge never connects
    to it."""
    return cast(Client, kind.module(kind.client)) if kind.client else None


def tool_backend(kind: Kind) -> Any:
    """``kind``'s MCP tool ``Backend`` class (see ``forgelib.kinds.base.ToolBackend``)."""
    return kind.module(kind.tool_module).Backend if kind.tool_module else None


def rules(kind: Kind) -> ModuleType | None:
    return kind.module(kind.rules) if kind.rules else None


# seed kind -> the recipe of the first kind that accepts it (a service that is no recognised kind).
REGISTRY: dict[str, Recipe] = {SeedKind(s): recipe(ks[0], s) for s, ks in _SEED_KINDS.items()}

__all__ = [
    "BY_NAME",
    "CHECK_TYPES",
    "DECLARED",
    "KINDS",
    "REGISTRY",
    "SEED_KINDS",
    "SERVER_KINDS",
    "TOOL_SPECS",
    "by_name",
    "detect",
    "detected",
    "kind_for_check",
    "kind_for_seed",
    "kind_for_tool",
    "kinds_for_check",
    "kinds_for_seed",
    "kinds_for_tool",
    "recipe",
    "recipe_for",
    "server_kind",
]
