"""An MCP ``initialize`` request as plain HTTP, for what the SDK client cannot show: the status a bearer
token (or none) gets from a trial's tool server (test_mcp_server.py, benchmarks/mcp_bench.py)."""

from __future__ import annotations

import http.client
import json

INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
)


def raw_post(url: str, token: str | None) -> int:
    """The HTTP status of an ``initialize`` POST, with ``token`` as the bearer (None: no header)."""
    host, port = url.split("/")[2].rsplit(":", 1)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/mcp", body=INITIALIZE, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()
