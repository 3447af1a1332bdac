"""Test doubles for code that shells out: a runner that answers scripted commands and refuses the rest.

Like invoke's ``MockContext``: a command the test did not script is an error, never silently run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from forgelib.errors import CommandError
from forgelib.runner import Result, RunOptions


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()  # matches any single argv element in an expectation


class UnexpectedCommand(AssertionError):
    """The code under test ran a command the test did not script."""


@dataclass(frozen=True)
class Call:
    argv: tuple[str, ...]
    timeout: float | None
    stdin: Path | None
    input: str | None
    env: Mapping[str, str | None]
    cwd: Path | None
    stdout_path: Path | None
    stderr_path: Path | None = None
    tag: str = ""
    secrets: tuple[str, ...] = ()


@dataclass
class Expectation:
    pattern: tuple[Any, ...]
    exact: bool
    rc: int = 0
    stdout: str = ""
    stderr: str = ""
    raises: BaseException | None = None
    times: int | None = None  # None: any number of times
    side_effect: Callable[[Call], None] | None = None
    used: int = 0

    def matches(self, argv: Sequence[str]) -> bool:
        if self.times is not None and self.used >= self.times:
            return False
        if self.exact and len(argv) != len(self.pattern):
            return False
        if len(argv) < len(self.pattern):
            return False
        return all(p is ANY or p == a for p, a in zip(self.pattern, argv, strict=False))


@dataclass
class FakeRunner:
    """Scripted answers, in registration order; every call is recorded in ``calls``."""

    expectations: list[Expectation] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    def expect(
        self,
        *pattern: Any,
        exact: bool = False,
        rc: int = 0,
        stdout: str = "",
        stderr: str = "",
        raises: BaseException | None = None,
        times: int | None = None,
        side_effect: Callable[[Call], None] | None = None,
    ) -> Expectation:
        """Script an answer for argv starting with ``pattern`` (all of argv when ``exact``)."""
        e = Expectation(tuple(pattern), exact, rc, stdout, stderr, raises, times, side_effect)
        self.expectations.append(e)
        return e

    def run(self, argv: Sequence[str], **options: Unpack[RunOptions]) -> Result:
        argv = tuple(str(a) for a in argv)
        o = options
        call = Call(
            argv, o.get("timeout"), o.get("stdin"), o.get("input"), dict(o.get("env") or {}), o.get("cwd"),
            o.get("stdout_path"), o.get("stderr_path"), o.get("tag", ""), tuple(o.get("secrets", ())),
        )  # fmt: skip
        stdout_path, check = call.stdout_path, o.get("check", True)
        self.calls.append(call)
        for e in self.expectations:
            if e.matches(argv):
                e.used += 1
                if e.side_effect is not None:
                    e.side_effect(call)
                if e.raises is not None:
                    raise e.raises
                if stdout_path is not None and call.stderr_path == stdout_path:  # one file for both (2>&1)
                    stdout_path.write_text(e.stdout + e.stderr)
                elif stdout_path is not None:
                    stdout_path.write_text(e.stdout)
                if call.stderr_path is not None and call.stderr_path != stdout_path:  # keeps its tail
                    call.stderr_path.write_text(e.stderr)
                if check and e.rc != 0:
                    raise CommandError(argv, e.rc, e.stdout, e.stderr)
                return Result(argv, e.rc, e.stdout, e.stderr, 0.0)
        raise UnexpectedCommand(f"unscripted command: {argv!r}")

    def argvs(self) -> list[tuple[str, ...]]:
        return [c.argv for c in self.calls]
