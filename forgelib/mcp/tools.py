"""The tools of a trial's MCP server: their JSON schemas and descriptions, and what each does to the stack.

Every tool acts on one named service of *this* trial's stack and nothing else: files and commands through
the stack's ``exec`` (``docker exec`` into the service's container, the runner seam), HTTP and the
database clients through the loopback ports the stack publishes (as forge's http checks and ``connect``
do). A bad call (an unknown service, a bad argument, a missing path, a timeout, an oversized body) raises
``ToolFailure`` with a message for the agent; the server turns it into a tool error and goes on.

Results are text: plain for file contents and listings, JSON for everything with several parts (a status,
headers and a body; columns and rows). Sizes are bounded both ways (``BODY_LIMIT``, ``FILE_LIMIT``,
``OUTPUT_LIMIT``, a kind's own, ``MAX_RESULT``) so no call can fill forge's memory or the trace.

No SDK import here: the server module adapts this to the ``mcp`` package, and unit tests drive it alone.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jsonschema

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandTimeout, ForgeError, Interrupted
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import ToolBackend, ToolFailure, as_json, tool_failed
from forgelib.kinds.kind import ToolSpec
from forgelib.kinds.toolschema import DEFAULT_TIMEOUT, MAX_TIMEOUT
from forgelib.mcp.names import ALL_TOOLS, BODY_LIMIT, FILE_LIMIT, OUTPUT_LIMIT, SPECS
from forgelib.runner import Result
from forgelib.stacks.stack import Stack

LIST_LIMIT = 10_000  # entries list_dir returns
MAX_RESULT = 2 * FILE_LIMIT + 64 * 1024  # bytes of any result (a redis value, wide rows): else an error
__all__ = [  # defined with the tool names or the kinds, and named here for the server and tests
    "BODY_LIMIT",
    "DEFAULT_TIMEOUT",
    "FILE_LIMIT",
    "MAX_TIMEOUT",
    "OUTPUT_LIMIT",
    "SPECS",
    "ToolFailure",
    "ToolSpec",
]


def validate(tool: str, arguments: Any) -> dict[str, Any]:
    """``arguments`` checked against the tool's schema; a ``ToolFailure`` naming the field otherwise."""
    spec = SPECS.get(tool)
    if spec is None:
        raise ToolFailure(f"unknown tool {tool!r}; tools: {', '.join(ALL_TOOLS)}")
    if arguments is None:
        arguments = {}
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(spec.schema).iter_errors(arguments)
    )
    if error is not None:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ToolFailure(
            f"bad arguments for {tool}: {('arguments' + where) if where else 'arguments'}: {error.message}"
        )
    return dict(arguments)


# ------------------------------------------------------------------------------------------- services


class Toolbox:
    """The tools bound to one trial's stack. Thread-safe: the server runs each call on a worker thread.

    ``stack``: the trial's stack (its commands and published ports, and each service as compose resolved
    it, typed); ``services``: the services the tools may touch (default every one of the stack)."""

    def __init__(self, stack: Stack, services: Collection[str] | None = None) -> None:
        self._stack = stack
        names = sorted(stack.services) if services is None else sorted(services)
        unknown = [s for s in names if s not in stack.services]
        if unknown:
            raise ForgeError(
                f"the stack has no service {', '.join(map(repr, unknown))}; "
                f"services: {', '.join(sorted(stack.services))}"
            )
        self._services: dict[str, ServiceConfig] = {n: stack.service(n) for n in names}
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, int], tuple[str, int] | None] = {}
        self._backends: dict[str, ToolBackend] = {}  # kind name -> its tool backend, made at first use
        self._handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "http_request": self._http_request,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "list_dir": self._list_dir,
            "exec": self._exec_tool,
        }

    @property
    def services(self) -> list[str]:
        return list(self._services)

    def call(self, tool: str, arguments: Any) -> str:
        """Carry out one call; its result text, or ``ToolFailure``."""
        args = validate(tool, arguments)
        handler = self._handlers.get(tool)
        result = handler(args) if handler is not None else self._kind_tool(tool, args)
        size = len(result.encode("utf-8", "surrogatepass"))
        if size > MAX_RESULT:
            raise ToolFailure(f"the result is {size} bytes; at most {MAX_RESULT} are returned: ask for less")
        return result

    def close(self) -> None:
        with self._lock:
            backends = list(self._backends.values())
            self._backends.clear()
        for backend in backends:
            backend.close()

    # ------------------------------------------------------------------------------------ helpers

    def _service(self, args: Mapping[str, Any]) -> tuple[str, ServiceConfig]:
        name = str(args["service"])
        svc = self._services.get(name)
        if svc is None:
            raise ToolFailure(
                f"no service {name!r} in this trial's stack; services: {', '.join(self._services)}"
            )
        return name, svc

    def _kind_tool(self, tool: str, args: dict[str, Any]) -> str:
        """A tool a kind backs, carried out by the kind recognised for the service (``forgelib.kinds``)."""
        service, svc = self._service(args)
        kind = kinds.detect(svc)
        serving = kinds.kinds_for_tool(tool)
        if kind not in serving:
            names = " or ".join(k.name for k in serving)
            have = [n for n, s in self._services.items() if kinds.detect(s) in serving]
            shown = ", ".join(have) or "(none)"
            raise ToolFailure(f"service {service!r} is not a {names} service; {names} services: {shown}")
        assert kind is not None
        with self._lock:
            backend = self._backends.get(kind.name)
            if backend is None:
                backend = self._backends[kind.name] = kinds.tool_backend(kind)(self)
        return backend.call(tool, service, svc, args)

    # ToolContext (forgelib.kinds.base): what a kind's backend uses of this toolbox.
    def run(self, service: str, argv: Sequence[str], timeout: float, input: str | None = None) -> Result:
        return self._run(service, argv, timeout, input)

    def published(self, service: str, port: int) -> tuple[str, int] | None:
        return self._published(service, port)

    def _run(self, service: str, argv: Sequence[str], timeout: float, input: str | None = None) -> Result:
        try:
            return self._stack.exec(service, argv, timeout=timeout, check=False, input=input)
        except Interrupted:
            raise ToolFailure("forge is stopping this trial") from None
        except CommandTimeout as e:
            raise ToolFailure(
                f"`{argv[0]}` in service {service!r} timed out after {e.timeout:g}s (killed)"
            ) from None
        except ForgeError as e:
            raise ToolFailure(f"`{argv[0]}` in service {service!r} could not run: {e}") from None

    def _published(self, service: str, port: int) -> tuple[str, int] | None:
        """Where the host reaches ``service:port``; None when the stack does not publish it (asked once)."""
        key = (service, port)
        if key not in self._ports:
            try:
                self._ports[key] = self._stack.port(service, port)
            except Interrupted:
                raise ToolFailure("forge is stopping this trial") from None
            except ForgeError:
                self._ports[key] = None
        return self._ports[key]

    # -------------------------------------------------------------------------------------- files

    def _read_file(self, args: dict[str, Any]) -> str:
        service, _ = self._service(args)
        path = args["path"]
        # head, not cat: one byte past the limit says "too large" without moving the whole file.
        r = self._run(service, ["head", "-c", str(FILE_LIMIT + 1), "--", path], DEFAULT_TIMEOUT)
        if r.rc != 0:
            raise ToolFailure(_failed(r, f"cannot read {path} in service {service!r}"))
        if len(r.stdout.encode("utf-8", "surrogatepass")) > FILE_LIMIT:
            raise ToolFailure(
                f"{path} in service {service!r} is larger than {FILE_LIMIT} bytes; read part of it with exec"
            )
        return r.stdout

    def _write_file(self, args: dict[str, Any]) -> str:
        service, _ = self._service(args)
        path, content = args["path"], args["content"]
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > BODY_LIMIT:
            raise ToolFailure(f"content is {size} bytes; write_file takes at most {BODY_LIMIT}")
        # `cat > "$1"`: the path as an argument, never spliced into the shell text.
        r = self._run(service, ["sh", "-c", 'cat > "$1"', "sh", path], DEFAULT_TIMEOUT, input=content)
        if r.rc != 0:
            raise ToolFailure(_failed(r, f"cannot write {path} in service {service!r}"))
        return f"wrote {size} bytes to {path}"

    def _list_dir(self, args: dict[str, Any]) -> str:
        service, _ = self._service(args)
        path = args["path"]
        r = self._run(service, ["ls", "-1Ap", "--", path], DEFAULT_TIMEOUT)
        if r.rc != 0:
            raise ToolFailure(_failed(r, f"cannot list {path} in service {service!r}"))
        entries = r.stdout.splitlines()
        if len(entries) > LIST_LIMIT:
            return "\n".join([*entries[:LIST_LIMIT], f"... {len(entries) - LIST_LIMIT} more entries"])
        return "\n".join(entries)

    def _exec_tool(self, args: dict[str, Any]) -> str:
        service, _ = self._service(args)
        r = self._run(service, args["argv"], float(args.get("timeout", DEFAULT_TIMEOUT)))
        out, out_cut = _cut(r.stdout, OUTPUT_LIMIT)
        err, err_cut = _cut(r.stderr, OUTPUT_LIMIT)
        return _json(
            {
                "exit_code": r.rc,
                "stdout": out,
                "stderr": err,
                "stdout_truncated": out_cut,
                "stderr_truncated": err_cut,
            }
        )

    # --------------------------------------------------------------------------------------- http

    def _http_request(self, args: dict[str, Any]) -> str:
        service, svc = self._service(args)
        port = args.get("port") or _only_port(service, svc)
        where = self._published(service, int(port))
        if where is None:
            raise ToolFailure(
                f"service {service!r} does not publish port {port}; published: {_targets(svc) or '(none)'}"
            )
        body = args.get("body")
        data = body.encode("utf-8", "surrogatepass") if body is not None else None
        if data is not None and len(data) > BODY_LIMIT:
            raise ToolFailure(f"request body is {len(data)} bytes; http_request sends at most {BODY_LIMIT}")
        method, path = args.get("method", "GET"), args.get("path") or "/"
        path = path if path.startswith("/") else "/" + path
        conn = http.client.HTTPConnection(where[0], where[1], timeout=DEFAULT_TIMEOUT)
        try:
            conn.request(method, path, body=data, headers=dict(args.get("headers") or {}))
            resp = conn.getresponse()
            raw = resp.read(OUTPUT_LIMIT + 1)
            status = resp.status
            headers: dict[str, str] = {}
            for k, v in resp.getheaders():  # a repeated header (Set-Cookie) keeps every value
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
        except (OSError, http.client.HTTPException) as e:
            raise ToolFailure(
                f"{method} {path} to service {service!r} (port {port}) failed: {e or type(e).__name__}"
            ) from None
        finally:
            conn.close()
        text = raw[:OUTPUT_LIMIT].decode("utf-8", "replace")
        return _json(
            {"status": status, "headers": headers, "body": text, "body_truncated": len(raw) > OUTPUT_LIMIT}
        )


# ---------------------------------------------------------------------------------------- helpers


_failed = tool_failed
_json = as_json


def _cut(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode("utf-8", "surrogatepass")
    return (text, False) if len(raw) <= limit else (raw[:limit].decode("utf-8", "ignore"), True)


def _targets(svc: ServiceConfig) -> list[int]:
    return [int(t) for p in svc.ports if (t := str(p.get("target", ""))).isdigit()]


def _only_port(service: str, svc: ServiceConfig) -> int:
    targets = _targets(svc)
    if len(targets) == 1:
        return targets[0]
    if not targets:
        raise ToolFailure(f"service {service!r} publishes no port; http_request reaches published ports only")
    raise ToolFailure(
        f"service {service!r} publishes ports {', '.join(map(str, targets))}: say which with `port`"
    )
