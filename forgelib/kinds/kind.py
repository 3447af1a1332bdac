"""What a kind *is*, as plain data: its name, how a compose service of it is recognised, and the names it
gives the spec (seed kinds, check types, MCP tools with their argument schemas), and where its code is.

Pure: imports nothing of forgelib but the typed compose config, so the spec's models and the MCP tool
names can be derived from the kinds (``forgelib.kinds.KINDS``) without loading any kind's implementation.
``forgelib.kinds.registry`` loads the implementations (seed recipes, observers, tool backends, clients,
rules) from the modules a kind names here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from forgelib.docker.resolved import ServiceConfig


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: its name, what the agent is told, and the JSON schema of its arguments (an object)."""

    name: str
    description: str
    schema: Mapping[str, Any]

    @property
    def arguments(self) -> tuple[str, ...]:
        """Its argument names as trace.jsonl records them."""
        return tuple(self.schema["properties"])


@dataclass(frozen=True)
class StandIn:
    """An offline stand-in image of a kind's server: built from ``images/<directory>/``, tagged ``tag``,
    and chosen by compose files through the variable ``var`` (``${var:-official image}``)."""

    directory: str
    tag: str
    var: str


@dataclass(frozen=True)
class Kind:
    """One sort of service state. ``images``/``detect`` empty: a kind for any service (tree, bare), never
    *detected*; a seed of it binds to whatever service the spec says.

    ``seeds``: seed kind (the spec's ``kind:``) -> module of this package that is its recipe;
    ``checks``: check type -> module whose ``observe`` answers it; ``tools``: the MCP tools it backs, each
    answered by ``tool_module``'s ``Backend``; ``client``: the module that is its ``Client``
    (``kinds.base``; None: no direct connection); ``rules``: the module whose ``problems`` checks a seed
    bound to a service."""

    name: str
    package: str  # the kind's package (``__name__`` of its ``__init__``)
    seeds: Mapping[str, str]
    shorthand: Mapping[str, str] = field(default_factory=dict)  # file suffix -> seed kind it implies
    directory_seeds: tuple[str, ...] = ()  # seed kinds whose seed is a directory (else a regular file)
    images: tuple[str, ...] = ()  # image repository names (any registry, tag, digest) that run this server
    # The port its server listens on unless the service says otherwise; not HTTP (the agent's manifest
    # offers no http:// URL for it).
    port: int | None = None
    detect: Callable[[ServiceConfig], bool] | None = None  # fallback when no kind's image matched
    # The names a warm reset of its seeds may be asked for (``reset: {strategy: ...}``); ``exact`` is every
    # kind's default and needs no entry. The spec's ``ResetStrategy`` and the schema's enum come from these.
    strategies: tuple[str, ...] = ()
    checks: Mapping[str, str] = field(default_factory=dict)
    # check type -> the JSON Schema of its fields (its ``$defs`` entry in schemas/grading.schema.json, which
    # ``forgelib.docsgen`` writes from here); a kind that observes a type another kind declares leaves it out
    check_fields: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tools: tuple[ToolSpec, ...] = ()
    tool_module: str | None = None
    client: str | None = None
    rules: str | None = None
    stand_in: StandIn | None = None
    # The module whose ``FORMS``/``SHELL_FORMS`` answer its servers' healthcheck commands from the host
    # (``forgelib/docker/hostprobe.py``; ``forgelib.kinds.registry`` registers them).
    host_checks: str | None = None
    # The conformance suite's checks a kind does not support, each with why (tests/integration/
    # test_kind_conformance.py skips them for this kind and says so).
    unsupported: Mapping[str, str] = field(default_factory=dict)

    @property
    def server(self) -> bool:
        """Whether a compose service can be recognised as this kind (a server the kind talks to)."""
        return bool(self.images) or self.detect is not None

    def module(self, name: str) -> ModuleType:
        """This kind's module ``name`` (``seed``, ``check``, ...)."""
        return importlib.import_module(f"{self.package}.{name}")

    def by_image(self, svc: ServiceConfig) -> bool:
        image = svc.image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0].lower()
        return bool(image) and image.startswith(self.images)
