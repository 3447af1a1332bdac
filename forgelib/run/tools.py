"""The trial's MCP tool server, as the solve phase needs it: started before the solver, always closed after.

``forgelib.mcp``'s server (and with it the ``mcp`` SDK and uvicorn) is imported here only when a trial gets
a server, so a run that never serves tools never loads them. A command agent's trial always gets one; an
oracle's when its task declares ``tools:`` (then the oracle can act through them, and its run has a trace
too). Every call the solver makes through it is appended to the trial's ``trace.jsonl``.

A solver on the host reaches the server at ``url`` (127.0.0.1); one inside the stack (an agent with
``where: SERVICE``, every oracle) at ``stack_url``, on the gateway of the trial's own compose network,
which the server accepts connections from (and from loopback) and no other network.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelib.grading.traces import TRACE_FILE
from forgelib.spec.models import Task
from forgelib.stacks.stack import Stack


@dataclass(frozen=True)
class Serving:
    """The server of one trial (a ``forgelib.mcp.ToolServer``): where a solver reaches it, its token."""

    server: Any

    def url_for(self, on_host: bool) -> str | None:
        url: str | None = self.server.url if on_host else self.server.stack_url
        return url

    @property
    def token(self) -> str:
        return str(self.server.token)


def preload() -> None:
    """Import the server (the SDK, uvicorn: seconds of CPU on a busy machine) now, before any trial, so a
    run whose trials all get a server does not pay it inside the first one's solve phase."""
    importlib.import_module("forgelib.mcp.server")


def declares_tools(task: Task) -> bool:
    """Whether task.yaml names its tools."""
    return task.tools_declared


@contextmanager
def serving(
    handle: Stack, task: Task, trial_dir: Path, *, wanted: bool, in_stack: bool
) -> Iterator[Serving | None]:
    """The trial's tool server while the block runs (None when not ``wanted``), closed however the block
    ends (a failure, a timeout, Ctrl-C). ``in_stack``: the solver runs in the stack, so the server also
    listens on the trial's network."""
    if not wanted:
        yield None
        return
    from forgelib.mcp import ToolServer
    from forgelib.mcp.network import trial_network

    runner = getattr(handle.compose, "runner", None)  # a ComposeProject's (a test double has none)
    network = trial_network(runner, handle) if in_stack and runner is not None else None
    server = ToolServer.start(
        handle,
        tools=task.tools,
        trace_path=trial_dir / TRACE_FILE,
        network=network,
    )
    try:
        yield Serving(server)
    finally:
        server.close()
