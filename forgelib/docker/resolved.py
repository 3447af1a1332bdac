"""A stack's resolved compose config, typed: the one reader of what ``docker compose config`` printed.

``ComposeProject.config()`` returns the dict; ``ResolvedConfig.of(dict)`` (or ``ServiceConfig.of`` for
one service's) is the view the rest of forge reads: the fields forge uses, each normalised here once
(``environment`` a ``str -> str`` dict from either of compose's forms, ``command`` a list, long-syntax
``ports``/``volumes`` entries only, ``depends_on`` a dict of dicts). The dict itself stays the record
(``raw``): what is hashed (``snapshots.key.state_config``) and what the override builder copies from.
Pure: imports nothing of forgelib, so any module may read a config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _environment(raw: Any) -> dict[str, str]:
    """``environment`` as a dict: the mapping form (a value of None, ``FOO`` without one, is ``""``) or the
    ``KEY=VALUE`` list form."""
    if isinstance(raw, Mapping):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    out: dict[str, str] = {}
    for item in raw or []:
        k, _, v = str(item).partition("=")
        out[k] = v
    return out


def _replicas(raw: Mapping[str, Any]) -> int:
    deploy = raw.get("deploy")
    n = (deploy if isinstance(deploy, Mapping) else {}).get("replicas", raw.get("scale", 1))
    try:
        return int(n if n is not None else 1)
    except (TypeError, ValueError):
        return 1


def _mappings(raw: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(m for m in raw or [] if isinstance(m, Mapping))


@dataclass(frozen=True)
class ServiceConfig:
    """One service as compose resolved it; an absent field reads empty."""

    name: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    image: str = ""
    build: bool = False  # compose would build it (``build:``)
    environment: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()  # the list form; a string command split on whitespace
    # ``entrypoint`` as compose resolved it (a list), None when the service leaves the image's; a string
    # (compose's config prints lists, but a hand-made dict may not) reads as None too
    entrypoint: tuple[str, ...] | None = None
    user: str = ""  # ``user``, empty when the service leaves the image's
    ports: tuple[Mapping[str, Any], ...] = ()  # long syntax (target, published, host_ip, protocol)
    volumes: tuple[Mapping[str, Any], ...] = ()  # long syntax (type, source, target, volume.nocopy)
    depends_on: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # service -> {condition}
    networks: tuple[str, ...] = ()
    healthcheck: Mapping[str, Any] = field(default_factory=dict)  # test, interval, retries, disable, ...
    network_mode: str = ""  # "service:NAME" shares another service's network namespace
    volumes_from: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    container_name: str = ""  # a fixed name (a trial's override resets it: two stacks would clash)
    replicas: int = 1  # containers compose runs: ``deploy.replicas``, or the legacy ``scale``
    labels: Mapping[str, str] = field(default_factory=dict)  # the mapping or the ``KEY=VALUE`` list form

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None, name: str = "") -> ServiceConfig:
        raw = raw if isinstance(raw, Mapping) else {}
        command = raw.get("command") or []
        deps = raw.get("depends_on") or {}
        deps = deps if isinstance(deps, Mapping) else {}
        return cls(
            name=name,
            raw=raw,
            image=str(raw.get("image") or ""),
            build=bool(raw.get("build")),
            environment=_environment(raw.get("environment")),
            command=tuple(str(a) for a in (command if isinstance(command, list) else str(command).split())),
            entrypoint=tuple(str(a) for a in ep) if isinstance(ep := raw.get("entrypoint"), list) else None,
            user=str(raw.get("user") or ""),
            ports=_mappings(raw.get("ports")),
            volumes=_mappings(raw.get("volumes")),
            depends_on={str(d): dict(spec or {}) for d, spec in deps.items()}
            if isinstance(deps, Mapping)
            else {},
            networks=tuple(str(n) for n in raw.get("networks") or ()),
            healthcheck=dict(health) if isinstance(health := raw.get("healthcheck"), Mapping) else {},
            network_mode=str(raw.get("network_mode") or ""),
            volumes_from=tuple(str(v) for v in raw.get("volumes_from") or ()),
            links=tuple(str(v) for v in raw.get("links") or ()),
            container_name=str(raw.get("container_name") or ""),
            replicas=_replicas(raw),
            labels=_environment(raw.get("labels")),
        )

    def with_image(self, image: str) -> ServiceConfig:
        """This service running ``image`` instead of its own (a built or golden image), ``raw`` included."""
        return ServiceConfig.of({**self.raw, "image": image}, self.name)


@dataclass(frozen=True)
class ResolvedConfig:
    """The whole resolved config: its services (in compose's order), top-level volumes and networks."""

    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    services: Mapping[str, ServiceConfig] = field(default_factory=dict)
    volumes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> {name, external, ...}
    networks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> ResolvedConfig:
        raw = raw if isinstance(raw, Mapping) else {}
        return cls(
            raw=raw,
            services={str(n): ServiceConfig.of(s, str(n)) for n, s in (raw.get("services") or {}).items()},
            volumes={str(n): dict(v or {}) for n, v in (raw.get("volumes") or {}).items()},
            networks={str(n): dict(v or {}) for n, v in (raw.get("networks") or {}).items()},
        )

    def service(self, name: str) -> ServiceConfig:
        """``name``'s config; an empty one when the stack has no such service."""
        return self.services.get(name) or ServiceConfig(name)
