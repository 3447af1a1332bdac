"""Signal-safe teardown for ``forge run`` and ``forge provision``: Ctrl-C and SIGTERM never leave a stack up.

Three pieces, small on purpose:

* ``LiveStacks`` — a thread-safe registry of the stacks that are up (or being brought up) right now, each
  with its teardown callable. Register a stack *before* its first ``compose up`` (an interrupted ``up``
  leaves containers too) and discard it after its teardown.
* ``interruptible(stacks)`` — a context manager for the main thread. Inside it SIGTERM takes the same path
  as SIGINT. The first signal requests a graceful stop (``StopState.requested``; no new stack can be
  registered) and raises ``KeyboardInterrupt`` in the main thread; when that (or any exception) leaves the
  block, every live stack is torn down gracefully, and the block raises ``Interrupted`` (exit 130). A second
  signal raises ``KeyboardInterrupt`` again, which aborts the graceful teardown in flight (the runner kills
  its ``compose down``) and redoes it, and the rest, without waits (``graceful=False``: e.g.
  ``down --timeout 0``). Further signals are ignored with a note: the hurried teardown is already the
  fastest, and SIGKILL leaves labelled leftovers that ``forge reap`` (or the next ``forge run``) removes.
* On each signal, ``kill_launches()`` SIGKILLs this process's in-flight launch commands (a worker blocked
  in ``up --wait`` or a long oracle ``exec`` cannot otherwise be interrupted); teardown commands run on,
  until a second signal, which kills graceful ``down``s too for the hurried sweep to redo without waits.
* ``StopState.guard(runner)`` — a runner that, once a stop is requested, refuses to *launch* anything
  (``compose up/run/exec/cp/start...``) but lets teardown and inspection through (``down``, ``rm``,
  ``logs``, ``ps``, ``inspect``). Worker threads keep running after the main thread is interrupted (signals
  reach only the main thread, and the runner's children run in their own sessions): with the guard, a
  worker's next phase fails with ``Interrupted`` and its own failure path tears its stack down.

How ``forge run`` (``run/execute.py``) uses it::

    stacks = LiveStacks()
    with interruptible(stacks) as stop:        # raises Interrupted(130) after tearing down on a signal
        runner = stop.guard(runner)
        pool = ThreadPoolExecutor(workers)     # not `with`: its exit waits for every running trial
        try:
            for trial in pending:
                if stop.requested:             # stop launching
                    break
                pool.submit(run_trial, ..., runner=runner, stacks=stacks)
            ...                                # wait for futures
        finally:
            pool.shutdown(wait=not stop.requested, cancel_futures=True)

and in the trial / ``provision_trial``: ``stacks.add(name, lambda graceful: down(name, graceful))`` before
the first ``up``; ``stacks.discard(name)`` after ``teardown_trial``. ``forge provision`` wraps its one
``provision_trial`` call the same way (``--keep``: discard the stack once provisioned, so a Ctrl-C after
that does not remove what the user asked to keep). Catch ``Interrupted`` around the block to record the
interruption in the event log, then re-raise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from forgelib.errors import Interrupted
from forgelib.runner import Result, Runner

Teardown = Callable[[bool], object]  # called with graceful=True, or False to skip waits (down -t 0)

# Verbs that start something. After a stop these are refused; everything else (down, rm, kill, stop, logs,
# ps, inspect, port...) passes, so teardown and log capture keep working.
LAUNCH_VERBS = frozenset({"up", "run", "exec", "create", "start", "restart", "cp", "build", "pull"})
# Teardown verbs a second signal kills too: a graceful `down` waits out each container's stop timeout.
HURRY_VERBS = frozenset({"down", "stop"})
# Options of `docker` and `docker compose` that take a value, to find the verb behind them.
_VALUE_OPTIONS = frozenset(
    {"-p", "--project-name", "-f", "--file", "--project-directory", "--env-file", "--profile", "--ansi"}
    | {"--progress", "--parallel", "-H", "--host", "-c", "--context", "--config", "-l", "--log-level"}
)


@dataclass
class TeardownReport:
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> why
    hurried: bool = False  # a second signal switched to graceful=False


class LiveStacks:
    """The stacks that are up now, each with its teardown; safe to use from any thread."""

    def __init__(self) -> None:
        # RLock: teardown_all may be re-entered from a signal handler frame in the same (main) thread
        self._lock = threading.RLock()
        self._stacks: dict[str, Teardown] = {}
        # a plain bool, set from the signal handler without taking a lock (a handler must never block)
        self.closed = False

    def add(self, name: str, teardown: Teardown) -> None:
        """Register a stack before its first ``up``; after a stop request, refuse (nothing new starts)."""
        with self._lock:
            if self.closed:
                raise Interrupted(f"stop requested: not starting stack {name}")
            self._stacks[name] = teardown

    def discard(self, name: str) -> None:
        with self._lock:
            self._stacks.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._stacks)

    def _next(self, skip: set[str]) -> tuple[str, Teardown] | None:
        with self._lock:
            for name in sorted(self._stacks):
                if name not in skip:
                    return name, self._stacks[name]
        return None

    def teardown_all(self, *, graceful: bool = True) -> TeardownReport:
        """Tear down every live stack (and any registered meanwhile), one at a time, in the calling thread.

        A ``KeyboardInterrupt`` during a graceful teardown switches to ``graceful=False`` and redoes that
        stack; one during a hurried teardown abandons that stack (``forge reap`` removes it later). A
        stack stays registered until its teardown returned, so an interrupt can never lose one.
        """
        self.closed = True
        report = TeardownReport(hurried=not graceful)
        done: set[str] = set()
        current: str | None = None
        while True:
            try:
                item = self._next(done)
                if item is None:
                    return report
                current, teardown = item
                try:
                    teardown(graceful)
                except Exception as e:  # noqa: BLE001 - one stack's failure must not leave the others up
                    report.failed[current] = str(e).splitlines()[0] if str(e) else type(e).__name__
                else:
                    report.removed.append(current)
                self.discard(current)
                done.add(current)
            except KeyboardInterrupt:
                if graceful:
                    graceful, report.hurried = False, True  # redo `current` without waits
                elif current is not None:
                    report.failed[current] = "abandoned: interrupted again"
                    done.add(current)


class StopState:
    """Whether a stop was requested; written by the signal handler, read by any thread."""

    def __init__(self) -> None:
        self.signals = 0  # plain int: the handler (main thread) is its only writer
        self.signal_name = ""

    @property
    def requested(self) -> bool:
        return self.signals > 0

    @property
    def hurry(self) -> bool:
        return self.signals > 1

    def request(self, name: str = "SIGINT") -> None:
        self.signals += 1
        self.signal_name = self.signal_name or name

    def check(self) -> None:
        """Raise ``Interrupted`` if a stop was requested (for worker threads, between phases)."""
        if self.requested:
            raise Interrupted(f"stop requested ({self.signal_name})")

    def guard(self, runner: Runner) -> Runner:
        return StopAwareRunner(runner, self)


def command_verb(argv: Sequence[str]) -> str | None:
    """The verb of a ``docker`` / ``docker compose`` command line (``up``, ``exec``, ``rm``...), else None."""
    if not argv or Path(argv[0]).name != "docker":
        return None
    args = list(argv[1:])
    if args[:1] == ["compose"]:
        args = args[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a in _VALUE_OPTIONS:
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a
    return None


@dataclass
class StopAwareRunner:
    """A runner that refuses to launch anything once a stop was requested; teardown still works."""

    inner: Runner
    state: StopState

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
        if self.state.requested and command_verb(argv) in LAUNCH_VERBS:
            raise Interrupted(
                f"stop requested ({self.state.signal_name}): not running `{command_verb(argv)}`"
            )
        return self.inner.run(
            argv,
            timeout=timeout,
            stdin=stdin,
            input=input,
            env=env,
            cwd=cwd,
            check=check,
            stdout_path=stdout_path,
            secrets=secrets,
        )


def kill_launches(verbs: frozenset[str] = LAUNCH_VERBS, proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL every in-flight *launch* command of this process (``compose up``, ``exec``, ``cp``...).

    Signals reach only the main thread; a worker thread blocked in ``up --wait`` on a never-healthy
    service or in a long oracle ``exec`` would otherwise hold the run for its whole timeout. The runner
    starts every child as a session leader (pgid == pid), so its whole group is killed; the worker sees a
    failed command and its own failure path tears the stack down (``down`` is not a launch, so it is never
    killed here, nor refused by the guard). Reads /proc; elsewhere it does nothing.
    """
    me, killed = os.getpid(), list[int]()
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return killed
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:  # exited meanwhile, or not ours to read
            continue
        rest = stat.rpartition(")")[2].split()  # fields 3.. : state, ppid, pgrp
        if len(rest) < 3 or int(rest[1]) != me or int(rest[2]) != int(entry.name):
            continue
        if command_verb(argv) in verbs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def _note(text: str) -> None:
    print(f"forge: {text}", file=sys.stderr, flush=True)


@contextmanager
def interruptible(stacks: LiveStacks) -> Iterator[StopState]:
    """SIGINT/SIGTERM → graceful stop and teardown of ``stacks``, then ``Interrupted`` (see module doc).

    Outside the main thread signal handlers cannot be installed; the block still tears down on any
    exception. On a normal exit nothing is torn down (``forge provision --keep`` leaves its stack up).
    """
    state = StopState()

    def handler(signum: int, frame: FrameType | None) -> None:
        # Only plain assignments here: the handler runs between two bytecodes of the main thread, which
        # may hold any lock at that moment.
        state.request(signal.Signals(signum).name)
        stacks.closed = True
        # In-flight up/exec/cp of worker threads. On the second signal also their graceful `down`s: the
        # stack stays registered, and the hurried sweep redoes it without waits (`down --timeout 0`).
        kill_launches(LAUNCH_VERBS | HURRY_VERBS if state.hurry else LAUNCH_VERBS)
        if state.signals == 1:
            _note(f"{state.signal_name}: stopping; tearing down live stacks (again to skip graceful waits)")
            raise KeyboardInterrupt
        if state.signals == 2:
            _note("skipping graceful waits; still removing what can be removed")
            raise KeyboardInterrupt
        _note(f"still removing {len(stacks.names())} stack(s); SIGKILL leaves them to `forge reap`")

    previous: dict[signal.Signals, Any] = {}  # whatever was installed: a callable, SIG_DFL, SIG_IGN
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        try:
            yield state
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) and not state.requested:
                state.request("SIGINT")  # a KeyboardInterrupt raised without our handler (not main thread)
            report = stacks.teardown_all(graceful=not state.hurry)
            if not isinstance(e, KeyboardInterrupt | Interrupted):
                raise  # a bug or a user error: stacks are down, the original error is what matters
            raise Interrupted(_summary(state, report)) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _summary(state: StopState, report: TeardownReport) -> str:
    parts = [f"interrupted by {state.signal_name or 'SIGINT'}"]
    if report.removed:
        parts.append(f"tore down {len(report.removed)} live stack(s): {', '.join(report.removed)}")
    if report.failed:
        failed = "; ".join(f"{n}: {why}" for n, why in sorted(report.failed.items()))
        parts.append(f"could not tear down {failed} — run `forge reap` once this process has exited")
    return "; ".join(parts)


__all__ = [
    "LiveStacks",
    "StopAwareRunner",
    "StopState",
    "TeardownReport",
    "command_verb",
    "interruptible",
    "kill_launches",
]
