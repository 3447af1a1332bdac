"""The ``sql`` check on a postgres service: ``psql`` in the service, as the seed connected, rows unaligned
(``-At``: one line per row, ``|`` between columns)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.kinds.base import ExecStack, observe_exec
from forgelib.kinds.postgres.client import postgres_credentials
from forgelib.resolved import ServiceConfig


def observe(stack: ExecStack, spec: Mapping[str, Any], svc: ServiceConfig, timeout: float) -> str:
    user, db = postgres_credentials(spec, svc.environment)
    argv = ["psql", "-At", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", db, "-c", str(spec["query"])]
    return observe_exec(stack, spec["service"], argv, timeout)
