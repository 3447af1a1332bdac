"""Oracle for diagnose_stale_order: compare two layers, write a root-cause note, change nothing.

Streamed by forge to ``python3 -`` in the ``runner`` service (stdlib only: the python image has no pip).
``ORACLE_ROUTE`` picks which of the two ways to prove the cache stale it takes (grading.yaml scores each as
a route; either one passes):
  served  orders-api GET /orders/4021 (what clients are served) vs GET /orders/4021/source (postgres)
  cache   cache-admin GET /cache/order:4021 (what redis holds) vs orders-api GET /orders/4021/source
and writes /work/notes/root_cause.md, quoting the status each of its reads returned, and reads.json.

With the trial's MCP server (FORGE_MCP_URL / FORGE_MCP_TOKEN: the task declares `tools:`) it acts only
through the tools, as an agent would: every read (``http_request``) and write (``write_file``) is then in
the trial's trace.jsonl, graded like an agent's. The SDK is not in the runner image, so it speaks the
protocol itself (JSON-RPC over Streamable HTTP, a dozen lines); without a server it calls the services
directly.

Controls only: ``ORACLE_NOTE=unquoted`` writes the right cause without quoting any read (a weak note that
must fail); ``ORACLE_POST_STATUS`` also POSTs a status update, the one thing the task forbids (the gate
must fail it).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

ORDER = 4021
ORDERS_API = os.environ.get("ORDERS_API", "http://orders-api:8000")
CACHE_ADMIN = os.environ.get("CACHE_ADMIN", "http://cache-admin:8000")
NOTES = Path(os.environ.get("NOTES_DIR", "/work/notes"))


MCP_URL = os.environ.get("FORGE_MCP_URL")
_session: dict[str, str] = {}


def rpc(method: str, params: dict[str, Any], rid: int | None = None) -> Any:
    """One JSON-RPC message to the trial's MCP server (the session id it hands out kept for the rest)."""
    body = {"jsonrpc": "2.0", "method": method, "params": params, **({"id": rid} if rid else {})}
    headers = {
        "Authorization": "Bearer " + os.environ["FORGE_MCP_TOKEN"], "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18", **_session,
    }  # fmt: skip
    req = urllib.request.Request(str(MCP_URL), json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        if resp.headers.get("Mcp-Session-Id"):
            _session["Mcp-Session-Id"] = resp.headers["Mcp-Session-Id"]
        data = resp.read()
    return json.loads(data) if data else None


def tool(name: str, arguments: dict[str, Any]) -> str:
    if not _session:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "oracle", "version": "1"}}
        rpc("initialize", hello, 1)
        rpc("notifications/initialized", {})
    result = rpc("tools/call", {"name": name, "arguments": arguments}, 2)["result"]
    text = str(result["content"][0]["text"])
    if result.get("isError"):
        sys.exit(f"oracle: {name} failed: {text}")
    return text


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    if MCP_URL:  # through the tools: the service by name, the path as is
        service, path = url.removeprefix("http://").split(":8000", 1)
        args = {"service": service, "method": method, "path": path, "headers": {"Content-Type": "application/json"}}
        answer = json.loads(tool("http_request", {**args, **({"body": data.decode()} if data else {})}))
        return json.loads(answer["body"]), {k.lower(): v for k, v in answer["headers"].items()}
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp), dict(resp.headers)


def write(path: Path, text: str) -> None:
    if MCP_URL:
        tool("write_file", {"service": "runner", "path": str(path), "content": text})
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


ROUTE = os.environ.get("ORACLE_ROUTE", "served")
source, _ = call("GET", f"{ORDERS_API}/orders/{ORDER}/source")
evidence = [
    f'- orders-api GET /orders/{ORDER}/source -> status "{source["status"]}" (postgres, the source of truth)'
]
if ROUTE == "cache":
    cached, _ = call("GET", f"{CACHE_ADMIN}/cache/order:{ORDER}")
    stale = cached["value"]["status"]
    evidence.insert(0, f'- cache-admin GET /cache/order:{ORDER} -> status "{stale}" (ttl {cached["ttl"]})')
else:
    served, headers = call("GET", f"{ORDERS_API}/orders/{ORDER}")
    stale = served["status"]
    evidence.insert(
        0, f'- orders-api GET /orders/{ORDER} -> status "{stale}" (X-Cache: {headers.get("x-cache", "n/a")})'
    )
reads = {"route": ROUTE, "stale": stale, "source": source["status"]}
if stale == source["status"]:
    sys.exit(f"oracle: expected a stale copy of order {ORDER}, read {reads}")

CAUSE = """Root cause: missing cache invalidation. `POST /orders/{id}` updates the order in postgres but never
deletes (or rewrites) the cached `order:<id>` entry, and `GET /orders/{id}` is cache-first, so the copy
cached before the order changed keeps being served.

Fix: invalidate `order:<id>` in the same code path that commits the status update (delete the key after
the commit), and add a test that reads an order, updates its status and reads it again.
"""

write(NOTES / "reads.json", json.dumps(reads, indent=2) + "\n")
if os.environ.get("ORACLE_NOTE") == "unquoted":
    note = f"# Order {ORDER} is served with an outdated status\n\nThe cache and postgres disagree.\n\n{CAUSE}"
else:
    note = (
        f"# Order {ORDER} is served with a stale status\n\nEvidence:\n" + "\n".join(evidence) + f"\n\n{CAUSE}"
    )
write(NOTES / "root_cause.md", note)
print(f"oracle: reads {reads}; wrote {NOTES / 'root_cause.md'}", file=sys.stderr)

if status := os.environ.get("ORACLE_POST_STATUS"):
    call("POST", f"{ORDERS_API}/orders/{ORDER}", {"status": status})
    print(f"oracle (control): posted status {status!r} for order {ORDER}", file=sys.stderr)
