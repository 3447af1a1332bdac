"""The per-trial MCP tool server (``ToolServer``) and its trace; the only code that imports the ``mcp`` SDK.

``ToolServer`` is loaded at first use (``from forgelib.mcp import ToolServer``): the tool names
(``ALL_TOOLS``, ``DEFAULT_TOOLS``) and the trace reader are needed by the spec loader and grading, which
should not pay for importing the SDK and uvicorn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forgelib.mcp.names import ALL_TOOLS, DEFAULT_TOOLS
from forgelib.mcp.trace import read_trace

if TYPE_CHECKING:
    from forgelib.mcp.network import TrialNetwork
    from forgelib.mcp.server import ToolServer

__all__ = ["ALL_TOOLS", "DEFAULT_TOOLS", "ToolServer", "TrialNetwork", "read_trace"]


def __getattr__(name: str) -> Any:
    if name == "ToolServer":
        from forgelib.mcp.server import ToolServer

        return ToolServer
    if name == "TrialNetwork":
        from forgelib.mcp.network import TrialNetwork

        return TrialNetwork
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
