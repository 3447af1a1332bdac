"""Where an agent inside the trial's stack reaches the tool server, and who may connect.

The server listens on 127.0.0.1 (the host's agents) and, when the trial offers it, on the trial network's
gateway: the host's own address on that docker bridge, which every container on the network routes to. A
container on *another* bridge can route to that address too (the host accepts traffic for any of its
addresses), so listening there is not enough: the server accepts a connection only from a loopback peer or
a peer inside the trial network's subnets, and answers 403 to anyone else before any MCP processing.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from forgelib.docker import argv as dk
from forgelib.errors import ForgeError
from forgelib.runner import Runner
from forgelib.stacks.stack import Stack

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class TrialNetwork:
    """A docker network of the trial: name, gateway address, subnets (``docker network inspect``)."""

    name: str
    gateway: str
    subnets: tuple[str, ...]

    @classmethod
    def inspect(cls, runner: Runner, name: str, *, timeout: float = 30) -> TrialNetwork:
        r = runner.run(dk.inspect([name], kind="network"), timeout=timeout, check=False)
        if r.rc != 0:
            raise ForgeError(
                f"cannot inspect docker network {name!r}: {r.stderr.strip() or r.stdout.strip()}"
            )
        return cls.of_inspect(name, json.loads(r.stdout))

    @classmethod
    def of_inspect(cls, name: str, data: Any) -> TrialNetwork:
        """From ``docker network inspect``'s JSON (a list of one network)."""
        info = data[0] if isinstance(data, list) and data else data
        configs = ((info or {}).get("IPAM") or {}).get("Config") or []
        v4 = [c for c in configs if ":" not in str(c.get("Subnet", ""))]
        gateways = [str(c["Gateway"]) for c in v4 if c.get("Gateway")]
        subnets = tuple(str(c["Subnet"]) for c in configs if c.get("Subnet"))
        if not gateways or not subnets:
            raise ForgeError(f"docker network {name!r} has no IPv4 gateway and subnet (IPAM: {configs!r})")
        return cls(name, gateways[0], subnets)


def stack_network_name(stack: Stack) -> str | None:
    """The docker network a stack's services share: the compose project's ``default`` network when its
    services use it, else the only network its resolved config declares; None when that is not one
    network."""
    networks, services = stack.resolved.networks, stack.resolved.services
    if not networks:
        return None
    used = set().union(*(set(s.networks or ["default"]) for s in services.values())) if services else set()
    key = "default" if "default" in networks and "default" in used else None
    if key is None and len(networks) == 1:
        key = next(iter(networks))
    if key is None:
        return None
    declared = networks[key]
    return str(declared.get("name") or f"{stack.name}_{key}")


def trial_network(runner: Runner, stack: Stack) -> TrialNetwork | None:
    """The network an agent inside the trial's stack shares with its services (``stack_network_name``),
    inspected; None when the services do not share one network (then the server is offered on loopback
    only)."""
    name = stack_network_name(stack)
    return TrialNetwork.inspect(runner, name) if name is not None else None


def allowed_peer(host: str | None, subnets: Iterable[str]) -> bool:
    """Whether a peer address may talk to the server: loopback, or inside one of ``subnets``."""
    if not host:
        return False
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return True
    return any(addr in ipaddress.ip_network(s, strict=False) for s in subnets)
