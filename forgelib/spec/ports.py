"""Which container ports the host reaches a service at, as its compose files say: what an ``http:`` check
needs at validate time.

An http check connects from the host to the port forge publishes for ``service:port`` in the trial
(``ComposeProject.port``), and forge publishes exactly two kinds of port: every ``ports:`` entry of the
compose file (moved to 127.0.0.1 at a random host port) and the port a reset recipe talks to directly
(postgres, redis). A port that is only in ``expose:`` (or only declared by the image) is reachable from the
other services, never from the host, so the check would fail at run time. Where the compose file does not
say for certain (a ``${VAR}`` in a port, ``network_mode``), nothing is checked: validate does not guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import SpecIssue
from forgelib.kinds.registry import REGISTRY
from forgelib.spec.composefiles import ComposeSet, ServiceDef
from forgelib.spec.models import SeedKind, Service
from forgelib.spec.rules import SeedSpec
from forgelib.spec.yamlpos import JsonPath, YamlDoc

_MAX_SHOWN = 8  # ports a message lists before "and N more"


@dataclass(frozen=True)
class ServicePorts:
    """What the host can reach of one service: ``published`` is None when it cannot be known."""

    published: frozenset[int] | None
    exposed: frozenset[int] = field(default_factory=frozenset)
    compose_file: str = ""  # where the service is defined (where a fix would add ports:)


def service_ports(cset: ComposeSet, direct: Mapping[str, SeedKind]) -> dict[str, ServicePorts]:
    """Every service of ``cset``; ``direct``: service -> the kind of the seed it resets from (its recipe may
    talk to a port directly, and forge publishes that port too)."""
    out = {}
    for name, sdef in cset.services.items():
        published = _published(sdef)
        kind = direct.get(name)
        if published is not None and kind is not None:
            port = _direct_port(kind, sdef)
            published = None if port is None else published | {port} if port else published
        exposed = frozenset(p for w in sdef.items("expose") for p in _container_ports(w.value) or ())
        out[name] = ServicePorts(published, exposed, sdef.defined.doc.display)
    return out


def _published(sdef: ServiceDef) -> frozenset[int] | None:
    if sdef.last("network_mode") is not None:
        return None  # another service's (or the host's) network: its ports are not this service's own
    if any(not isinstance(w.value, list) for w in sdef.keys.get("ports", ())):
        return None
    found: set[int] = set()
    for w in sdef.items("ports"):
        ports = _container_ports(w.value)
        if ports is None:
            return None
        found.update(ports)
    return frozenset(found)


def _direct_port(kind: SeedKind, sdef: ServiceDef) -> int | None:
    """The recipe's direct port (0: it has none), or None when the compose file leaves it to a variable."""
    config = ServiceConfig.of(sdef.data(), sdef.name)
    if any("$" in v for v in (*config.environment.values(), *config.command)):
        return None
    port = REGISTRY[kind].direct_port(config)
    return 0 if port is None else port


def _container_ports(item: Any) -> Iterable[int] | None:
    """The tcp container ports of one ``ports``/``expose`` entry (short or long syntax); None when the
    entry does not say for certain (a variable, a shape compose would reject)."""
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return (item,)
    if isinstance(item, dict):
        protocol = str(item.get("protocol") or "tcp")
        ports = _port_range(str(item.get("target", "")))
        return () if ports is not None and protocol != "tcp" else ports
    text, _, protocol = str(item).strip().partition("/")
    ports = _port_range(text.rsplit(":", 1)[-1])
    return () if ports is not None and protocol not in ("", "tcp") else ports


def _port_range(text: str) -> range | None:
    low, _, high = text.partition("-")
    if not low.isdigit() or not (high or low).isdigit():
        return None
    return range(int(low), int(high or low) + 1)


def check_http_ports(
    doc: YamlDoc, checks: Iterable[tuple[JsonPath, Mapping[str, Any]]], ports: Mapping[str, ServicePorts]
) -> list[SpecIssue]:
    """Every ``http:`` check whose port its service does not publish, located at its ``port`` with the fix.
    A service not in ``ports`` is someone else's error (the service check reports it)."""
    issues = []
    for at, check in checks:
        spec = check.get("http")
        if not isinstance(spec, Mapping):
            continue
        service, port = str(spec.get("service")), spec.get("port")
        known = ports.get(service)
        if known is None or known.published is None or not isinstance(port, int) or port in known.published:
            continue
        issues.append(doc.issue((*at, "http", "port"), _message(service, port, known)))
    return issues


def _message(service: str, port: int, known: ServicePorts) -> str:
    add = f'add ports: ["{port}"] to service {service!r} in {known.compose_file}'
    if port in known.exposed:
        return (
            f"service {service!r} only exposes port {port} (expose: lets the other services reach it, not "
            f"the host); an http check connects from the host, so publish it: {add} (forge gives it a random "
            "127.0.0.1 port per trial)"
        )
    if not known.published:
        return (
            f"service {service!r} publishes no ports, so an http check from the host cannot reach port "
            f"{port}; {add} (forge gives it a random 127.0.0.1 port per trial)"
        )
    return (
        f"service {service!r} does not publish port {port} (it publishes {_shown(known.published)}); "
        f'use one of those, or add "{port}" to its ports: in {known.compose_file}'
    )


def _shown(ports: Iterable[int]) -> str:
    ordered = sorted(ports)
    head = ", ".join(str(p) for p in ordered[:_MAX_SHOWN])
    return head + (f" and {len(ordered) - _MAX_SHOWN} more" if len(ordered) > _MAX_SHOWN else "")


def reset_kinds(
    services: Mapping[str, Service], seeds: Mapping[str, SeedSpec]
) -> Iterator[tuple[str, SeedKind]]:
    """(service, the kind of the seed it resets from) for every reset service whose seed's kind is known."""
    for name, svc in services.items():
        seed = seeds.get(svc.reset.seed) if svc.reset is not None else None
        if seed is not None and seed.kind is not None:
            yield name, seed.kind
