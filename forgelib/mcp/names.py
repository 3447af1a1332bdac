"""The tools a task may offer (``task.yaml``'s ``tools:``), each with its arguments as trace.jsonl records
them, and the default set; no SDK import, so the spec loader can name them (and check a trace check's
``tool`` and argument names) without loading the ``mcp`` package. ``tools.SPECS`` must match: its import
checks it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

TOOL_ARGUMENTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "http_request": ("service", "method", "path", "port", "headers", "body"),
        "read_file": ("service", "path"),
        "write_file": ("service", "path", "content"),
        "list_dir": ("service", "path"),
        "exec": ("service", "argv", "timeout"),
        "sql_query": ("service", "query", "database", "timeout"),
        "redis_command": ("service", "command"),
    }
)
ALL_TOOLS: tuple[str, ...] = tuple(TOOL_ARGUMENTS)

# Everything but `exec`: the other tools each do one named thing an evaluation can grade from its trace
# (a read, a write, a query); `exec` runs any program as the service's user, so a task offers it on purpose.
DEFAULT_TOOLS: tuple[str, ...] = tuple(t for t in ALL_TOOLS if t != "exec")
