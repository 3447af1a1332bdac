"""A complete forge agent: solves read_widget through the trial's MCP tools (docs/agents.md).

forge runs it once per trial with FORGE_MCP_URL / FORGE_MCP_TOKEN (the trial's tool server) set and the
task's instruction on stdin. A real agent hands the instruction and the listed tools to a model and
carries out the tool calls it asks for; this one follows a fixed plan.
"""

import asyncio, json, os, sys  # noqa: E401 - docs/agents.md shows this file as it is

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main() -> bool:
    instruction = sys.stdin.read()
    auth = {"Authorization": f"Bearer {os.environ['FORGE_MCP_TOKEN']}"}
    async with (
        httpx2.AsyncClient(headers=auth, timeout=60) as http,
        streamable_http_client(os.environ["FORGE_MCP_URL"], http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        print(f"task: {instruction.strip()}\ntools: {', '.join(tools)}")
        got = await session.call_tool("http_request", {"service": "widgets-api", "path": "/widgets/1"})
        name = json.loads(json.loads(got.content[0].text)["body"])["name"]
        note = {"service": "runner", "path": "/work/submission.txt", "content": name}
        wrote = await session.call_tool("write_file", note)
        print(wrote.content[0].text)
        return not wrote.is_error


sys.exit(0 if asyncio.run(main()) else 1)
