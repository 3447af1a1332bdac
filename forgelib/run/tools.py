"""The trial's MCP tool server, as the solve phase needs it: started before the solver, always closed after.

``forgelib.mcp`` (the server itself: tools, tokens, the trace) is imported here only when a trial gets a
server, so a run that never serves tools never loads the ``mcp`` SDK. A command agent's trial always gets
one; an oracle's when its task declares tools (then the oracle acts through them, and its run has a trace
too). Every call the solver makes through it is appended to the trial's ``trace.jsonl``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TRACE_FILE = "trace.jsonl"


class Served(Protocol):
    """A running ``forgelib.mcp.ToolServer``."""

    @property
    def url(self) -> str: ...  # for a host process (127.0.0.1)
    @property
    def stack_url(self) -> str: ...  # for a process in the trial's stack (its network)
    @property
    def token(self) -> str: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Serving:
    """The server of one trial: where a solver at ``where`` reaches it, and its token."""

    server: Served

    def url_for(self, on_host: bool) -> str:
        return self.server.url if on_host else self.server.stack_url

    @property
    def token(self) -> str:
        return self.server.token


def available() -> bool:
    """Whether this forgelib has the tool server (``forgelib.mcp``) and its SDK installed."""
    return (
        importlib.util.find_spec("forgelib.mcp") is not None and importlib.util.find_spec("mcp") is not None
    )


def declared_tools(task: Any) -> tuple[str, ...] | None:
    """The tools the task offers (task.yaml ``tools:``), or None when it declares none (the default set)."""
    tools = getattr(task, "tools", None)
    return tuple(tools) if tools else None


@contextmanager
def serving(
    handle: Any, task: Any, trial_dir: Path, *, wanted: bool, network: str | None = None
) -> Iterator[Serving | None]:
    """The trial's tool server while the block runs (None when not ``wanted`` or not available); closed
    however the block ends (a failure, a timeout, Ctrl-C)."""
    if not wanted or not available():
        yield None
        return
    tool_server: Any = importlib.import_module("forgelib.mcp").ToolServer

    options: Mapping[str, Any] = {"services": tuple(sorted((handle.config.get("services") or {}).keys()))}
    tools = declared_tools(task)
    if tools is not None:
        options = {**options, "tools": tools}
    server: Served = tool_server.start(handle, **options, trace_path=trial_dir / TRACE_FILE, network=network)
    try:
        yield Serving(server)
    finally:
        server.close()
