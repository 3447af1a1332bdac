"""The ``forge`` program: the same Invoke namespace as ``tasks.py``, and the one place errors become exit
codes (0 ok, 1 user error, 2 usage, 130 interrupted, 3 unexpected — with the log's path)."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from forgelib import __version__
from forgelib.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_USER, ForgeError, UsageError

log = logging.getLogger("forgelib")
LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"  # benchmarks/harness.py reads it


def log_path() -> Path:
    """The debug log every command appends to (every external command, every traceback)."""
    if env := os.environ.get("FORGE_LOG"):
        return Path(env)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "forgelib" / "forge.log"


def _setup_logging() -> Path:
    path = log_path()
    root = logging.getLogger("forgelib")
    for h in list(root.handlers):  # one forge handler, on the path asked for now (FORGE_LOG may change)
        if getattr(h, "_forge", False) and Path(getattr(h, "baseFilename", "")) != path.absolute():
            root.removeHandler(h)
            h.close()
    if not any(getattr(h, "_forge", False) for h in root.handlers):
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler._forge = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
    return path


@dataclass(frozen=True)
class Number:
    """A numeric option as typed (``""``: left out). Converted inside ``guarded``, so ``forge`` and
    ``invoke`` (whose own parser would raise a traceback on ``--repeats x``) say the same usage error."""

    option: str  # "--repeats"
    text: str
    kind: type[int] | type[float] = int

    def value(self) -> int | float | None:
        if self.text == "":
            return None
        try:
            return self.kind(self.text)
        except ValueError:
            what = "a whole number" if self.kind is int else "a number"
            raise UsageError(f"{self.option} takes {what}, not {self.text!r}") from None


def guarded(command: Callable[..., int | None], **kwargs: Any) -> None:
    """Call a command body and map what it returns or raises to an exit code (``Number`` options are
    converted first, as part of the command)."""
    try:
        _guarded(command, **kwargs)
    except Exit as e:  # (_guarded raises them without a message)
        _leave_cluster(e.code)
        raise
    _leave_cluster(0)


def _leave_cluster(code: int) -> None:
    """A process that joined a Ray cluster (``run --cluster``) exits here, without Ray's slow and crash-prone
    exit hooks (why that is safe: ``forgelib.cluster.connect.leave``); any other process returns."""
    connect = sys.modules.get("forgelib.cluster.connect")  # imported only under --cluster
    if connect is not None:
        connect.leave(code)


def _guarded(command: Callable[..., int | None], **kwargs: Any) -> None:
    path = _setup_logging()
    log.debug("command %s.%s %r", command.__module__, command.__qualname__, kwargs)
    try:
        args = {k: v.value() if isinstance(v, Number) else v for k, v in kwargs.items()}
        rc = command(**args)
    except ForgeError as e:
        log.debug("user error (exit %d): %s", e.exit_code, e)
        print(f"forge: error: {e}", file=sys.stderr)
        raise Exit(code=e.exit_code) from None
    except KeyboardInterrupt:
        log.debug("interrupted")
        print("forge: interrupted", file=sys.stderr)
        raise Exit(code=EXIT_INTERRUPTED) from None
    except Exit:
        raise
    except Exception as e:  # noqa: BLE001 - any other exception is a bug: log it, exit 3
        log.error("unexpected error\n%s", traceback.format_exc())
        print(
            f"forge: unexpected error (a bug in forgelib): {type(e).__name__}: {e}\n"
            f"forge: the full traceback is in {path}",
            file=sys.stderr,
        )
        raise Exit(code=EXIT_UNEXPECTED) from None
    if rc:
        raise Exit(code=rc)


@contextmanager
def _usage_errors() -> Iterator[None]:
    """A command line invoke cannot parse is a usage error: exit 2 with the reason, never 1 or 0."""
    try:
        yield
    except (ParseError, ValueError) as e:  # ValueError: invoke's cast of e.g. `--repeats x` to int
        print(f"forge: usage error: {e} (see `forge --help` and `forge --help TASK`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _help_first(argv: Any) -> Any:
    """``forge TASK --help`` as ``forge --help TASK``: a task's positional argument (``forge report
    RUN_DIR``) would otherwise take ``--help`` as its value."""
    if (
        isinstance(argv, list)
        and len(argv) >= 3
        and argv[2] in ("-h", "--help")
        and not argv[1].startswith("-")
    ):
        return [argv[0], argv[2], argv[1], *argv[3:]]
    return argv


def cluster_argument(argv: list[str]) -> str | None:
    """The ADDRESS of a ``forge run … --cluster ADDRESS`` command line (``--cluster=ADDRESS`` too), read
    before invoke parses it; None for any other command line (invoke's parse stays the authority)."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] != "run":
        return None
    for i, arg in enumerate(argv):
        if arg == "--cluster" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
        if arg.startswith("--cluster="):
            return arg.partition("=")[2] or None
    return None


def _join_early(argv: list[str]) -> None:
    """``forge run --cluster ADDRESS``: Ray's import and the join start on their thread now, before forge
    imports its commands (≈ 0.5 s of CPU) and loads the project, so ray.init's waits on the cluster (its
    round trips to the GCS and the raylet) overlap that work instead of following it. ``main_run`` takes
    the join over (``connect.Joining.started``); a command line it reads otherwise starts its own."""
    address = cluster_argument(argv)
    if address:
        from forgelib.cluster.connect import Joining

        Joining(address)


class ForgeProgram(Program):
    """Invoke's Program with forge's exit codes: every parse stage maps its errors to a usage error (2),
    and a command's ``Exit`` keeps its code."""

    def parse_core(self, argv: Any) -> None:
        with _usage_errors():
            super().parse_core(argv)

    def normalize_argv(self, argv: Any) -> None:
        super().normalize_argv(argv)
        self.argv = _help_first(self.argv)

    def parse_tasks(self) -> None:
        with _usage_errors():
            super().parse_tasks()

    def parse_cleanup(self) -> None:  # `forge --help NOSUCHTASK` fails here
        with _usage_errors():
            super().parse_cleanup()

    def execute(self) -> None:
        try:
            super().execute()
        except Exit as e:
            if e.message:
                print(e.message, file=sys.stderr)
            sys.exit(e.code)


def main() -> None:
    _join_early(sys.argv[1:])
    from forgelib.tasks import ns

    try:
        ForgeProgram(namespace=ns, name="forge", binary="forge", version=__version__).run()
    except SystemExit as e:  # a usage error after an early join: that process leaves like a joined one
        _leave_cluster(e.code if isinstance(e.code, int) else EXIT_USER if e.code else 0)
        raise
    except BrokenPipeError:
        # The reader went away (`forge --help | head`): not worth a traceback. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_USER)
