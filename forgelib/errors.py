"""The error hierarchy and the exit codes every forge command maps it to.

User-facing errors are ``ForgeError`` subclasses: their ``str()`` is the whole message a user sees, so it
names the file, the field and the fix. Anything else escaping a command is a bug (exit 3, with a log).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_USER = 1  # the user's input is wrong: spec error, failed check, failed trial
EXIT_USAGE = 2  # the command line itself is wrong
EXIT_UNEXPECTED = 3  # a bug in forgelib: the traceback is in the log file named on stderr
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM
# What a shell reports for `cat`, `yes`, grep… whose reader left (128 + SIGPIPE), so `set -o pipefail`
# treats forge like them; not 0, since the output was cut short, nor 1, which says the input was wrong.
EXIT_PIPE = 141  # stdout was closed by its reader (`forge validate --json | head -1`): forge stops quietly

TAIL_LINES = 20  # lines of stdout/stderr an error carries; full output belongs in logs, not messages


class ForgeError(Exception):
    """A failure the user can act on. ``str(err)`` is the message; ``exit_code`` what the CLI returns."""

    exit_code = EXIT_USER


class UsageError(ForgeError):
    """The command line is wrong (conflicting or missing options)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec file, located precisely enough to jump to it."""

    file: str
    line: int | None
    col: int | None
    json_path: str  # "$.assets.seeds.x.digest"
    message: str
    # "error" fails validation; "warning" (risky, allowed) and "note" (what forge changes) are reported only.
    severity: str = "error"

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        tag = "" if self.severity == "error" else f"{self.severity}: "
        return f"{where}: {self.json_path}: {tag}{self.message}"


class SpecError(ForgeError):
    """One or more problems in the project's spec files; ``issues`` lists every one of them."""

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        self.issues = tuple(issues)
        n = len(self.issues)
        head = f"{n} problem{'s' if n != 1 else ''} in the spec:"
        super().__init__("\n".join([head, *(f"  {i}" for i in self.issues)]))


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text`` (errors carry a tail, never megabytes of output)."""
    parts = text.rstrip("\n").splitlines()
    if len(parts) <= lines:
        return "\n".join(parts)
    return "\n".join([f"[... {len(parts) - lines} earlier lines cut ...]", *parts[-lines:]])


class ProgramNotFound(ForgeError):
    def __init__(self, program: str, hint: str = "") -> None:
        self.program = program
        msg = f"{program!r} was not found on PATH"
        super().__init__(f"{msg}; {hint}" if hint else msg)


class CommandError(ForgeError):
    """An external command failed. Carries argv, rc and the tails of its output (secrets redacted)."""

    def __init__(
        self,
        argv: Sequence[str],
        rc: int | None,
        stdout: str = "",
        stderr: str = "",
        *,
        reason: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.rc = rc
        self.stdout_tail = tail(stdout)
        self.stderr_tail = tail(stderr)
        self.reason = reason or f"exited with rc={rc}"
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [f"command {' '.join(self.argv)!s} {self.reason}"]
        if self.stderr_tail:
            lines.append("stderr (tail):")
            lines.extend(f"  {ln}" for ln in self.stderr_tail.splitlines())
        if self.stdout_tail:
            lines.append("stdout (tail):")
            lines.extend(f"  {ln}" for ln in self.stdout_tail.splitlines())
        return "\n".join(lines)


# The lines that say why a tool failed (psql/postgres "ERROR:", "FATAL:", a redis "ERR ..."), and the lines
# psql prints right after one to locate it.
_CAUSE = re.compile(r"\b(?:ERROR|FATAL|PANIC):|^\(error\) |^ERR ", re.MULTILINE)
_CONTEXT = ("LINE ", "DETAIL:", "HINT:", "CONTEXT:", "QUERY:", "^")


def cause_of(stderr: str, stdout: str = "") -> str:
    """The sentence that says why a command failed: its first ``ERROR:``/``FATAL:`` line with the lines
    locating it, else its last stderr line (stdout only when stderr is empty: a pg_dump preamble's
    ``set_config`` rows explain nothing)."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("[... ")]
    for i, line in enumerate(lines):
        if _CAUSE.search(line):
            ctx = []
            for nxt in lines[i + 1 :]:
                if not nxt.strip().startswith(_CONTEXT):
                    break
                ctx.append(" ".join(nxt.split()))
            return " ".join([line.strip(), *ctx])
    if lines:
        return lines[-1].strip()
    out = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    return out[-1] if out else "(no output)"


class ServiceCommandError(CommandError):
    """A command exec'd in a service failed. Its message leads with the cause, then the short command
    (`` `psql` in service `app-db`, rc 3``); the full argv and output tails stay on the object (and in the
    debug log), out of the reason a user reads."""

    def __init__(self, failed: CommandError, program: str, service: str) -> None:
        self.what = f"`{program}` in service `{service}`"
        self.cause = cause_of(failed.stderr_tail, failed.stdout_tail)
        self.full = str(failed)
        super().__init__(failed.argv, failed.rc, failed.stdout_tail, failed.stderr_tail, reason=failed.reason)

    def _render(self) -> str:
        return f"{self.cause} ({self.what}, rc {self.rc})"


class CommandTimeout(CommandError):
    def __init__(self, argv: Sequence[str], timeout: float, stdout: str = "", stderr: str = "") -> None:
        self.timeout = timeout
        super().__init__(argv, None, stdout, stderr, reason=f"timed out after {timeout:g}s (killed)")


class RecipeError(ForgeError):
    """A seed recipe failed; the message names the service and carries the command's diagnostics."""


class ProvisionError(ForgeError):
    """Provisioning a trial failed at ``stage`` (``reset_recipe``, ``compose_up``, ``readiness``, ...).

    By the time it propagates, service logs were captured and the stack was torn down.
    """

    def __init__(self, stage: str, reason: str) -> None:
        self.stage = stage
        self.reason = reason
        super().__init__(f"provisioning failed at {stage}: {reason}")


class Interrupted(ForgeError):
    """SIGINT/SIGTERM arrived; whatever was live has been torn down."""

    exit_code = EXIT_INTERRUPTED
