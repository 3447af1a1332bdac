"""The ``forge`` program: forge's own command line (``cliargs``: parse; ``clihelp``: help) over the same
Invoke namespace as ``tasks.py``, executed by Invoke's ``Executor``; its tasks map errors to exit codes
through ``guard.guarded``. A command line forge cannot take is a usage error (exit 2), in forge's words.
None of invoke's own program options exist here: forge reads no invoke configuration."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from invoke.collection import Collection
from invoke.config import Config
from invoke.exceptions import Exit
from invoke.executor import Executor

from forgelib import __version__
from forgelib.cli.args import parse
from forgelib.cli.exits import leave_cluster, silence_stdout, stdout_reader_gone
from forgelib.cli.help import command_help, command_list, program_help
from forgelib.errors import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, UsageError


def cluster_argument(argv: list[str]) -> str | None:
    """The ADDRESS of a ``forge run … --cluster ADDRESS`` command line (``--cluster=ADDRESS`` too), read
    before forge parses it; None for any other command line (``cliargs.parse`` stays the authority)."""
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
    imports its commands (CPU-bound) and loads the project, so ray.init's waits on the cluster (its
    round trips to the GCS and the raylet) overlap that work instead of following it. ``main_run`` takes
    the join over (``connect.Joining.started``); a command line it reads otherwise starts its own."""
    address = cluster_argument(argv)
    if address:
        from forgelib.cluster.connect import Joining

        Joining(address)


def run(argv: Sequence[str], ns: Collection) -> int:
    """``forge ARGV`` (without the program name): the exit code."""
    try:
        line = parse(argv, ns)
    except UsageError as e:
        print(f"forge: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if line.version:
        print(f"forge {__version__}")
    elif line.list:
        print(command_list(ns), end="")
    elif line.help and line.command:
        print(command_help(line.command, ns.tasks[line.command]), end="")
    elif line.help or line.command is None:
        print(program_help(ns), end="")
    else:
        try:
            # lazy: no invoke.yaml, no INVOKE_* file is forge's configuration
            Executor(ns, Config(lazy=True)).execute((line.command, line.kwargs))
        except Exit as e:
            if e.message:
                print(e.message, file=sys.stderr)
            return int(e.code)
    sys.stdout.flush()  # a closed pipe shows here, inside main's handler, not in the interpreter's exit
    return 0


def main() -> None:
    _join_early(sys.argv[1:])
    from forgelib.cli.tasks import ns

    try:
        code = run(sys.argv[1:], ns)
    except KeyboardInterrupt:  # before or after a command (inside one, guarded says it)
        print("forge: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # The reader went away (`forge --help | head -1`): not worth a traceback.
        silence_stdout()
        code = EXIT_PIPE
    # A process that joined a cluster early leaves like a joined one, whatever the command line was.
    leave_cluster(code)
    sys.exit(code)
