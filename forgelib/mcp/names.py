"""The tool names a task may offer (``task.yaml``'s ``tools:``) and the default set; no SDK import, so the
spec loader can name them without loading the ``mcp`` package."""

from __future__ import annotations

ALL_TOOLS: tuple[str, ...] = (
    "http_request",
    "read_file",
    "write_file",
    "list_dir",
    "exec",
    "sql_query",
    "redis_command",
)

# Everything but `exec`: the other tools each do one named thing an evaluation can grade from its trace
# (a read, a write, a query); `exec` runs any program as the service's user, so a task offers it on purpose.
DEFAULT_TOOLS: tuple[str, ...] = tuple(t for t in ALL_TOOLS if t != "exec")
