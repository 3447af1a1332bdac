"""``ToolServer``: one trial's MCP server (Streamable HTTP), in-process on a thread with its own event loop.

    with ToolServer.start(trial, tools=task.tools, trace_path=trial_dir / "trace.jsonl",
                          network=TrialNetwork.inspect(runner, name)) as srv:
        ... the agent gets srv.url (or srv.stack_url inside the stack) and srv.token ...

The SDK's low-level ``Server`` serves the tools (``tools.SPECS``: hand-written JSON schemas, validated by
``tools.validate``) rather than ``MCPServer``'s typed functions: every call must reach the trace, and
``MCPServer`` rejects a bad argument or an unknown tool before any code of ours runs. uvicorn serves the
SDK's Starlette app on sockets bound here (127.0.0.1 and, when offered, the trial network's gateway, each
on a random port), so the URL is known before the thread starts and start-to-ready is the app's start-up
only. In front of the app a small ASGI guard refuses a peer outside loopback and the trial network (403)
and a request without this trial's bearer token (401), before the MCP layer reads a byte of the body.
The SDK's OAuth resource-server machinery is not used: a per-trial static token needs one constant-time
comparison, not an authorization server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import mcp.types as mt
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings

from forgelib.errors import ForgeError
from forgelib.mcp.names import ALL_TOOLS, DEFAULT_TOOLS
from forgelib.mcp.network import TrialNetwork, allowed_peer
from forgelib.mcp.tools import BODY_LIMIT, SPECS, Toolbox, ToolFailure
from forgelib.mcp.trace import TraceWriter
from forgelib.stacks.stack import Stack

log = logging.getLogger(__name__)

PATH = "/mcp"
READY_TIMEOUT = 10.0  # seconds the server may take to start (it takes milliseconds: benchmarks/mcp_bench)
STOP_TIMEOUT = 10.0  # seconds close() waits for the thread
# A JSON-RPC message carries at most BODY_LIMIT bytes of content, which JSON escaping can double; a larger
# request is refused by the SDK with HTTP 413 before it is parsed.
MAX_MESSAGE = 2 * BODY_LIMIT + 64 * 1024


class ToolServer:
    """A running per-trial MCP server. ``start`` returns it ready; ``close`` (idempotent) stops it."""

    def __init__(self) -> None:  # use start()
        self.url = ""
        self.stack_url: str | None = None
        self.token = ""
        self.tools: tuple[str, ...] = ()
        self.trace_path = Path()
        self._thread: threading.Thread | None = None
        self._uvicorn: _Uvicorn | None = None
        self._sockets: list[socket.socket] = []
        self._toolbox: Toolbox | None = None
        self._trace: TraceWriter | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        # Tool calls block (docker exec, psql, HTTP): they run on threads of the server's own, which close()
        # joins, so a closed server leaves no thread behind (anyio's would idle on for a while).
        self._calls = ThreadPoolExecutor(max_workers=8, thread_name_prefix="forge-mcp-call")

    @classmethod
    def start(
        cls,
        stack: Stack,
        *,
        services: Collection[str] | None = None,
        tools: Sequence[str] = DEFAULT_TOOLS,
        trace_path: Path,
        network: TrialNetwork | None = None,
        fsync: bool = False,
    ) -> ToolServer:
        """Serve ``tools`` on ``stack`` (only ``services`` of it, default all), recording every call to
        ``trace_path``. ``network``: also listen on that docker network's gateway for agents inside the
        stack (``stack_url``), accepting peers from its subnets; None: loopback only (``stack_url`` None).
        ``fsync``: fsync the trace after every call (a power loss, not only a crash, loses nothing)."""
        unknown = [t for t in tools if t not in ALL_TOOLS]
        if unknown:
            raise ForgeError(
                f"unknown MCP tool(s) {', '.join(map(repr, unknown))}; tools: {', '.join(ALL_TOOLS)}"
            )
        srv = cls()
        try:
            srv._start(stack, services, tuple(dict.fromkeys(tools)), trace_path, network, fsync)
        except BaseException:
            srv.close()
            raise
        return srv

    def _start(
        self,
        stack: Stack,
        services: Collection[str] | None,
        tools: tuple[str, ...],
        trace_path: Path,
        network: TrialNetwork | None,
        fsync: bool,
    ) -> None:
        self.tools = tools
        self.token = secrets.token_urlsafe(32)
        self.trace_path = trace_path
        self._toolbox = Toolbox(stack, services)
        self._trace = TraceWriter(trace_path, fsync=fsync)
        host, port = self._listen("127.0.0.1")
        self.url = f"http://{host}:{port}{PATH}"
        hosts = [f"127.0.0.1:{port}", f"localhost:{port}"]
        subnets: tuple[str, ...] = ()
        if network is not None:
            gw, gport = self._listen(network.gateway)
            self.stack_url = f"http://{gw}:{gport}{PATH}"
            hosts.append(f"{gw}:{gport}")
            subnets = network.subnets
        app = _Guard(self._app(hosts), self.token, subnets)
        config = uvicorn.Config(
            app,
            log_config=None,  # never reconfigure the process's logging
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,  # an agent's open stream does not hold up the trial's end
            ws="none",
        )
        self._uvicorn = server = _Uvicorn(config)
        self._thread = threading.Thread(target=self._serve, name=f"forge-mcp-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not server.started:
            if not self._thread.is_alive():
                raise ForgeError(f"the MCP tool server failed to start: {self._failure or 'it exited'}")
            if time.monotonic() > deadline:
                raise ForgeError(f"the MCP tool server did not start within {READY_TIMEOUT:g}s")
            time.sleep(0.0005)

    def _listen(self, host: str) -> tuple[str, int]:
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an
        # accepted socket inherits the listener's (socket.create_server leaves it 0). Without it uvicorn's
        # response body waits for the client's delayed ACK of the headers, on every call.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.bind((host, 0))
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise ForgeError(f"the MCP tool server cannot listen on {host}: {e}") from None
        self._sockets.append(sock)
        return host, sock.getsockname()[1]

    def _serve(self) -> None:
        assert self._uvicorn is not None  # set before the thread starts
        try:
            asyncio.run(self._uvicorn.serve(sockets=self._sockets))
        except BaseException as e:  # noqa: BLE001 - kept for start()'s message; the thread must not print
            self._failure = e

    def _app(self, hosts: list[str]) -> Any:
        offered = self.tools

        async def list_tools(ctx: Any, params: Any) -> mt.ListToolsResult:
            return mt.ListToolsResult(
                tools=[
                    mt.Tool(name=n, description=SPECS[n].description, input_schema=dict(SPECS[n].schema))
                    for n in offered
                ]
            )

        async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._calls, self.call, params.name, params.arguments)

        server: Server[Any] = Server("forge-trial", on_list_tools=list_tools, on_call_tool=call_tool)
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[f"http://{h}" for h in hosts],
        )
        return server.streamable_http_app(
            streamable_http_path=PATH,
            json_response=True,
            transport_security=security,
            max_request_body_size=MAX_MESSAGE,
        )

    def call(self, tool: str, arguments: Any) -> mt.CallToolResult:
        """One tool call, carried out and recorded (the MCP handler's body; runs on a worker thread)."""
        assert self._toolbox is not None and self._trace is not None
        started = time.time()
        result: str | None = None
        error: str | None = None
        try:
            if tool not in self.tools:
                raise ToolFailure(
                    f"tool {tool!r} is not offered in this trial; tools: {', '.join(self.tools)}"
                )
            result = self._toolbox.call(tool, arguments)
        except ToolFailure as e:
            error = str(e)
        except Exception as e:  # a bug in a tool is that call's error, not the server's end
            log.exception("MCP tool %s failed unexpectedly", tool)
            error = f"internal error in {tool}: {type(e).__name__}: {e}"
        args = arguments if isinstance(arguments, Mapping) else {"(arguments)": arguments}
        self._trace.write(tool, args, started, time.time(), result=result, error=error)
        text = error if error is not None else (result or "")
        return mt.CallToolResult(content=[mt.TextContent(type="text", text=text)], is_error=error is not None)

    @property
    def calls(self) -> int:
        """Calls recorded so far."""
        return self._trace.calls if self._trace is not None else 0

    def close(self) -> None:
        """Stop serving: the thread joined, the sockets closed, the trace and connections closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._uvicorn is not None:
            self._uvicorn.stop()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT)
            if self._thread.is_alive() and self._uvicorn is not None:  # a tool call still running: stop now
                self._uvicorn.force_exit = True
                self._thread.join(STOP_TIMEOUT)
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        if self._toolbox is not None:
            self._toolbox.close()
        self._calls.shutdown(wait=True, cancel_futures=True)  # a call still running ends by its own timeout
        if self._trace is not None:
            self._trace.close()

    def __enter__(self) -> ToolServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, stopped at once: its own loop polls ``should_exit`` and its shutdown sleeps
    once more, a wait at the end of every trial. Here ``stop()`` wakes the loop, and shutdown
    waits only while a response is still being sent (at most ``timeout_graceful_shutdown``)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        if self.should_exit:  # stop() came before the loop was known
            return
        while not self.should_exit:
            await self.on_tick(0)  # refreshes the Date header (uvicorn does it once a second)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)

    def stop(self) -> None:
        """From any thread: end ``main_loop`` now."""
        self.should_exit = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(stopping.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close now, busy ones after their response
        deadline = time.monotonic() + float(self.config.timeout_graceful_shutdown or 0)
        while self.server_state.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for task in self.server_state.tasks:
            task.cancel()
        await self.lifespan.shutdown()


class _Guard:
    """ASGI wrapper: a peer outside loopback and the trial network gets 403, a request without the bearer
    token 401; neither reaches the MCP app."""

    def __init__(self, app: Any, token: str, subnets: Sequence[str]) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()
        self._subnets = tuple(subnets)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: the SDK's session manager starts and stops here
            await self._app(scope, receive, send)
            return
        client = scope.get("client")
        if not allowed_peer(client[0] if client else None, self._subnets):
            await _plain(send, 403, b"forbidden: not a peer of this trial\n")
            return
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if not secrets.compare_digest(given, self._expected):
            await _plain(send, 401, b"unauthorized: this trial's bearer token is required\n", bearer=True)
            return
        await self._app(scope, receive, send)


async def _plain(send: Any, status: int, body: bytes, *, bearer: bool = False) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    if bearer:
        headers.append((b"www-authenticate", b'Bearer realm="forge-trial"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
