"""Scripted agents for diagnose_stale_order: MCP clients with a fixed plan, acting only through the
trial's tools (so every read and write is in trace.jsonl for the trace checks to grade).

    python scripted.py PLAN     (forge runs it: run_configs/agent_*.yaml; FORGE_MCP_URL/TOKEN set)

  served   the served_vs_source route: orders-api GET /orders/4021 vs GET /orders/4021/source, the note
           quoting the statuses those reads returned (the reference solution, as an agent)
  cache    the cached_vs_api route: cache-admin GET /cache/order:4021 vs orders-api's /source
  post     served, then POSTs a status update: the shared gate must fail the trial (negative control)
  unread   reads only /source, yet quotes a served status it never read: the bound token must fail
  half     half of each route (the served read, the cached read, never /source): the trial scores the
           better incomplete route, never the sum of two halves
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ORDER = 4021
PLANS = ("served", "cache", "post", "unread", "half")
CAUSE = (
    "Root cause: missing cache invalidation. `POST /orders/{id}` updates the order in postgres but never\n"
    "deletes the cached `order:<id>` entry, and `GET /orders/{id}` is cache-first, so the copy cached\n"
    "before the order changed keeps being served.\n\nFix: invalidate `order:<id>` after the commit.\n"
)


async def main(plan: str) -> bool:
    auth = {"Authorization": f"Bearer {os.environ['FORGE_MCP_TOKEN']}"}
    async with (
        httpx2.AsyncClient(headers=auth, timeout=60) as http,
        streamable_http_client(os.environ["FORGE_MCP_URL"], http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()

        async def get(service: str, path: str) -> dict:
            got = await session.call_tool("http_request", {"service": service, "path": path})
            return json.loads(json.loads(got.content[0].text)["body"])

        lines = []
        if plan in ("served", "post", "half"):
            served = (await get("orders-api", f"/orders/{ORDER}"))["status"]
            lines.append(f'- orders-api GET /orders/{ORDER} -> status "{served}" (what clients are served)')
        if plan in ("cache", "half"):
            cached = (await get("cache-admin", f"/cache/order:{ORDER}"))["value"]["status"]
            lines.append(f'- cache-admin GET /cache/order:{ORDER} -> status "{cached}" (what redis holds)')
        if plan in ("served", "cache", "post", "unread"):
            source = (await get("orders-api", f"/orders/{ORDER}/source"))["status"]
            lines.append(f'- orders-api GET /orders/{ORDER}/source -> status "{source}" (postgres)')
        if plan == "unread":  # a status it never read: the one the cache is known to hold
            lines.insert(0, f'- orders-api GET /orders/{ORDER} -> status "processing" (what clients are served)')
        note = f"# Order {ORDER} is served with a stale status\n\nEvidence:\n" + "\n".join(lines) + f"\n\n{CAUSE}"
        args = {"service": "runner", "path": "/work/notes/root_cause.md", "content": note}
        wrote = await session.call_tool("write_file", args)
        print(f"plan {plan}: {wrote.content[0].text}")
        if plan == "post":  # the one thing the task forbids
            body = json.dumps({"status": "shipped"})
            post = {"service": "orders-api", "method": "POST", "path": f"/orders/{ORDER}", "body": body,
                    "headers": {"Content-Type": "application/json"}}  # fmt: skip
            posted = await session.call_tool("http_request", post)
            print(f"plan post: {posted.content[0].text[:200]}")
        return not wrote.is_error


if len(sys.argv) != 2 or sys.argv[1] not in PLANS:
    sys.exit(f"usage: scripted.py {{{'|'.join(PLANS)}}}")
sys.exit(0 if asyncio.run(main(sys.argv[1])) else 1)
