"""The one seam every external command goes through.

argv lists only (never a shell string), a timeout on every call, stdin streamed from a file (a 1 GB dump
is never read into memory), the child in its own process group so a timeout or Ctrl-C kills it and its
children, and failures raised as ``CommandError`` with argv, rc and output tails, secrets redacted.

Every child is tracked while it runs, tagged by the caller (``ComposeProject`` tags each call with its verb:
``up``, ``exec``, ``down``...), so a stop can kill exactly the in-flight launches (``kill_tagged``) without
guessing from /proc what they are.

A few frequent ``docker`` argvs (inspect, ps, start, port...) are answered by the local engine's API
instead of a child (``engineapi``; ``FORGE_ENGINE_API=0`` turns that off): the same ``Result``, log lines,
``CommandTimeout`` and stop semantics as the CLI's, at a fraction of a CLI start's CPU.

Built on ``subprocess`` rather than ``sh``: the seam needs a process group it can kill, stdout redirected
to a file for large outputs (service logs), and bounded error text — all direct in ``subprocess``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypedDict, Unpack

from forgelib import engineapi
from forgelib.errors import CommandError, CommandTimeout, ProgramNotFound, tail

log = logging.getLogger("forgelib.runner")

DEFAULT_TIMEOUT = 60.0
REDACTED = "***"
FILE_TAIL = 64 * 1024  # bytes of a streamed output (stdout_path, stderr_path) a caller keeps in memory
_INSTALL_HINTS = {
    "docker": "run `forge engine` (or scripts/engine.sh) to install and start Docker",
}
# Environment variable names whose values must never reach a log line or an error message.
_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|_KEY$|^KEY$|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    seconds: float


class RunOptions(TypedDict, total=False):
    """The keywords of ``Runner.run`` (``SubprocessRunner.run`` documents each): written once, here, for every
    runner that only passes them on (the stop guard, the fake)."""

    timeout: float | None
    stdin: Path | None
    input: str | None
    env: Mapping[str, str | None] | None
    cwd: Path | None
    check: bool
    stdout_path: Path | None
    stderr_path: Path | None
    secrets: Iterable[str]
    tag: str


class Runner(Protocol):
    """What code that shells out depends on: ``SubprocessRunner``, or ``testing.FakeRunner`` in tests."""

    def run(self, argv: Sequence[str], **options: Unpack[RunOptions]) -> Result: ...


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every whole occurrence of a secret replaced by ``***``. Whole: not inside a longer
    name (a password ``app`` leaves the service ``app-db`` readable, but not ``PGPASSWORD=app``)."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(s)}(?![\w-])", REDACTED, text)
    return text


def secret_values(env: Mapping[str, Any] | None) -> set[str]:
    """The values of ``env`` whose names say they are secret (``*_PASSWORD``, ``*_TOKEN``, ``*SECRET*``)."""
    return {str(v) for k, v in (env or {}).items() if v not in (None, "") and _SECRET_NAME.search(str(k))}


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
    # The children running now: pid -> (process, tag). Read by ``kill_tagged`` from a signal handler, so it
    # is only ever touched with single dict operations (atomic under the GIL), never under a lock.
    _live: dict[int, tuple[subprocess.Popen[bytes], str]] = field(default_factory=dict, repr=False)
    # Every ``kill_tagged`` request's tags, append-only: a child that was starting while one came in (not yet
    # in ``_live``) checks the requests made since it started, and dies too.
    _kills: list[frozenset[str]] = field(default_factory=list, repr=False)

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
        stderr_path: Path | None = None,
        secrets: Iterable[str] = (),
        tag: str = "",
    ) -> Result:
        """Run ``argv`` to completion (or ``timeout`` seconds: then its whole process group is killed).

        ``stdin``: a file streamed to it; ``input``: text; ``stdout_path``: its stdout goes to this file
        (not into memory); ``stderr_path``: its stderr goes to this file, and the result (or error) carries
        only its last ``FILE_TAIL`` bytes (the same path as ``stdout_path``: both streams into that one file,
        in the order the command wrote them, as ``2>&1`` would); ``check``: a non-zero exit raises
        ``CommandError``; ``secrets``: more values to redact; ``tag``: what the command is (e.g. its compose
        verb), for ``kill_tagged``.
        """
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise ValueError("empty argv")
        if stdin is not None and input is not None:
            raise ValueError("pass stdin or input, not both")
        hidden = self.secrets | set(secrets)
        shown = tuple(redact(a, hidden) for a in argv)
        environ = merged_env(env)
        if shutil.which(argv[0], path=environ.get("PATH")) is None:
            raise ProgramNotFound(argv[0], _INSTALL_HINTS.get(argv[0], ""))
        limit = self.default_timeout if timeout is None else timeout
        merged = stderr_path is not None and stderr_path == stdout_path
        kills_before = len(self._kills)
        start = time.monotonic()
        log.debug("run %s (timeout %gs)", " ".join(shown), limit)
        if stdin is None and input is None and stdout_path is None and stderr_path is None:
            fast = self._engine_answer(argv, shown, limit, environ)
            if fast is not None:
                rc, out, err = fast
                if tag and any(tag in tags for tags in self._kills[kills_before:]):
                    rc, out, err = -signal.SIGKILL, "", ""  # a stop killed it meanwhile, as it would the CLI
                return self._finish(Result(shown, rc, out, err, time.monotonic() - start), check, hidden)
        with (
            _open_or_none(stdin, "rb") as in_f,
            _open_or_none(stdout_path, "wb") as out_f,
            _open_or_none(None if merged else stderr_path, "wb") as err_f,
        ):
            stdin_arg: int | IO[bytes] = subprocess.DEVNULL
            if in_f is not None:
                stdin_arg = in_f
            elif input is not None:
                stdin_arg = subprocess.PIPE
            proc = subprocess.Popen(  # noqa: S603 - the one seam; ruff's S603 flags any other
                argv,
                stdin=stdin_arg,
                stdout=out_f if out_f is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT if merged else err_f if err_f is not None else subprocess.PIPE,
                env=merged_env(env),
                cwd=cwd,
                start_new_session=True,  # our own process group: Ctrl-C reaches us, and we decide
            )
            self._live[proc.pid] = (proc, tag)
            if any(tag in tags for tags in self._kills[kills_before:]):  # asked to die while starting
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            try:
                out_b, err_b = proc.communicate(
                    input=input.encode() if input is not None else None, timeout=limit
                )
            except subprocess.TimeoutExpired:
                partial_out, partial_err = _kill(proc)
                if stderr_path is not None:
                    partial_err = file_tail(stderr_path).encode()
                raise CommandTimeout(
                    shown, limit, redact(_text(partial_out), hidden), redact(_text(partial_err), hidden)
                ) from None
            except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: never orphan a child
                _kill(proc)
                raise
            finally:
                self._live.pop(proc.pid, None)
        seconds = time.monotonic() - start
        err_text = file_tail(stderr_path) if stderr_path is not None else _text(err_b)
        return self._finish(Result(shown, proc.returncode, _text(out_b), err_text, seconds), check, hidden)

    def _engine_answer(
        self, argv: tuple[str, ...], shown: tuple[str, ...], limit: float, env: dict[str, str]
    ) -> tuple[int, str, str] | None:
        """(rc, stdout, stderr) of ``argv`` from the local engine's API (``engineapi``), or None: the CLI runs
        it. A timeout is the CLI's: ``CommandTimeout``."""
        try:
            fast = engineapi.answer(argv, limit, env)
        except engineapi.EngineTimeout:
            raise CommandTimeout(shown, limit) from None
        if fast is None:
            return None
        log.debug("served by the engine API: %s", " ".join(shown))
        return fast.rc, fast.stdout, fast.stderr

    def _finish(self, result: Result, check: bool, hidden: set[str]) -> Result:
        """Log a finished command; raise ``CommandError`` for a failure when ``check``."""
        shown = result.argv
        log.debug("rc=%s in %.2fs: %s", result.rc, result.seconds, " ".join(shown))
        if check and result.rc != 0:
            # the whole story for the debug log; the error a user reads may keep only its cause
            log.debug("failed: %s\nstderr: %s\nstdout: %s", " ".join(shown), *(
                redact(tail(t), hidden) for t in (result.stderr, result.stdout)
            ))  # fmt: skip
            raise CommandError(shown, result.rc, redact(result.stdout, hidden), redact(result.stderr, hidden))
        return result

    def kill_tagged(self, tags: Iterable[str]) -> list[int]:
        """SIGKILL the process group of every running child whose tag is in ``tags``; their pids.

        Safe from a signal handler: no lock, one dict copy. Its ``run`` then sees the child die (a failed
        command, or the group's exit) and returns or raises as usual.
        """
        wanted, killed = frozenset(tags), []
        self._kills.append(wanted)
        for pid, (proc, tag) in list(self._live.items()):
            if tag in wanted and proc.returncode is None:  # not reaped yet: the pid is still this child's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def running(self) -> list[tuple[int, str]]:
        """(pid, tag) of the children running now."""
        return [(pid, tag) for pid, (_, tag) in list(self._live.items())]


def file_tail(path: Path, size: int | None = None) -> str:
    """The last ``size`` (default ``FILE_TAIL``) bytes of ``path`` as text: what a streamed output keeps in
    memory, for a failure's reason."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - (FILE_TAIL if size is None else size)))
        return f.read().decode("utf-8", errors="replace")


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
