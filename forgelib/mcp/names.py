"""The tools a task may offer (``task.yaml``'s ``tools:``): each one's name, description and argument
schema (``SPECS``: the generic tools here, a kind's from its ``Kind``), and the default set. The one list
of tools: the task and grading schemas' enums are generated from it (``forgelib.docsgen``), and trace.jsonl
records each call's arguments by these names. No SDK import, so the spec loader can name them (and check a
trace check's ``tool`` and argument names) without loading the ``mcp`` package."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from forgelib.kinds import KINDS
from forgelib.kinds import toolschema as ts
from forgelib.kinds.kind import ToolSpec

BODY_LIMIT = 1 << 20  # bytes an agent may send: an HTTP request body, a file's new content
FILE_LIMIT = 1 << 20  # bytes read_file returns; a larger file is an error that says so
OUTPUT_LIMIT = 256 * 1024  # bytes kept of an HTTP response body and of each of exec's stdout and stderr


def _path(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": f"Absolute path of the {what} in the container."}


_GENERIC: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "http_request",
            "Send one HTTP request to a service of the stack, on a port the service publishes, and return "
            'JSON {"status", "headers", "body", "body_truncated"}. Redirects are not followed. The request '
            f"body is at most {BODY_LIMIT} bytes; the first {OUTPUT_LIMIT} bytes of the response body are "
            "returned. A 4xx/5xx status is a normal result, not an error.",
            ts.obj(
                {
                    "service": ts.service("to send the request to"),
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
        ),
        ToolSpec(
            "read_file",
            f"Return the text of a file in a service's container (at most {FILE_LIMIT} bytes; a larger "
            "file is an error).",
            ts.obj(
                {"service": ts.service("whose container holds the file"), "path": _path("file")},
                ["service", "path"],
            ),
        ),
        ToolSpec(
            "write_file",
            "Create or replace a file in a service's container with the given text (at most "
            f"{BODY_LIMIT} bytes). The directory must exist.",
            ts.obj(
                {
                    "service": ts.service("whose container gets the file"),
                    "path": _path("file"),
                    "content": {"type": "string", "description": "The file's whole new content."},
                },
                ["service", "path", "content"],
            ),
        ),
        ToolSpec(
            "list_dir",
            "List a directory in a service's container: one entry per line, directories ending in '/', "
            "hidden entries included.",
            ts.obj(
                {"service": ts.service("whose container holds the directory"), "path": _path("directory")},
                ["service", "path"],
            ),
        ),
        ToolSpec(
            "exec",
            "Run a program (an argv list, no shell unless you run one) in a service's container and return "
            'JSON {"exit_code", "stdout", "stderr"}; a nonzero exit code is a result, not an error. '
            f"Output beyond {OUTPUT_LIMIT} bytes per stream is cut.",
            ts.obj(
                {
                    "service": ts.service("to run the program in"),
                    "argv": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "description": 'Program and arguments, e.g. ["ls", "-l", "/srv"].',
                    },
                    "timeout": ts.TIMEOUT,
                },
                ["service", "argv"],
            ),
        ),
    )
}

SPECS: Mapping[str, ToolSpec] = MappingProxyType(
    {**_GENERIC, **{spec.name: spec for kind in KINDS for spec in kind.tools}}
)
TOOL_ARGUMENTS: Mapping[str, tuple[str, ...]] = MappingProxyType({n: s.arguments for n, s in SPECS.items()})
ALL_TOOLS: tuple[str, ...] = tuple(SPECS)

# Everything but `exec`: the other tools each do one named thing an evaluation can grade from its trace
# (a read, a write, a query); `exec` runs any program as the service's user, so a task offers it on purpose.
DEFAULT_TOOLS: tuple[str, ...] = tuple(t for t in ALL_TOOLS if t != "exec")
