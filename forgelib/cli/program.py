"""The ``forge`` program: the same Invoke namespace as ``tasks.py`` (whose tasks map errors to exit codes
through ``guard.guarded``), with usage errors (exit 2) for command lines invoke cannot parse."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from forgelib import __version__
from forgelib.cli.exits import leave_cluster
from forgelib.errors import EXIT_USAGE, EXIT_USER


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
    from forgelib.cli.tasks import ns

    try:
        ForgeProgram(namespace=ns, name="forge", binary="forge", version=__version__).run()
    except SystemExit as e:  # a usage error after an early join: that process leaves like a joined one
        leave_cluster(e.code if isinstance(e.code, int) else EXIT_USER if e.code else 0)
        raise
    except BrokenPipeError:
        # The reader went away (`forge --help | head`): not worth a traceback. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_USER)
