"""The tools of a trial's MCP server: their JSON schemas and descriptions, and what each does to the stack.

Every tool acts on one named service of *this* trial's stack and nothing else: files and commands through
the stack's ``exec`` (``docker exec`` into the service's container, the runner seam), HTTP and the
database clients through the loopback ports the stack publishes (as forge's http checks and ``connect``
do). A bad call (an unknown service, a bad argument, a missing path, a timeout, an oversized body) raises
``ToolFailure`` with a message for the agent; the server turns it into a tool error and goes on.

Results are text: plain for file contents and listings, JSON for everything with several parts (a status,
headers and a body; columns and rows). Sizes are bounded both ways (``BODY_LIMIT``, ``FILE_LIMIT``,
``OUTPUT_LIMIT``, ``ROW_LIMIT``, ``MAX_RESULT``) so no call can fill forge's memory or the trace.

No SDK import here: the server module adapts this to the ``mcp`` package, and unit tests drive it alone.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from forgelib.clients import deferred
from forgelib.connect import RedisParams
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import CommandTimeout, ForgeError, Interrupted, tail
from forgelib.grading.checks import Stack
from forgelib.mcp.names import ALL_TOOLS, TOOL_ARGUMENTS
from forgelib.runner import Result
from forgelib.seeds import redis_dump, sql_dump

if TYPE_CHECKING:
    import psycopg
    import redis as redis_lib
else:
    psycopg = deferred("psycopg")
    redis_lib = deferred("redis")

BODY_LIMIT = 1 << 20  # bytes an agent may send: an HTTP request body, a file's new content
FILE_LIMIT = 1 << 20  # bytes read_file returns; a larger file is an error that says so
OUTPUT_LIMIT = 256 * 1024  # bytes kept of an HTTP response body and of each of exec's stdout and stderr
ROW_LIMIT = 1000  # rows sql_query returns; more are counted, not sent
LIST_LIMIT = 10_000  # entries list_dir returns
MAX_RESULT = 2 * FILE_LIMIT + 64 * 1024  # bytes of any result (a redis value, wide rows): else an error
DEFAULT_TIMEOUT = 30.0  # seconds, for every tool that does not take a timeout
MAX_TIMEOUT = 600.0  # the longest timeout exec and sql_query accept


class ToolFailure(Exception):
    """A call the tool could not carry out; ``str()`` is what the agent is told."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    schema: Mapping[str, Any]  # the JSON schema of the arguments (an object)
    kind: str | None  # the service kind the tool needs (postgres, redis) or None for any service


def _service(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": f"The compose service {what}."}


def _object(properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def _path(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": f"Absolute path of the {what} in the container."}


_TIMEOUT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": MAX_TIMEOUT,
    "description": "Seconds (default 30).",
}

SPECS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "http_request",
            "Send one HTTP request to a service of the stack, on a port the service publishes, and return "
            'JSON {"status", "headers", "body", "body_truncated"}. Redirects are not followed. The request '
            f"body is at most {BODY_LIMIT} bytes; the first {OUTPUT_LIMIT} bytes of the response body are "
            "returned. A 4xx/5xx status is a normal result, not an error.",
            _object(
                {
                    "service": _service("to send the request to"),
                    "method": {
                        "type": "string",
                        "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                        "description": "HTTP method (default GET).",
                    },
                    "path": {
                        "type": "string",
                        "description": "Path and query, e.g. /orders/7?full=1 (default /).",
                    },
                    "port": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65535,
                        "description": "The service's port in the stack; needed when it publishes several.",
                    },
                    "headers": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": "Request headers.",
                    },
                    "body": {"type": "string", "description": "Request body (text; send JSON as a string)."},
                },
                ["service"],
            ),
            None,
        ),
        ToolSpec(
            "read_file",
            f"Return the text of a file in a service's container (at most {FILE_LIMIT} bytes; a larger "
            "file is an error).",
            _object(
                {"service": _service("whose container holds the file"), "path": _path("file")},
                ["service", "path"],
            ),
            None,
        ),
        ToolSpec(
            "write_file",
            "Create or replace a file in a service's container with the given text (at most "
            f"{BODY_LIMIT} bytes). The directory must exist.",
            _object(
                {
                    "service": _service("whose container gets the file"),
                    "path": _path("file"),
                    "content": {"type": "string", "description": "The file's whole new content."},
                },
                ["service", "path", "content"],
            ),
            None,
        ),
        ToolSpec(
            "list_dir",
            "List a directory in a service's container: one entry per line, directories ending in '/', "
            "hidden entries included.",
            _object(
                {"service": _service("whose container holds the directory"), "path": _path("directory")},
                ["service", "path"],
            ),
            None,
        ),
        ToolSpec(
            "exec",
            "Run a program (an argv list, no shell unless you run one) in a service's container and return "
            'JSON {"exit_code", "stdout", "stderr"}; a nonzero exit code is a result, not an error. '
            f"Output beyond {OUTPUT_LIMIT} bytes per stream is cut.",
            _object(
                {
                    "service": _service("to run the program in"),
                    "argv": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "description": 'Program and arguments, e.g. ["ls", "-l", "/srv"].',
                    },
                    "timeout": _TIMEOUT,
                },
                ["service", "argv"],
            ),
            None,
        ),
        ToolSpec(
            "sql_query",
            "Run SQL on a postgres service (autocommit; several statements may be separated by ';') and "
            'return JSON {"columns", "rows", "rowcount", "status", "rows_truncated"}: the last '
            f"statement's result, at most {ROW_LIMIT} rows. Values that are not JSON types come back as "
            "strings.",
            _object(
                {
                    "service": _service("running postgres"),
                    "query": {"type": "string", "minLength": 1, "description": "The SQL."},
                    "database": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Database (default the service's).",
                    },
                    "timeout": _TIMEOUT,
                },
                ["service", "query"],
            ),
            "postgres",
        ),
        ToolSpec(
            "redis_command",
            'Run one command on a redis service and return JSON {"reply": ...}: strings, integers, lists '
            "and null as redis answers (bulk strings decoded as UTF-8).",
            _object(
                {
                    "service": _service("running redis"),
                    "command": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "description": 'The command and its arguments, e.g. ["HGETALL", "order:7"].',
                    },
                },
                ["service", "command"],
            ),
            "redis",
        ),
    )
}
# One list of tools and arguments: a tool or argument added here is named in names.py too.
if {n: tuple(s.schema["properties"]) for n, s in SPECS.items()} != dict(TOOL_ARGUMENTS):
    raise RuntimeError(f"tools.SPECS {tuple(SPECS)} differ from names.TOOL_ARGUMENTS {dict(TOOL_ARGUMENTS)}")


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

    ``compose``: exec and port of the trial's stack (``checks.Stack``); ``config``: its resolved compose
    config; ``services``: the services the tools may touch (default every one in ``config``)."""

    def __init__(
        self, compose: Stack, config: Mapping[str, Any], services: Collection[str] | None = None
    ) -> None:
        self._compose = compose
        all_services = ResolvedConfig.of(config).services
        names = sorted(all_services) if services is None else sorted(services)
        unknown = [s for s in names if s not in all_services]
        if unknown:
            raise ForgeError(
                f"the stack has no service {', '.join(map(repr, unknown))}; "
                f"services: {', '.join(sorted(all_services))}"
            )
        self._services: dict[str, ServiceConfig] = {n: all_services[n] for n in names}
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, int], tuple[str, int] | None] = {}
        self._pg: dict[tuple[str, str], _Pg] = {}
        self._redis: dict[str, Any] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "http_request": self._http_request,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "list_dir": self._list_dir,
            "exec": self._exec_tool,
            "sql_query": self._sql_query,
            "redis_command": self._redis_command,
        }

    @property
    def services(self) -> list[str]:
        return list(self._services)

    def call(self, tool: str, arguments: Any) -> str:
        """Carry out one call; its result text, or ``ToolFailure``."""
        args = validate(tool, arguments)
        result = self._handlers[tool](args)
        size = len(result.encode("utf-8", "surrogatepass"))
        if size > MAX_RESULT:
            raise ToolFailure(f"the result is {size} bytes; at most {MAX_RESULT} are returned: ask for less")
        return result

    def close(self) -> None:
        with self._lock:
            pgs, clients = list(self._pg.values()), list(self._redis.values())
            self._pg.clear()
            self._redis.clear()
        for pg in pgs:
            pg.close()
        for client in clients:
            client.close()

    # ------------------------------------------------------------------------------------ helpers

    def _service(self, args: Mapping[str, Any], kind: str | None = None) -> tuple[str, ServiceConfig]:
        name = str(args["service"])
        svc = self._services.get(name)
        if svc is None:
            raise ToolFailure(
                f"no service {name!r} in this trial's stack; services: {', '.join(self._services)}"
            )
        if kind is not None and svc.server_kind != kind:
            have = [n for n, s in self._services.items() if s.server_kind == kind]
            raise ToolFailure(
                f"service {name!r} is not a {kind} service; {kind} services: {', '.join(have) or '(none)'}"
            )
        return name, svc

    def _run(self, service: str, argv: Sequence[str], timeout: float, input: str | None = None) -> Result:
        try:
            return self._compose.exec(service, argv, timeout=timeout, check=False, input=input)
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
                self._ports[key] = self._compose.port(service, port)
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

    # ---------------------------------------------------------------------------------- databases

    def _sql_query(self, args: dict[str, Any]) -> str:
        service, svc = self._service(args, "postgres")
        user, database = sql_dump.postgres_credentials({"database": args.get("database")}, svc.environment)
        timeout = float(args.get("timeout", DEFAULT_TIMEOUT))
        where = self._published(service, sql_dump.direct_port(svc))
        if where is None:  # not published on loopback (no reset recipe binds it): psql in the container
            return self._psql(service, user, database, args["query"], timeout)
        with self._lock:
            pg = self._pg.get((service, database))
            if pg is None:
                password = svc.environment.get("POSTGRES_PASSWORD") or None
                pg = self._pg[(service, database)] = _Pg(where, user, password, database)
        return pg.query(args["query"], timeout, service)

    def _psql(self, service: str, user: str, database: str, query: str, timeout: float) -> str:
        argv = ["psql", "-X", "-q", "--csv", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", database, "-c", query]
        r = self._run(service, argv, timeout)
        if r.rc != 0:
            raise ToolFailure(_failed(r, f"SQL on service {service!r} failed"))
        lines = list(_csv_rows(r.stdout))
        columns, rows = (lines[0], lines[1:]) if lines else ([], [])
        return _json(
            {
                "columns": columns,
                "rows": rows[:ROW_LIMIT],
                "rowcount": len(rows),
                "status": None,
                "rows_truncated": len(rows) > ROW_LIMIT,
            }
        )

    def _redis_command(self, args: dict[str, Any]) -> str:
        service, svc = self._service(args, "redis")
        where = self._published(service, redis_dump.direct_port(svc))
        command = [str(c) for c in args["command"]]
        if where is None:  # redis-cli in the container; REDISCLI_AUTH keeps a password out of argv
            r = self._run(service, ["redis-cli", "--raw", *command], DEFAULT_TIMEOUT)
            if r.rc != 0 or r.stdout.startswith(("ERR ", "WRONGTYPE ", "NOAUTH ")):
                raise ToolFailure(_failed(r, f"redis {command[0]} on service {service!r} failed"))
            return _json({"reply": r.stdout.rstrip("\n")})
        with self._lock:
            client = self._redis.get(service)
            if client is None:
                password = redis_dump.command_option(svc, "requirepass")
                client = RedisParams(where[0], where[1], password).client()
                # Replies as redis sends them ("OK", not redis-py's True for SET): what redis-cli shows.
                client.response_callbacks.clear()
                self._redis[service] = client
        try:
            with self._lock:  # one connection (single_connection_client): one command on it at a time
                reply = client.execute_command(*command)
        except redis_lib.ResponseError as e:
            raise ToolFailure(f"redis {command[0]} on service {service!r}: {e}") from None
        except redis_lib.RedisError as e:
            raise ToolFailure(f"redis on service {service!r} (port {where[1]}) failed: {e}") from None
        return _json({"reply": _plain(reply)})


class _Pg:
    """One autocommit connection to a postgres service's published port, used by one call at a time;
    reconnected once when it broke (a server restart, a reset that dropped it)."""

    def __init__(self, where: tuple[str, int], user: str, password: str | None, database: str) -> None:
        self._kw: dict[str, Any] = {"host": where[0], "port": where[1], "user": user, "dbname": database}
        if password:
            self._kw["password"] = password
        self._lock = threading.Lock()
        self._conn: Any = None
        self._timeout_ms: int | None = None

    def query(self, query: str, timeout: float, service: str) -> str:
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._query(query, timeout)
                except psycopg.OperationalError as e:
                    broken = self._conn is None or self._conn.closed
                    self.close_locked()
                    if not broken or attempt == 2:
                        raise ToolFailure(f"SQL on service {service!r} failed: {_pg_message(e)}") from None
                except psycopg.Error as e:
                    raise ToolFailure(f"SQL on service {service!r} failed: {_pg_message(e)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _query(self, query: str, timeout: float) -> str:
        if self._conn is None:
            self._conn = psycopg.connect(**self._kw, autocommit=True, connect_timeout=10)
            self._timeout_ms = None
        ms = max(1, int(timeout * 1000))
        if ms != self._timeout_ms:  # SET only when it changes: one round trip fewer per call
            self._conn.execute(f"SET statement_timeout = {ms}")
            self._timeout_ms = ms
        cur = self._conn.execute(query)
        columns = [c.name for c in cur.description] if cur.description else []
        rows = cur.fetchmany(ROW_LIMIT + 1) if cur.description else []
        return _json(
            {
                "columns": columns,
                "rows": [list(r) for r in rows[:ROW_LIMIT]],
                "rowcount": cur.rowcount,
                "status": cur.statusmessage,
                "rows_truncated": len(rows) > ROW_LIMIT,
            }
        )

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


# ---------------------------------------------------------------------------------------- helpers


def _pg_message(e: BaseException) -> str:
    state = getattr(e, "sqlstate", None)
    text = str(e).strip() or type(e).__name__
    return f"{text} (SQLSTATE {state})" if state else text


def _failed(r: Result, what: str) -> str:
    return f"{what}: {tail(r.stderr or r.stdout, 5).strip() or f'exit status {r.rc}'}"


def _cut(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode("utf-8", "surrogatepass")
    return (text, False) if len(raw) <= limit else (raw[:limit].decode("utf-8", "ignore"), True)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _plain(reply: Any) -> Any:
    """A redis reply as JSON values: bytes decoded, nested lists and maps kept."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, list | tuple | set):
        return [_plain(x) for x in reply]
    if isinstance(reply, dict):
        return {str(_plain(k)): _plain(v) for k, v in reply.items()}
    return reply


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


def _csv_rows(text: str) -> list[list[str]]:
    import csv
    import io

    return [row for row in csv.reader(io.StringIO(text)) if row]
