"""The trial manifest a command agent is given: who it is (trial, task, attempt), every service of its
stack and how to reach it *from where the agent runs*, and the trial's MCP tool server.

A host agent reaches a service at the 127.0.0.1 port forge published for it (``trial.yaml``'s ``ports``);
an agent inside the stack reaches it by service name and container port. Postgres and redis services also
get a connection string, from ``forgelib.stacks.connect`` (the credentials the seed itself used), never
rebuilt here. The manifest is data only: ``forgelib.run.agent`` writes it to ``manifest.json``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds import KINDS, Kind
from forgelib.kinds import registry as kinds
from forgelib.spec.models import HOST
from forgelib.stacks import connect
from forgelib.stacks.stack import Stack

MANIFEST_VERSION = 1
# trial.yaml's spelling of a published port: 127.0.0.1:49153->5432/tcp
_PUBLISHED = re.compile(r"^(?P<host>[^\s]+):(?P<hport>\d+)->(?P<cport>\d+)/(?P<proto>\w+)$")
# Servers that do not speak HTTP, so no URL for them: each kind's own port, and mongodb's (no kind yet).
_HTTP_PORTS_NOT = frozenset({27017, *(k.port for k in KINDS if k.port is not None)})


@dataclass(frozen=True)
class Access:
    """The trial's MCP server as the agent reaches it (``None`` fields: no server for this trial)."""

    url: str
    token: str


@dataclass(frozen=True)
class TrialIdent:
    run_id: str
    task: str
    index: int
    attempt: int

    @property
    def id(self) -> str:
        return f"{self.run_id}/{self.task}.{self.index}.a{self.attempt}"


def build(
    *,
    trial: TrialIdent,
    instruction: str,
    where: str,
    stack: Stack,
    files: Mapping[str, str],
    mcp: Access | None,
) -> dict[str, Any]:
    """The manifest of one trial for an agent running at ``where`` (``host`` or a service name), on
    ``stack``: its services as compose resolved them, the ports it publishes (as trial.yaml spells them)
    and the seed bindings of its environment. ``files``: what forge wrote for the agent (name -> path as
    the agent sees it)."""
    inside = where != HOST
    services: dict[str, Any] = {}
    for name, svc in sorted(stack.resolved.services.items()):
        entry: dict[str, Any] = {"host": name if inside else "127.0.0.1", "ports": {}, "urls": {}}
        for spelled in stack.ports.get(name, []):
            m = _PUBLISHED.match(spelled)
            if m is None:
                continue
            cport = int(m["cport"])
            port = cport if inside else int(m["hport"])
            entry["ports"][f"{cport}/{m['proto']}"] = port
            if m["proto"] == "tcp" and cport not in _HTTP_PORTS_NOT:
                entry["urls"][str(cport)] = f"http://{entry['host']}:{port}"
        kind = kinds.detect(svc)
        if kind is not None:
            entry["kind"] = kind.name
            entry.update(_connection(kind, name, svc, stack, inside))
        services[name] = entry
    return {
        "version": MANIFEST_VERSION,
        "trial": {
            "id": trial.id,
            "run_id": trial.run_id,
            "task": trial.task,
            "index": trial.index,
            "attempt": trial.attempt,
        },
        "task": {"name": trial.task, "instruction": instruction},
        "where": where,
        "files": dict(files),
        "services": services,
        "mcp": None if mcp is None else {"url": mcp.url, "token": mcp.token},
    }


def _connection(
    kind: Kind,
    name: str,
    svc: ServiceConfig,
    stack: Stack,
    inside: bool,
) -> dict[str, Any]:
    """The connection strings of a service of a kind forge connects to, or why there are none (its port is
    not published to the host: only a reset service's, or one the compose file publishes, is)."""
    client = kinds.client(kind)
    if client is None:
        return {}
    try:
        opts = connect.binding_options(stack.environment, name)
        return {kind.name: client.connection_strings(svc, opts, connect.address(stack.compose, name, inside))}
    except ForgeError as e:
        return {kind.name: None, "note": f"no connection string: {e}"}
