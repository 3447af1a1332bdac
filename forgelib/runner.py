"""The one seam every external command goes through.

argv lists only (never a shell string), a timeout on every call, stdin streamed from a file (a 1 GB dump
is never read into memory), the child in its own process group so a timeout or Ctrl-C kills it and its
children, and failures raised as ``CommandError`` with argv, rc and output tails, secrets redacted.

Built on ``subprocess`` rather than ``sh``: the seam needs a process group it can kill, stdout redirected
to a file for large outputs (service logs), and bounded error text — all direct in ``subprocess``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from forgelib.errors import CommandError, CommandTimeout, ProgramNotFound

log = logging.getLogger("forgelib.runner")

DEFAULT_TIMEOUT = 60.0
REDACTED = "***"
_INSTALL_HINTS = {
    "docker": "run `forge engine` (or scripts/engine.sh) to install and start Docker",
}


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    seconds: float


class Runner(Protocol):
    """What code that shells out depends on: ``SubprocessRunner``, or ``testing.FakeRunner`` in tests."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin: Path | None = None,
        input: str | None = None,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        check: bool = True,
        stdout_path: Path | None = None,
        secrets: Iterable[str] = (),
    ) -> Result: ...


def redact(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text


def merged_env(overlay: Mapping[str, str | None] | None) -> dict[str, str]:
    """os.environ with ``overlay`` applied; a ``None`` value removes the variable."""
    env = dict(os.environ)
    for k, v in (overlay or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@dataclass
class SubprocessRunner:
    default_timeout: float = DEFAULT_TIMEOUT
    secrets: set[str] = field(default_factory=set)  # redacted from every error and log line

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin: Path | None = None,
        input: str | None = None,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        check: bool = True,
        stdout_path: Path | None = None,
        secrets: Iterable[str] = (),
    ) -> Result:
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise ValueError("empty argv")
        if stdin is not None and input is not None:
            raise ValueError("pass stdin or input, not both")
        hidden = self.secrets | set(secrets)
        shown = tuple(redact(a, hidden) for a in argv)
        if shutil.which(argv[0], path=merged_env(env).get("PATH")) is None:
            raise ProgramNotFound(argv[0], _INSTALL_HINTS.get(argv[0], ""))
        limit = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        log.debug("run %s (timeout %gs)", " ".join(shown), limit)
        with _open_or_none(stdin, "rb") as in_f, _open_or_none(stdout_path, "wb") as out_f:
            stdin_arg: int | IO[bytes] = subprocess.DEVNULL
            if in_f is not None:
                stdin_arg = in_f
            elif input is not None:
                stdin_arg = subprocess.PIPE
            proc = subprocess.Popen(  # noqa: S603 - the one seam; ruff's S603 flags any other
                argv,
                stdin=stdin_arg,
                stdout=out_f if out_f is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=merged_env(env),
                cwd=cwd,
                start_new_session=True,  # our own process group: Ctrl-C reaches us, and we decide
            )
            try:
                out_b, err_b = proc.communicate(
                    input=input.encode() if input is not None else None, timeout=limit
                )
            except subprocess.TimeoutExpired:
                partial_out, partial_err = _kill(proc)
                raise CommandTimeout(
                    shown, limit, redact(_text(partial_out), hidden), redact(_text(partial_err), hidden)
                ) from None
            except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: never orphan a child
                _kill(proc)
                raise
        seconds = time.monotonic() - start
        result = Result(shown, proc.returncode, _text(out_b), _text(err_b), seconds)
        log.debug("rc=%s in %.2fs: %s", proc.returncode, seconds, " ".join(shown))
        if check and proc.returncode != 0:
            raise CommandError(
                shown, proc.returncode, redact(result.stdout, hidden), redact(result.stderr, hidden)
            )
        return result


def _text(b: bytes | None) -> str:
    return (b or b"").decode("utf-8", errors="replace")


def _kill(proc: subprocess.Popen[bytes]) -> tuple[bytes | None, bytes | None]:
    """Kill the child's whole process group and collect what it printed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a zombie that ignores SIGKILL's pipe close
        return None, None


def _open_or_none(path: Path | None, mode: str) -> contextlib.AbstractContextManager[IO[bytes] | None]:
    if path is None:
        return contextlib.nullcontext()
    return open(path, mode)  # the caller's with-statement closes it
