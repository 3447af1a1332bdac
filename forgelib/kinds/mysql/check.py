"""The ``sql`` check on a mysql service: the server's client in the service, as the seed connected, rows
in batch form (``-B -N``: one line per row, a tab between columns, no header)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds.base import ExecStack, observe_exec
from forgelib.kinds.mysql.client import client_argv, credentials


def observe(stack: ExecStack, spec: Mapping[str, Any], svc: ServiceConfig, timeout: float) -> str:
    creds = credentials(spec, svc.environment)
    argv = client_argv(creds, "--batch", "--skip-column-names", "--execute", str(spec["query"]))
    return observe_exec(stack, spec["service"], argv, timeout)
