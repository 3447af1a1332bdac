"""forge's command line over the Invoke namespace: what each command takes (``Command``, the Invoke task
class ``forgelib/cli/tasks.py`` declares them with), and the parse of ``forge …`` into a command and its
arguments, with every complaint in forge's words (exit 2) and a "did you mean" where one is close.

Invoke stays the engine: the tasks, their ``Argument`` lists and their execution are Invoke's, and
``invoke X`` in a checkout parses with Invoke's own parser. forge adds, for its program only: the main
argument as a positional (``forge validate DIR``), numbers checked while parsing, and one meaning per
short flag across every command (``SHORT_FLAGS``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from invoke.collection import Collection
from invoke.parser.argument import Argument
from invoke.tasks import Task

from forgelib.cli.exits import Number
from forgelib.errors import UsageError

# Every short flag forge has, and the one option it stands for in every command that has that option.
# An option not listed has no short form: rarer or destructive ones (`--all`, `--cluster`) are typed out.
SHORT_FLAGS: Mapping[str, str] = {
    "agent": "a",
    "config": "c",
    "dry_run": "d",
    "resume": "e",
    "force": "f",
    "json": "j",
    "keep": "k",
    "memory_budget_mb": "m",
    "name": "n",
    "output": "o",
    "project": "p",
    "repeats": "r",
    "stacks": "s",
    "task": "t",
    "workers": "w",
}
# Program-level flags; no command option may take them.
HELP_FLAGS = ("-h", "--help")
VERSION_FLAGS = ("-V", "--version")
LIST_FLAG = "--list"


class Command(Task[Callable[..., None]]):
    """An Invoke task with what forge's program knows of it: ``main`` (the argument, or arguments in order,
    ``forge NAME VALUE`` takes positionally; each one's ``--flag`` works too) and ``numbers`` (option -> int
    or float: checked while parsing, shown as INT / NUMBER). Short flags come from ``SHORT_FLAGS`` only,
    for ``invoke`` too."""

    def __init__(
        self,
        body: Callable[..., Any],
        *,
        main: str | tuple[str, ...] | None = None,
        numbers: Mapping[str, type[int] | type[float]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(body, auto_shortflags=False, **kwargs)
        self.main = main
        self.numbers = dict(numbers or {})
        self._all_help = dict(self.help)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        self.help = dict(self._all_help)  # Invoke's own pops each entry it uses: a second call had none
        args: list[Argument] = super().get_arguments(ignore_unknown_help)
        for a in args:
            short = SHORT_FLAGS.get(a.attr_name or a.names[0])
            if short:
                a.names = (*a.names, short)
        return args


@dataclass(frozen=True)
class Option:
    """One argument of a command as forge shows and parses it."""

    param: str  # the task's parameter: "memory_budget_mb"
    long: str  # "--memory-budget-mb"
    short: str | None  # "-m"
    kind: str  # "flag" | "TEXT" | "INT" | "NUMBER"
    help: str
    default: Any
    main: bool = False  # taken positionally (its --flag works too)
    required: bool = False  # the parameter has no default
    repeatable: bool = False

    @property
    def metavar(self) -> str:
        """The positional's name in a usage line: ``RUN_DIR``."""
        return self.param.upper()

    def convert(self, text: str) -> None:
        """Check a numeric option's value now: the same message the command itself would give."""
        if self.kind == "INT":
            Number(self.long, text, int).value()
        elif self.kind == "NUMBER":
            Number(self.long, text, float).value()


def options(task: Task[Any]) -> list[Option]:
    """The command's arguments in forge's terms, the main one first."""
    main = getattr(task, "main", None)
    mains: tuple[str, ...] = (main,) if isinstance(main, str) else tuple(main or ())
    numbers: Mapping[str, type] = getattr(task, "numbers", {})
    params = inspect.signature(task.body).parameters
    out = []
    for a in task.get_arguments():
        param = a.attr_name or a.names[0]
        number = numbers.get(param)
        kind = "flag" if a.kind is bool else "INT" if number is int else "NUMBER" if number else "TEXT"
        out.append(
            Option(
                param=param,
                long=f"--{a.names[0]}",
                short=f"-{a.nicknames[0]}" if a.nicknames else None,
                kind=kind,
                help=a.help or "",
                default=a.default,
                main=param in mains or a.positional,
                required=params[param].default is inspect.Parameter.empty,
                repeatable=a.kind is list,
            )
        )
    # the positionals in the order the command names them, then the options
    return sorted(out, key=lambda o: (not o.main, mains.index(o.param) if o.param in mains else 0))


@dataclass
class CommandLine:
    """What ``forge ARGV`` asks for."""

    command: str | None = None  # None: no command (``forge``, ``forge --help``, ``forge --version``)
    kwargs: dict[str, Any] = field(default_factory=dict)  # the task's keyword arguments, as text
    help: bool = False
    version: bool = False
    list: bool = False


def parse(argv: Sequence[str], ns: Collection) -> CommandLine:
    """``forge ARGV`` (without the program name) against the namespace; a ``UsageError`` says what is
    wrong in forge's words."""
    line = CommandLine()
    words = list(argv)
    while words and words[0].startswith("-") and words[0] != "-":
        flag, eq, value = words.pop(0).partition("=")
        if flag in HELP_FLAGS:
            line.help = True
            if eq:  # --help=COMMAND
                words.insert(0, value)
        elif flag in VERSION_FLAGS and not eq:
            line.version = True
        elif flag == LIST_FLAG and not eq:
            line.list = True
        else:
            raise UsageError(_unknown_program_option(flag, ns))
    if words[:1] == ["help"] and "help" not in ns.tasks:  # `forge help [COMMAND]`, as git and pip take it
        line.help = True
        words.pop(0)
    if not words:
        return line
    line.command = _command(words.pop(0), ns)
    task = ns.tasks[line.command]
    before_dashes = words[: words.index("--")] if "--" in words else words
    if any(w in HELP_FLAGS for w in before_dashes):
        line.help = True
    if not line.help:
        line.kwargs = _arguments(line.command, options(task), words, ns)
    return line


def _arguments(command: str, opts: list[Option], words: list[str], ns: Collection) -> dict[str, Any]:
    by_flag = {o.long: o for o in opts} | {o.short: o for o in opts if o.short}
    values: dict[str, Any] = {}
    positional: list[str] = []
    only_positional = False

    def store(opt: Option, value: str | bool, given_as: str) -> None:
        if opt.repeatable:
            values.setdefault(opt.param, []).append(value)
            return
        if opt.param in values:
            raise UsageError(f"{given_as} is given twice (forge {command} takes one)")
        if isinstance(value, str):
            opt.convert(value)
        values[opt.param] = value

    while words:
        word = words.pop(0)
        if only_positional or not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        if word == "--":
            only_positional = True
            continue
        if word.startswith("--"):
            flag, eq, attached = word.partition("=")
            value: str | None = attached if eq else None
        else:  # -j, -o DIR, -oDIR, -jk
            flag, rest = word[:2], word[2:]
            opt = by_flag.get(flag)
            if rest and opt is not None and opt.kind == "flag":
                words.insert(0, "-" + rest)  # more short flags: -jk is -j -k
                rest = ""
            value = rest or None
        opt = by_flag.get(flag)
        if opt is None:
            raise UsageError(_unknown_option(command, flag, opts, ns))
        if opt.kind == "flag":
            if value is not None:
                raise UsageError(f"{flag} takes no value (forge {command} {opt.long})")
            store(opt, True, flag)
            continue
        if value is None:
            if not words or (words[0].startswith("-") and not _number_like(words[0], opt)):
                what = f": {opt.help}" if opt.help else ""
                raise UsageError(f"{flag} needs a value{what}")
            value = words.pop(0)
        store(opt, value, flag)

    mains = [o for o in opts if o.main]
    for i, word in enumerate(positional):
        if i >= len(mains):
            if mains:
                takes = " ".join(o.metavar for o in mains)
                raise UsageError(f"forge {command} takes {takes} only, but was also given {word!r}")
            guess = _close(word, [o.long[2:] for o in opts])
            hint = f"; did you mean --{guess}?" if guess else ""
            raise UsageError(f"forge {command} takes no arguments, but was given {word!r}{hint}")
        opt = mains[i]
        if opt.param in values:
            raise UsageError(f"{opt.metavar} is given twice: as {word!r} and as {opt.long}; give it once")
        store(opt, word, opt.metavar)
    for o in opts:
        if o.required and o.param not in values:
            what = f" ({o.help})" if o.help else ""
            raise UsageError(f"forge {command} needs {o.metavar}{what}: forge {command} {o.metavar}")
    return values


def _number_like(word: str, opt: Option) -> bool:
    """``--retries -1``: a negative number is a value (its own check then says what is allowed)."""
    return opt.kind in ("INT", "NUMBER") and word[1:].replace(".", "", 1).isdigit()


def _close(word: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _command(name: str, ns: Collection) -> str:
    if name in ns.tasks:
        return name
    guess = _close(name, ns.tasks)
    hint = f"; did you mean '{guess}'?" if guess else ""
    raise UsageError(f"no command '{name}'{hint} (`forge --help` lists the commands)")


def _unknown_option(command: str, flag: str, opts: list[Option], ns: Collection) -> str:
    names = [o.long for o in opts] + list(HELP_FLAGS[1:])
    guess = _close(flag, names)
    msg = f"forge {command} has no option {flag}"
    if guess:
        return f"{msg}; did you mean {guess}?"
    elsewhere = _commands_with(flag, ns)
    if elsewhere:
        return f"{msg} ({flag} is an option of forge {' and forge '.join(elsewhere)})"
    return f"{msg} (`forge {command} --help` lists its options)"


def _unknown_program_option(flag: str, ns: Collection) -> str:
    msg = f"forge has no option {flag} before a command (its own: --help, --version, --list)"
    elsewhere = _commands_with(flag, ns)
    if elsewhere:
        return f"{msg}; {flag} is an option of forge {' and forge '.join(elsewhere)}, given after it"
    guess = _close(flag, [*HELP_FLAGS[1:], *VERSION_FLAGS[1:], LIST_FLAG])
    return f"{msg}; did you mean {guess}?" if guess else msg


def _commands_with(flag: str, ns: Collection) -> list[str]:
    return [name for name in ns.tasks if any(flag in (o.long, o.short) for o in options(ns.tasks[name]))]


__all__ = ["SHORT_FLAGS", "Command", "CommandLine", "Option", "options", "parse"]
