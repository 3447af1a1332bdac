"""What ``forge --help``, ``forge COMMAND --help`` and ``forge --list`` print: forge's commands and
options only, from the same ``cliargs.options`` the parser uses (so help cannot offer what the parser
refuses)."""

from __future__ import annotations

import inspect
import shutil
import textwrap
from typing import Any

from invoke.collection import Collection
from invoke.tasks import Task

from forgelib.cli.args import LIST_FLAG, Option, options
from forgelib.errors import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_USER

PROGRAM_OPTIONS = (
    ("-h, --help [COMMAND]", "show this help, or a command's"),
    ("-V, --version", "print forge's version"),
    (LIST_FLAG, "print the commands, one a line"),
)


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


def _rows(rows: list[tuple[str, str]], indent: int = 2) -> list[str]:
    """Two columns; the second wrapped under itself."""
    left = min(34, max((len(a) for a, _ in rows), default=0) + 2)
    lines = []
    for a, b in rows:
        wrapped = textwrap.wrap(b, _width() - indent - left) or [""]
        if len(a) + 2 > left:
            lines.append(" " * indent + a)
            lines += [" " * (indent + left) + w for w in wrapped]
            continue
        lines.append(" " * indent + a.ljust(left) + wrapped[0])
        lines += [" " * (indent + left) + w for w in wrapped[1:]]
    return lines


def summary(task: Task[Any]) -> str:
    """The first line of a command's docstring."""
    return inspect.cleandoc(task.__doc__ or "").split("\n", 1)[0]


def usage(name: str, opts: list[Option]) -> str:
    mains = [o for o in opts if o.main]
    words = [o.metavar if o.required or not o.default else f"[{o.metavar}]" for o in mains]
    rest = " [OPTIONS]" if any(not o.main for o in opts) else ""
    return " ".join(["forge", name, *words]) + rest


def program_help(ns: Collection) -> str:
    lines = [
        "Usage: forge COMMAND [ARGUMENTS] [OPTIONS]",
        "",
        "forge: reproducible trials on per-trial docker compose stacks, with digest-pinned seeds.",
        "Start with `forge init myproject`.",
        "",
        "Commands:",
        *_rows([(name, summary(ns.tasks[name])) for name in ns.tasks]),
        "",
        "Options:",
        *_rows(list(PROGRAM_OPTIONS)),
        "",
        "`forge COMMAND --help` shows a command's arguments and options.",
        *textwrap.wrap(
            f"Exit codes: 0 ok, {EXIT_USER} failed or bad input, {EXIT_USAGE} bad command line, "
            f"{EXIT_UNEXPECTED} a bug in forgelib, {EXIT_INTERRUPTED} interrupted, {EXIT_PIPE} output "
            "closed by its reader.",
            _width(),
        ),
    ]
    return "\n".join(lines) + "\n"


def _flag(o: Option) -> str:
    value = "" if o.kind == "flag" else f" {o.kind}"
    return f"{o.short}, {o.long}{value}" if o.short else f"    {o.long}{value}"


def _default(o: Option) -> str:
    if o.kind == "flag" or o.default in (None, "", [], ()):
        return ""
    return f" (default: {o.default})"


def command_help(name: str, task: Task[Any]) -> str:
    opts = options(task)
    lines = [f"Usage: {usage(name, opts)}", "", inspect.cleandoc(task.__doc__ or ""), ""]
    mains = [o for o in opts if o.main]
    if mains:
        lines.append("Arguments:")
        lines += _rows([(o.metavar, f"{o.help}{_default(o)}; or {o.long} {o.metavar}") for o in mains])
        lines.append("")
    rows = [(_flag(o), o.help + _default(o)) for o in opts if not o.main]
    lines.append("Options:")
    lines += _rows([*rows, ("-h, --help", "show this help")])
    return "\n".join(lines) + "\n"


def command_list(ns: Collection) -> str:
    return "\n".join(_rows([(name, summary(ns.tasks[name])) for name in ns.tasks])) + "\n"


__all__ = ["command_help", "command_list", "program_help", "summary", "usage"]
