"""The error hierarchy and the exit codes every forge command maps it to.

User-facing errors are ``ForgeError`` subclasses: their ``str()`` is the whole message a user sees, so it
names the file, the field and the fix. Anything else escaping a command is a bug (exit 3, with a log).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_USER = 1  # the user's input is wrong: spec error, failed check, failed trial
EXIT_USAGE = 2  # the command line itself is wrong
EXIT_UNEXPECTED = 3  # a bug in forgelib: the traceback is in the log file named on stderr
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM

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
